package credit

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

// VoidMarkerTTL is how long Redis remembers a void (lua/grant_void.lua): a retried void
// within it answers the same units, and a retried grant within it is not mirrored again.
// Later, PostgreSQL's voided_at says the same.
const VoidMarkerTTL = 35 * 24 * time.Hour

// Store writes grants to PostgreSQL and mirrors them into Redis.
type Store struct {
	pool  *pgxpool.Pool
	rdb   redis.UniversalClient
	keys  keyspace.Keys
	clock period.Clock
}

// NewStore returns a store over pool (migrated) and rdb, with the Redis key layout of keys
// (admission.Admitter.Keys). clock gives the default effect of a grant (nil: the system
// clock); what is drawable is always judged by Redis TIME, as admission judges it.
func NewStore(pool *pgxpool.Pool, rdb redis.UniversalClient, keys keyspace.Keys, clock period.Clock) *Store {
	return &Store{pool: pool, rdb: rdb, keys: keys, clock: clock}
}

// voidMarker is the key that remembers the void of grant id, beside the grant's hashes (one
// Redis Cluster slot).
func (s *Store) voidMarker(g Grant) string {
	return s.keys.GrantVoided(g.Org, g.Account, g.Unit, g.ID)
}

func scanGrant(row pgx.Row) (Grant, error) {
	var g Grant
	var unit string
	err := row.Scan(&g.ID, &g.Org, &g.Account, &unit, &g.Amount, &g.EffectiveAt, &g.ExpiresAt, &g.Priority, &g.Source,
		&g.IdempotencyKey, &g.CreatedAt, &g.VoidedAt, &g.VoidedUnits)
	g.Unit = policy.Unit(unit)
	g.EffectiveAt = g.EffectiveAt.UTC()
	g.CreatedAt = g.CreatedAt.UTC()
	for _, t := range []*time.Time{g.ExpiresAt, g.VoidedAt} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return g, err
}

// The statements of Grant.
var (
	//go:embed sql/insert_grant.sql
	insertGrantSQL string
	//go:embed sql/read_grant_by_key.sql
	readGrantByKeySQL string
)

