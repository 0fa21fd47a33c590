package credit_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

type testBundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	keys  keyspace.Keys
	store *credit.Store
	org   string // an org of the test's own
	team  string // a team of org
}

func setup(t *testing.T, rdb redis.UniversalClient) *testBundle {
	t.Helper()
	pool := testenv.Postgres(t)
	b := &testBundle{ctx: testenv.Context(t, 2*time.Minute), pool: pool, rdb: rdb,
		keys: keyspace.Keys{Prefix: testenv.Prefix(t) + "mg", Shards: 16}}
	b.store = credit.NewStore(pool, rdb, b.keys, nil)
	name := testenv.Name(t)
	b.org, b.team = name+"-org", name+"-team"
	accounts := policy.NewStore(pool)
	_, err := accounts.CreateAccount(b.ctx, policy.Account{ID: b.org, Kind: policy.Org, Plan: "pro"})
	require.NoError(t, err)
	_, err = accounts.CreateAccount(b.ctx, policy.Account{ID: b.team, Kind: policy.Team, Parent: b.org})
	require.NoError(t, err)
	return b
}

func (b *testBundle) remaining(t *testing.T, account string, unit policy.Unit, id string) (string, bool) {
	t.Helper()
	v, err := b.rdb.HGet(b.ctx, b.keys.Grants(b.org, account, unit), id).Result()
	if errors.Is(err, redis.Nil) {
		return "", false
	}
	require.NoError(t, err)
	return v, true
}

func (b *testBundle) terms(t *testing.T, account string, unit policy.Unit, id string) string {
	t.Helper()
	return b.rdb.HGet(b.ctx, b.keys.GrantTerms(b.org, account, unit), id).Val()
}

func (b *testBundle) rows(t *testing.T, account string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM credit_grants WHERE account = $1`, account).Scan(&n))
	return n
}

func ptr[T any](v T) *T { return &v }

// A grant is recorded in PostgreSQL with the account's org and mirrored into Redis: its
// whole amount remains, and its terms are "<priority>|<effective ms>|<expires ms>".
func TestGrantMirrors(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		eff := time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC()
		exp := eff.Add(30 * 24 * time.Hour)
		g, created, err := b.store.Grant(b.ctx, credit.GrantRequest{Account: b.team, Unit: policy.Credits, Amount: 1000,
			EffectiveAt: &eff, ExpiresAt: &exp, Priority: 7, Source: credit.Purchase, IdempotencyKey: "order-1"})
		require.NoError(t, err)
		require.True(t, created)
		require.True(t, event.ValidGrantID(g.ID), g.ID)
		require.Equal(t, b.org, g.Org)
		require.Equal(t, b.team, g.Account)
		require.True(t, eff.Equal(g.EffectiveAt))
		require.True(t, exp.Equal(*g.ExpiresAt))

		var org, unit, source string
		var amount int64
		var priority int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT org, unit, amount, priority, source FROM credit_grants WHERE id = $1`, g.ID).
			Scan(&org, &unit, &amount, &priority, &source))
		require.Equal(t, []any{b.org, "credits", int64(1000), 7, "purchase"}, []any{org, unit, amount, priority, source})

		v, ok := b.remaining(t, b.team, policy.Credits, g.ID)
		require.True(t, ok)
		require.Equal(t, "1000", v)
		require.Equal(t, "7|"+strconv.FormatInt(eff.UnixMilli(), 10)+"|"+strconv.FormatInt(exp.UnixMilli(), 10),
			b.terms(t, b.team, policy.Credits, g.ID))

		// No expiry is 0; no effect is now (by the store's clock).
		now := time.Now()
		g2, _, err := b.store.Grant(b.ctx, credit.GrantRequest{Account: b.team, Unit: policy.Tokens, Amount: 5, Source: credit.Plan})
		require.NoError(t, err)
		require.Nil(t, g2.ExpiresAt)
		require.WithinDuration(t, now, g2.EffectiveAt, 5*time.Second)
		require.Equal(t, "0|"+strconv.FormatInt(g2.EffectiveAt.UnixMilli(), 10)+"|0", b.terms(t, b.team, policy.Tokens, g2.ID))
	})
}