// Grant records a grant and mirrors it into Redis. created is false when the request's
// idempotency key made the grant before (a retry): the grant is then returned as recorded,
// mirrored again if Redis does not hold it (never added twice), and ErrIdempotencyKeyReused
// if the request asks for other terms. An *InvalidError for bad input, ErrUnknownAccount
// for an account that does not exist; nothing is written then.
//
// PostgreSQL is written first. If the Redis write fails after the commit, the error is
// returned and the grant is not drawable yet: a retry with the same idempotency key
// mirrors it, and so does reconcile's restore from the ledger.
func (s *Store) Grant(ctx context.Context, r GrantRequest) (g Grant, created bool, err error) {
	asked, err := r.validate(s.clock.Now())
	if err != nil {
		return Grant{}, false, err
	}
	if !policy.ValidID(r.Account) {
		return Grant{}, false, fmt.Errorf("account %q: %w", r.Account, ErrUnknownAccount)
	}
	var key *string
	if r.IdempotencyKey != "" {
		key = &r.IdempotencyKey
	}
	g, err = scanGrant(s.pool.QueryRow(ctx, insertGrantSQL, pgx.StrictNamedArgs{
		"id": newGrantID(), "account": r.Account, "unit": string(asked.Unit), "amount": asked.Amount,
		"effective_at": asked.EffectiveAt, "expires_at": asked.ExpiresAt, "priority": asked.Priority,
		"source": asked.Source, "idempotency_key": key,
	}))
	created = err == nil
	if errors.Is(err, pgx.ErrNoRows) && key != nil {
		// The key made a grant before (or the account does not exist).
		g, err = scanGrant(s.pool.QueryRow(ctx, readGrantByKeySQL,
			pgx.StrictNamedArgs{"account": r.Account, "idempotency_key": r.IdempotencyKey}))
		if err == nil && !r.sameTerms(asked, g) {
			return Grant{}, false, fmt.Errorf("grant %s of idempotency key %q: %w", g.ID, r.IdempotencyKey, ErrIdempotencyKeyReused)
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return Grant{}, false, fmt.Errorf("account %q: %w", r.Account, ErrUnknownAccount)
	}
	if err != nil {
		return Grant{}, false, fmt.Errorf("insert credit grant: %w", err)
	}
	if err := s.Mirror(ctx, g); err != nil {
		return Grant{}, false, err
	}
	return g, created, nil
}

// Mirror writes grant g into Redis, its whole amount as what remains of it, unless Redis
// holds the grant already (it is then left as it is) or it was voided within VoidMarkerTTL.
// A grant voided in PostgreSQL is not mirrored. Reconcile calls it to restore grants a
// Redis wipe lost.
func (s *Store) Mirror(ctx context.Context, g Grant) error {
	if g.VoidedAt != nil {
		return nil
	}
	keys := []string{s.keys.Grants(g.Org, g.Account, g.Unit), s.keys.GrantTerms(g.Org, g.Account, g.Unit), s.voidMarker(g)}
	if err := lua.GrantMirror.Run(ctx, s.rdb, keys, g.ID, g.Amount, g.terms()).Err(); err != nil {
		return fmt.Errorf("mirror credit grant %s: %w", g.ID, err)
	}
	return nil
}

// Void takes what remains of account's grant id out of the balance at once and records
// it as the grant's voided_units. A grant voided before is returned as recorded then.
// ErrNotFound if account has no such grant.
//
// Redis is written first: the units taken are what admission could still have drawn. If
// recording them fails, a retry gets the same units from the void's marker.
func (s *Store) Void(ctx context.Context, account, id string) (Grant, error) {
	if !policy.ValidID(account) || !event.ValidGrantID(id) {
		return Grant{}, fmt.Errorf("grant %q of %q: %w", id, account, ErrNotFound)
	}
	g, err := s.get(ctx, account, id)
	if err != nil || g.VoidedAt != nil {
		return g, err
	}
	keys := []string{s.keys.Grants(g.Org, g.Account, g.Unit), s.keys.GrantTerms(g.Org, g.Account, g.Unit), s.voidMarker(g)}
	res, err := lua.GrantVoid.Run(ctx, s.rdb, keys, g.ID, VoidMarkerTTL.Milliseconds()).Int64Slice()
	if err != nil {
		return Grant{}, fmt.Errorf("void credit grant %s in redis: %w", g.ID, err)
	}
	if len(res) != 2 {
		return Grant{}, fmt.Errorf("void credit grant %s in redis: the reply has %d values, want 2", g.ID, len(res))
	}
	units := res[1]
	_, err = s.pool.Exec(ctx, `update credit_grants set voided_at = now(), voided_units = @units where id = @id and voided_at is null`,
		pgx.StrictNamedArgs{"id": g.ID, "units": units})
	if err != nil {
		return Grant{}, fmt.Errorf("record void of credit grant %s: %w", g.ID, err)
	}
	// Read back: a concurrent void may have recorded it first (with the same units).
	return s.get(ctx, account, id)
}

//go:embed sql/read_grant.sql
var readGrantSQL string

func (s *Store) get(ctx context.Context, account, id string) (Grant, error) {
	g, err := scanGrant(s.pool.QueryRow(ctx, readGrantSQL, pgx.StrictNamedArgs{"id": id, "account": account}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Grant{}, fmt.Errorf("grant %q of %q: %w", id, account, ErrNotFound)
	}
	if err != nil {
		return Grant{}, fmt.Errorf("read credit grant %s: %w", id, err)
	}
	return g, nil
}

// Ledger is a grant's (or a unit's) books in PostgreSQL (the view finance_credit_grants):
// Amount - Consumed + Refunded - Voided - Expired = Remaining. Consumption reaches it when
// the meter writes the request's event, so it may lag Redis by seconds.
type Ledger struct {
	Amount    int64 `json:"amount"`
	Consumed  int64 `json:"consumed"`
	Refunded  int64 `json:"refunded"`
	Voided    int64 `json:"voided"`
	Expired   int64 `json:"expired"`
	Remaining int64 `json:"remaining"`
}

func (l *Ledger) add(o Ledger) {
	l.Amount += o.Amount
	l.Consumed += o.Consumed
	l.Refunded += o.Refunded
	l.Voided += o.Voided
	l.Expired += o.Expired
	l.Remaining += o.Remaining
}

// GrantBalance is one grant in a Balance.
type GrantBalance struct {
	Grant
	// Remaining is what Redis holds of the grant (0 when it holds nothing).
	Remaining int64 `json:"remaining"`
	// Drawable: admission would draw from the grant now (effective, not expired, not
	// voided, units remaining).
	Drawable bool   `json:"drawable"`
	Ledger   Ledger `json:"ledger"`
}

// UnitBalance is an account's balance of one unit.
type UnitBalance struct {
	// Balance is the sum of what remains of the drawable grants: what admission may draw.
	Balance int64 `json:"balance"`
	// NextExpiry is the earliest expiry of a drawable grant; nil when none expires.
	NextExpiry *time.Time `json:"next_expiry,omitempty"`
	// Ledger sums the grants' ledgers.
	Ledger Ledger `json:"ledger"`
	// Grants in the order admission draws them: priority (higher first), then earliest
	// expiry (never last), then id.
	Grants []GrantBalance `json:"grants"`
}

// Balance is an account's credit balances, per unit it has grants of.
type Balance struct {
	Account string `json:"account"`
	Org     string `json:"org"`
	// At is the Redis time the balances were read at, the clock admission decides by.
	At    time.Time                   `json:"at"`
	Units map[policy.Unit]UnitBalance `json:"units"`
}

// Balance returns account's balances: what Redis holds of each grant, judged drawable by
// Redis TIME as admission judges it, beside the ledger of PostgreSQL. ErrUnknownAccount if
// the account does not exist.
func (s *Store) Balance(ctx context.Context, account string) (Balance, error) {
	b := Balance{Account: account, Units: map[policy.Unit]UnitBalance{}}
	if !policy.ValidID(account) {
		return b, fmt.Errorf("account %q: %w", account, ErrUnknownAccount)
	}
	err := s.pool.QueryRow(ctx, `select org from accounts where id = @id`, pgx.StrictNamedArgs{"id": account}).Scan(&b.Org)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, fmt.Errorf("account %q: %w", account, ErrUnknownAccount)
	}
	if err != nil {
		return b, fmt.Errorf("read account %q: %w", account, err)
	}
	grants, err := s.ledger(ctx, account)
	if err != nil {
		return b, err
	}

	keys := make([]string, 0, 2*len(policy.Units))
	for _, u := range policy.Units {
		keys = append(keys, s.keys.Grants(b.Org, account, u), s.keys.GrantTerms(b.Org, account, u))
	}
	res, err := lua.GrantBalance.Run(ctx, s.rdb, keys).Slice()
	if err != nil {
		return b, fmt.Errorf("read credit balances of %q: %w", account, err)
	}
	now, remaining, termsOf, err := parseBalanceReply(res, policy.Units)
	if err != nil {
		return b, fmt.Errorf("read credit balances of %q: %w", account, err)
	}
	b.At = time.UnixMicro(now).UTC()
	nowMS := now / 1000

	for _, gb := range grants {
		u := b.Units[gb.Unit]
		if v, ok := remaining[gb.Unit][gb.ID]; ok {
			gb.Remaining = v
		}
		if t, ok := termsOf[gb.Unit][gb.ID]; ok && gb.VoidedAt == nil {
			gb.Drawable = gb.Remaining > 0 && t.drawable(nowMS)
		}
		if gb.Drawable {
			u.Balance += gb.Remaining
			if gb.ExpiresAt != nil && (u.NextExpiry == nil || gb.ExpiresAt.Before(*u.NextExpiry)) {
				u.NextExpiry = gb.ExpiresAt
			}
		}
		u.Ledger.add(gb.Ledger)
		u.Grants = append(u.Grants, gb)
		b.Units[gb.Unit] = u
	}
	for _, u := range b.Units {
		sort.SliceStable(u.Grants, func(i, j int) bool { return drawnBefore(u.Grants[i].Grant, u.Grants[j].Grant) })
	}
	return b, nil
}

// drawnBefore orders grants as admission draws them: priority (higher first), then earliest
// expiry (never last), then id.
func drawnBefore(a, b Grant) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	switch {
	case a.ExpiresAt == nil && b.ExpiresAt != nil:
		return false
	case a.ExpiresAt != nil && b.ExpiresAt == nil:
		return true
	case a.ExpiresAt != nil && !a.ExpiresAt.Equal(*b.ExpiresAt):
		return a.ExpiresAt.Before(*b.ExpiresAt)
	}
	return a.ID < b.ID
}

//go:embed sql/read_grant_ledgers.sql
var readGrantLedgersSQL string

// ledger reads account's grants with their ledger.
func (s *Store) ledger(ctx context.Context, account string) ([]GrantBalance, error) {
	rows, err := s.pool.Query(ctx, readGrantLedgersSQL, pgx.StrictNamedArgs{"account": account})
	if err != nil {
		return nil, fmt.Errorf("read credit grants of %q: %w", account, err)
	}
	var out []GrantBalance
	for rows.Next() {
		var gb GrantBalance
		var unit string
		l := &gb.Ledger
		if err := rows.Scan(&gb.ID, &gb.Org, &gb.Account, &unit, &gb.Amount, &gb.EffectiveAt, &gb.ExpiresAt, &gb.Priority,
			&gb.Source, &gb.IdempotencyKey, &gb.CreatedAt, &gb.VoidedAt, &gb.VoidedUnits,
			&l.Consumed, &l.Refunded, &l.Voided, &l.Expired, &l.Remaining); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read credit grants of %q: %w", account, err)
		}
		gb.Unit = policy.Unit(unit)
		l.Amount = gb.Amount
		gb.EffectiveAt = gb.EffectiveAt.UTC()
		gb.CreatedAt = gb.CreatedAt.UTC()
		for _, t := range []*time.Time{gb.ExpiresAt, gb.VoidedAt} {
			if t != nil {
				*t = t.UTC()
			}
		}
		out = append(out, gb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read credit grants of %q: %w", account, err)
	}
	return out, nil
}