// A retried grant (the same account and idempotency key) is the same grant: one row, and
// Redis keeps what remains of it, also after draws; a retry whose first try lost its Redis
// write mirrors it; a retry asking for other terms is refused.
func TestGrantRetry(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		exp := time.Now().Add(time.Hour)
		req := credit.GrantRequest{Account: b.org, Unit: policy.Requests, Amount: 100, ExpiresAt: &exp, Priority: 3,
			Source: credit.Promotional, IdempotencyKey: "promo-2026"}
		first, created, err := b.store.Grant(b.ctx, req)
		require.NoError(t, err)
		require.True(t, created)

		// Admission drew 40.
		require.NoError(t, b.rdb.HIncrBy(b.ctx, b.keys.Grants(b.org, b.org, policy.Requests), first.ID, -40).Err())
		again, created, err := b.store.Grant(b.ctx, req) // no effective_at: matches the first whatever its effect
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, first, again)
		require.Equal(t, 1, b.rows(t, b.org))
		v, _ := b.remaining(t, b.org, policy.Requests, first.ID)
		require.Equal(t, "60", v, "a retry never grants the amount again")

		// The first try's Redis write was lost: the retry mirrors the grant, once.
		require.NoError(t, b.rdb.HDel(b.ctx, b.keys.Grants(b.org, b.org, policy.Requests), first.ID).Err())
		require.NoError(t, b.rdb.HDel(b.ctx, b.keys.GrantTerms(b.org, b.org, policy.Requests), first.ID).Err())
		for range 2 {
			again, created, err = b.store.Grant(b.ctx, req)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, first.ID, again.ID)
		}
		v, _ = b.remaining(t, b.org, policy.Requests, first.ID)
		require.Equal(t, "100", v)
		require.NotEmpty(t, b.terms(t, b.org, policy.Requests, first.ID))
		require.Equal(t, 1, b.rows(t, b.org))

		// The same key with other terms.
		for name, change := range map[string]func(r *credit.GrantRequest){
			"amount":    func(r *credit.GrantRequest) { r.Amount = 101 },
			"unit":      func(r *credit.GrantRequest) { r.Unit = policy.Tokens },
			"priority":  func(r *credit.GrantRequest) { r.Priority = 4 },
			"source":    func(r *credit.GrantRequest) { r.Source = credit.Purchase },
			"no expiry": func(r *credit.GrantRequest) { r.ExpiresAt = nil },
			"effect":    func(r *credit.GrantRequest) { r.EffectiveAt = ptr(first.EffectiveAt.Add(time.Second)) },
		} {
			r := req
			change(&r)
			_, _, err := b.store.Grant(b.ctx, r)
			require.ErrorIs(t, err, credit.ErrIdempotencyKeyReused, name)
		}
		// The same effect, given explicitly, is the same grant.
		r := req
		r.EffectiveAt = &first.EffectiveAt
		_, created, err = b.store.Grant(b.ctx, r)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, 1, b.rows(t, b.org))

		// The key is per account: another account's grant with it is a new grant.
		r = req
		r.Account = b.team
		other, created, err := b.store.Grant(b.ctx, r)
		require.NoError(t, err)
		require.True(t, created)
		require.NotEqual(t, first.ID, other.ID)
	})
}

// Bad input and unknown accounts write nothing.
func TestGrantRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t, testenv.Redis(t))
	now := time.Now()
	ok := credit.GrantRequest{Account: b.org, Unit: policy.Credits, Amount: 10, Source: credit.Purchase}
	for _, tc := range []struct {
		field  string
		change func(r *credit.GrantRequest)
	}{
		{"unit", func(r *credit.GrantRequest) { r.Unit = "gold" }},
		{"unit", func(r *credit.GrantRequest) { r.Unit = "" }},
		{"amount", func(r *credit.GrantRequest) { r.Amount = 0 }},
		{"amount", func(r *credit.GrantRequest) { r.Amount = -5 }},
		{"amount", func(r *credit.GrantRequest) { r.Amount = credit.MaxAmount + 1 }},
		{"expiry", func(r *credit.GrantRequest) {
			r.EffectiveAt, r.ExpiresAt = ptr(now.Add(time.Hour)), ptr(now.Add(time.Minute))
		}},
		{"expiry", func(r *credit.GrantRequest) {
			r.EffectiveAt, r.ExpiresAt = ptr(now.Add(time.Hour)), ptr(now.Add(time.Hour))
		}},
		{"expiry", func(r *credit.GrantRequest) {
			r.EffectiveAt, r.ExpiresAt = ptr(now.Add(-2*time.Hour)), ptr(now.Add(-time.Hour))
		}},
		{"priority", func(r *credit.GrantRequest) { r.Priority = -1 }},
		{"priority", func(r *credit.GrantRequest) { r.Priority = 101 }},
		{"source", func(r *credit.GrantRequest) { r.Source = "" }},
		{"source", func(r *credit.GrantRequest) { r.Source = "gift" }},
		{"idempotency_key", func(r *credit.GrantRequest) { r.IdempotencyKey = "has space" }},
		{"idempotency_key", func(r *credit.GrantRequest) { r.IdempotencyKey = string(make([]byte, 256)) }},
	} {
		r := ok
		tc.change(&r)
		_, _, err := b.store.Grant(b.ctx, r)
		var inv *credit.InvalidError
		require.ErrorAs(t, err, &inv, "%+v", r)
		require.Equal(t, tc.field, inv.Field, "%+v", r)
	}
	for _, account := range []string{"nobody-" + testenv.Name(t), "", "bad id"} {
		r := ok
		r.Account = account
		_, _, err := b.store.Grant(b.ctx, r)
		require.ErrorIs(t, err, credit.ErrUnknownAccount)
		r.IdempotencyKey = "k"
		_, _, err = b.store.Grant(b.ctx, r)
		require.ErrorIs(t, err, credit.ErrUnknownAccount)
	}
	require.Equal(t, 0, b.rows(t, b.org))
	n, err := b.rdb.HLen(b.ctx, b.keys.Grants(b.org, b.org, policy.Credits)).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}

// A void takes what remains of the grant out of Redis and records it; a retried void,
// also one whose first try never reached PostgreSQL, takes nothing more and answers the
// same; a voided grant is never mirrored again.
func TestVoid(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		req := credit.GrantRequest{Account: b.team, Unit: policy.Tokens, Amount: 100, Source: credit.Purchase, IdempotencyKey: "k1"}
		g, _, err := b.store.Grant(b.ctx, req)
		require.NoError(t, err)
		require.NoError(t, b.rdb.HIncrBy(b.ctx, b.keys.Grants(b.org, b.team, policy.Tokens), g.ID, -30).Err())

		v, err := b.store.Void(b.ctx, b.team, g.ID)
		require.NoError(t, err)
		require.NotNil(t, v.VoidedAt)
		require.Equal(t, int64(70), *v.VoidedUnits)
		_, ok := b.remaining(t, b.team, policy.Tokens, g.ID)
		require.False(t, ok)
		require.Empty(t, b.terms(t, b.team, policy.Tokens, g.ID))

		again, err := b.store.Void(b.ctx, b.team, g.ID)
		require.NoError(t, err)
		require.Equal(t, v, again)

		// A retried grant of a voided grant answers it as recorded and does not bring it back.
		rg, created, err := b.store.Grant(b.ctx, req)
		require.NoError(t, err)
		require.False(t, created)
		require.Equal(t, v, rg)
		_, ok = b.remaining(t, b.team, policy.Tokens, g.ID)
		require.False(t, ok)
		// Nor does a restore (Mirror) of the grant as it was before the void: the marker.
		require.NoError(t, b.store.Mirror(b.ctx, g))
		_, ok = b.remaining(t, b.team, policy.Tokens, g.ID)
		require.False(t, ok)

		// Unknown grants, and another account's, are not found.
		for _, tc := range [][2]string{{b.org, g.ID}, {b.team, "gr_00000000000000000000000000000000"}, {b.team, "nope"}, {"no such", g.ID}} {
			_, err := b.store.Void(b.ctx, tc[0], tc[1])
			require.ErrorIs(t, err, credit.ErrNotFound, "%v", tc)
		}

		// The first try took the units from Redis and crashed before recording them.
		g2, _, err := b.store.Grant(b.ctx, credit.GrantRequest{Account: b.team, Unit: policy.Tokens, Amount: 50, Source: credit.Plan})
		require.NoError(t, err)
		keys := []string{b.keys.Grants(b.org, b.team, policy.Tokens), b.keys.GrantTerms(b.org, b.team, policy.Tokens), b.store.VoidMarker(g2)}
		require.NoError(t, lua.GrantVoid.Run(b.ctx, b.rdb, keys, g2.ID, time.Hour.Milliseconds()).Err())
		v2, err := b.store.Void(b.ctx, b.team, g2.ID)
		require.NoError(t, err)
		require.Equal(t, int64(50), *v2.VoidedUnits, "the retry records what the first try took")
	})
}