// parseBalanceReply reads lua/grant_balance.lua's reply for units: Redis TIME in µs, and
// per unit each grant's remaining units and terms.
func parseBalanceReply(res []any, units []policy.Unit) (nowMicros int64, remaining map[policy.Unit]map[string]int64,
	termsOf map[policy.Unit]map[string]terms, err error) {
	if len(res) != 2+2*len(units) {
		return 0, nil, nil, fmt.Errorf("balance reply has %d values, want %d", len(res), 2+2*len(units))
	}
	sec, err1 := toInt(res[0])
	usec, err2 := toInt(res[1])
	if err := errors.Join(err1, err2); err != nil {
		return 0, nil, nil, fmt.Errorf("redis time: %w", err)
	}
	remaining = map[policy.Unit]map[string]int64{}
	termsOf = map[policy.Unit]map[string]terms{}
	for i, u := range units {
		remaining[u], termsOf[u] = map[string]int64{}, map[string]terms{}
		rem, _ := res[2+2*i].([]any)
		for j := 0; j+1 < len(rem); j += 2 {
			id, _ := rem[j].(string)
			v, err := toInt(rem[j+1])
			if err != nil {
				return 0, nil, nil, fmt.Errorf("remaining of grant %s: %w", id, err)
			}
			remaining[u][id] = v
		}
		ts, _ := res[3+2*i].([]any)
		for j := 0; j+1 < len(ts); j += 2 {
			id, _ := ts[j].(string)
			s, _ := ts[j+1].(string)
			if t, ok := parseTerms(s); ok {
				termsOf[u][id] = t
			}
		}
	}
	return sec*1_000_000 + usec, remaining, termsOf, nil
}

func toInt(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("not an integer: %v", v)
}