// The balance counts the grants admission would draw by Redis TIME: not those not yet
// effective, expired or voided, whatever the store's clock says.
func TestBalance(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, rdb)
		now := time.Now()
		grant := func(amount int64, eff, exp *time.Time, priority int) credit.Grant {
			g, _, err := b.store.Grant(b.ctx, credit.GrantRequest{Account: b.org, Unit: policy.Credits, Amount: amount,
				EffectiveAt: eff, ExpiresAt: exp, Priority: priority, Source: credit.Purchase})
			require.NoError(t, err)
			return g
		}
		soon := grant(100, nil, ptr(now.Add(time.Hour)), 0)     // drawable, expires first
		later := grant(10, ptr(now.Add(time.Hour)), nil, 0)     // not yet effective
		never := grant(1000, ptr(now.Add(-time.Hour)), nil, 10) // drawable, no expiry
		voided := grant(5, nil, ptr(now.Add(2*time.Hour)), 50)  // voided
		small := grant(1, nil, nil, 0)                          // drawable, no expiry
		_, err := b.store.Void(b.ctx, b.org, voided.ID)
		require.NoError(t, err)
		// An expired grant, as a restore would mirror one.
		var expired credit.Grant
		expired.ID = "gr_" + testenv.Random(16)
		require.NoError(t, b.pool.QueryRow(b.ctx, `
			INSERT INTO credit_grants (id, org, account, unit, amount, effective_at, expires_at, priority, source)
			VALUES ($1, $2, $2, 'credits', 7, now() - interval '2 hours', now() - interval '1 hour', 99, 'promotional')
			RETURNING org, account, unit, amount, effective_at, expires_at, priority, source`, expired.ID, b.org).
			Scan(&expired.Org, &expired.Account, &expired.Unit, &expired.Amount, &expired.EffectiveAt, &expired.ExpiresAt, &expired.Priority, &expired.Source))
		require.NoError(t, b.store.Mirror(b.ctx, expired))
		// Admission drew 20 from soon.
		require.NoError(t, b.rdb.HIncrBy(b.ctx, b.keys.Grants(b.org, b.org, policy.Credits), soon.ID, -20).Err())

		// A store whose clock is two hours ahead would see later effective and soon expired.
		skewed := credit.NewStore(b.pool, b.rdb, b.keys, period.Fixed(now.Add(2*time.Hour)))
		bal, err := skewed.Balance(b.ctx, b.org)
		require.NoError(t, err)
		require.Equal(t, b.org, bal.Org)
		require.WithinDuration(t, now, bal.At, time.Minute)
		u := bal.Units[policy.Credits]
		require.Equal(t, int64(80+1000+1), u.Balance)
		require.NotNil(t, u.NextExpiry)
		require.True(t, soon.ExpiresAt.Equal(*u.NextExpiry))

		byID := map[string]credit.GrantBalance{}
		var order []string
		for _, g := range u.Grants {
			byID[g.ID] = g
			order = append(order, g.ID)
		}
		require.Len(t, order, 6)
		require.Equal(t, []string{expired.ID, voided.ID, never.ID}, order[:3], "priority first")
		require.Equal(t, soon.ID, order[3], "then the earliest expiry, never last")
		for id, want := range map[string]struct {
			remaining int64
			drawable  bool
		}{soon.ID: {80, true}, later.ID: {10, false}, never.ID: {1000, true}, voided.ID: {0, false}, expired.ID: {7, false}, small.ID: {1, true}} {
			require.Equal(t, want.remaining, byID[id].Remaining, id)
			require.Equal(t, want.drawable, byID[id].Drawable, id)
		}
		// The ledger beside it: no consumption metered yet; the void and the expiry.
		require.Equal(t, int64(5), byID[voided.ID].Ledger.Voided)
		require.Equal(t, int64(7), byID[expired.ID].Ledger.Expired)
		require.Equal(t, credit.Ledger{Amount: 1123, Voided: 5, Expired: 7, Remaining: 1111}, u.Ledger)

		// An account without grants has no units; an unknown one is refused.
		bal, err = b.store.Balance(b.ctx, b.team)
		require.NoError(t, err)
		require.Empty(t, bal.Units)
		_, err = b.store.Balance(b.ctx, "nobody-"+testenv.Name(t))
		require.ErrorIs(t, err, credit.ErrUnknownAccount)
	})
}
