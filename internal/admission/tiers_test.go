package admission_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// secondNode is another admit node on the same Redis: its own Admitter and connections.
func (b *testBundle) secondNode(t *testing.T) *admission.Admitter {
	adm, _ := b.secondNodeMetrics(t)
	return adm
}

// secondNodeMetrics is secondNode with its metrics' registry.
func (b *testBundle) secondNodeMetrics(t *testing.T) (*admission.Admitter, *prometheus.Registry) {
	t.Helper()
	var rdb redis.UniversalClient
	switch c := b.rdb.(type) {
	case *redis.Client:
		rdb = redis.NewClient(c.Options())
	case *redis.ClusterClient:
		rdb = redis.NewClusterClient(c.Options())
	default:
		t.Fatalf("unknown client %T", b.rdb)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	adm := admission.New(rdb, admission.Options{KeyPrefix: b.keys.Prefix, Registerer: reg})
	t.Cleanup(adm.Close)
	return adm, reg
}

// slow is a token bucket that refills a unit an hour per hour of burst: within a test it
// is a count.
func slow(burst int64) policy.Limit { return bucket(float64(burst)/3600, burst) }

func guaranteed(burst, ceiling int64) policy.Limit {
	l := slow(burst)
	l.Ceiling = ceiling
	return l
}

// reserve is what the policy cache puts in a parent's Level.Reserved for its children's
// guarantees (internal/policy).
func reserve(limits ...policy.Limit) map[policy.Unit]policy.Reservation {
	var r policy.Reservation
	for _, l := range limits {
		r.RatePerS += l.RatePerS
		r.Burst += l.Burst
	}
	return map[policy.Unit]policy.Reservation{policy.Tokens: r}
}

func tokens(l policy.Limit) map[policy.Unit]policy.Limit {
	return map[policy.Unit]policy.Limit{policy.Tokens: l}
}

// fill sends requests of n tokens for pol from adm until one is refused, and returns the
// tokens admitted and the refusal.
func fill(t *testing.T, adm *admission.Admitter, pol policy.Resolved, n int64) (int64, admission.Decision) {
	t.Helper()
	got, d, err := tryFill(testenv.Context(t, 30*time.Second), adm, pol, n)
	require.NoError(t, err)
	return got, d
}

// tryFill is fill for other goroutines than the test's: it returns its error.
func tryFill(ctx context.Context, adm *admission.Admitter, pol policy.Resolved, n int64) (int64, admission.Decision, error) {
	var got int64
	for range 1000 {
		d, err := adm.Decide(ctx, admission.Request{
			EventID: adm.NewEventID(pol.Org), Units: map[policy.Unit]int64{policy.Tokens: n}, Policy: pol, Source: "test"})
		if err != nil {
			return got, d, err
		}
		if d.Result != admission.Allow {
			return got, d, nil
		}
		got += n
	}
	return got, admission.Decision{}, errors.New("never refused")
}

// borrowed sums the borrowing the outbox's compact entries record, by "<account>:<unit>".
func (b *testBundle) borrowed(t *testing.T) map[string]int64 {
	t.Helper()
	entries, err := b.rdb.XRange(testenv.Context(t, 10*time.Second), b.keys.Outbox(b.keys.Shard(b.org)), "-", "+").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, e := range compactEvents(entries) {
		f := strings.Split(e, "|")
		require.GreaterOrEqual(t, len(f), 13, "compact entry %q", e)
		if len(f) == 13 {
			continue
		}
		require.Len(t, f, 14)
		for _, entry := range strings.Split(f[13], ",") {
			k, v, ok := strings.Cut(entry, "=")
			require.True(t, ok, entry)
			n := int64(0)
			for _, c := range v {
				n = n*10 + int64(c-'0')
			}
			out[k] += n
		}
	}
	return out
}

// The seed's borrow policy: an org of 100 tokens with team a guaranteed 30 (ceiling 80),
// team b guaranteed 20 (ceiling 100) and team c capped at 1000 without a guarantee. The
// org's spare is 100 - 30 - 20 = 50.
type tiers struct {
	org, a, b, c policy.Resolved
}

func newTiers(b *testBundle, ceilingA int64) tiers {
	la, lb := guaranteed(30, ceilingA), guaranteed(20, 100)
	org := policy.Level{Account: b.org, Kind: policy.Org, Limits: tokens(slow(100)), Reserved: reserve(la, lb)}
	team := func(name string, l policy.Limit) policy.Resolved {
		return tree(org, policy.Level{Account: b.org + "-" + name, Kind: policy.Team, Limits: tokens(l)})
	}
	return tiers{org: tree(org), a: team("a", la), b: team("b", lb), c: team("c", slow(1000))}
}

// With its siblings borrowing flat out, from another admit node and at the same time, a
// team still gets its whole guarantee; the borrowers share the org's spare and no more;
// every borrowed unit is recorded against the borrower.
func TestGuaranteeHoldsWhileSiblingsBorrow(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		tr := newTiers(b, 80)
		node2 := b.secondNode(t)
		var wg sync.WaitGroup
		var gotB, gotC int64
		var errB, errC error
		ctx := testenv.Context(t, 30*time.Second)
		wg.Add(2)
		go func() { defer wg.Done(); gotB, _, errB = tryFill(ctx, node2, tr.b, 5) }()
		go func() { defer wg.Done(); gotC, _, errC = tryFill(ctx, node2, tr.c, 5) }()
		gotA, refused := fill(t, b.adm, tr.a, 10)
		wg.Wait()
		require.NoError(t, errB)
		require.NoError(t, errC)

		require.GreaterOrEqual(t, gotA, int64(30), "team a's guarantee")
		require.Equal(t, int64(100), gotA+gotB+gotC, "the org's 100 tokens, all used, none twice")
		require.GreaterOrEqual(t, gotB, int64(20), "team b's guarantee")
		require.Equal(t, admission.RateLimited, refused.Result)

		// After the race: a and b are past their guarantees, c never had one; nobody gets
		// more, and the one who is refused is refused by the org, the lender.
		for _, pol := range []policy.Resolved{tr.a, tr.b, tr.c} {
			_, d := fill(t, b.adm, pol, 5)
			require.Equal(t, &admission.Blocker{Account: b.org, Level: policy.Org, Unit: "tokens"}, d.Blocked, pol.Account())
		}
		borrowed := b.borrowed(t)
		require.Equal(t, gotA-30, borrowed[b.org+"-a:tokens"], "a borrowed what it got past its guarantee")
		require.Equal(t, gotB-20, borrowed[b.org+"-b:tokens"], "b borrowed what it got past its guarantee")
		require.Zero(t, borrowed[b.org+"-c:tokens"], "c has no guarantee: it takes spare, it borrows nothing")
	})
}

// The sequential version, exact: b borrows all the spare first, then a gets exactly its
// guarantee and c nothing.
func TestBorrowersCannotTakeAGuarantee(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		tr := newTiers(b, 80)
		gotB, d := fill(t, b.adm, tr.b, 10)
		require.Equal(t, int64(70), gotB, "b: its 20, then the org's spare of 50")
		require.Equal(t, b.org, d.Blocked.Account, "the org has no spare left")
		gotC, _ := fill(t, b.adm, tr.c, 1)
		require.Zero(t, gotC, "c takes spare only")
		gotA, d := fill(t, b.adm, tr.a, 10)
		require.Equal(t, int64(30), gotA, "a: its guarantee, untouched by b's borrowing")
		require.Equal(t, b.org, d.Blocked.Account)
		require.Equal(t, map[string]int64{b.org + "-b:tokens": 50}, b.borrowed(t))
	})
}

// With its siblings idle, a team reaches its ceiling or the org's capacity less the
// siblings' unused guarantees, whichever is smaller.
func TestBorrowingReachesCeilingOrSpare(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name            string
		ceiling, want   int64
		blockedByLender bool
	}{
		{"ceiling below the spare", 60, 60, false},
		{"spare below the ceiling", 95, 80, true}, // 100 - b's unused 20
		{"ceiling equal to the guarantee", 30, 30, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
				tr := newTiers(b, c.ceiling)
				got, d := fill(t, b.adm, tr.a, 5)
				require.Equal(t, c.want, got)
				want := b.org + "-a"
				if c.blockedByLender {
					want = b.org
				}
				require.Equal(t, want, d.Blocked.Account)
				if c.want > 30 {
					require.Equal(t, map[string]int64{b.org + "-a:tokens": c.want - 30}, b.borrowed(t))
				} else {
					require.Empty(t, b.borrowed(t))
				}
				// b's guarantee is still whole.
				gotB, _ := fill(t, b.adm, tr.b, 5)
				require.GreaterOrEqual(t, gotB, int64(20))
			})
		})
	}
}

// A refused borrow consumes nothing: no bucket, no ceiling, no event.
func TestRefusedBorrowChangesNothing(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		tr := newTiers(b, 80)
		got, _ := fill(t, b.adm, tr.a, 10)
		require.Equal(t, int64(80), got)
		ctx := testenv.Context(t, 10*time.Second)
		before, err := b.rdb.HGetAll(ctx, b.stateHash()).Result()
		require.NoError(t, err)
		require.Contains(t, before, b.org+"-a:t^", "the ceiling's bucket")
		n0, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)
		// Within a's ceiling but past the org's spare, and past a's ceiling.
		for _, n := range []int64{1, 5, 30} {
			d := b.mustDecide(t, tr.a, map[policy.Unit]int64{policy.Tokens: n})
			require.Equal(t, admission.RateLimited, d.Result)
		}
		after, err := b.rdb.HGetAll(ctx, b.stateHash()).Result()
		require.NoError(t, err)
		require.Equal(t, before, after)
		n1, err := b.rdb.XLen(ctx, b.keys.Outbox(b.keys.Shard(b.org))).Result()
		require.NoError(t, err)
		require.Equal(t, n0, n1)
	})
}

// Three levels: a user's guarantee inside its team's, the team's inside the org's. An
// org of 100: team t guaranteed 40 (ceiling 100) and team s guaranteed 30 (idle); in t,
// user u1 guaranteed 10 (ceiling 40) and user u2 without a guarantee. u2 flat out takes
// t's spare (40 - 10) and then what t may borrow of the org's spare (100 - 40 - 30): 60;
// u1 still gets its 10, t its 40 in all, s its 30.
func TestGuaranteesNest(t *testing.T) {
	t.Parallel()
	forEachRedis(t, options{}, func(t *testing.T, b *testBundle) {
		lt, ls, lu1 := guaranteed(40, 100), guaranteed(30, 30), guaranteed(10, 40)
		org := policy.Level{Account: b.org, Kind: policy.Org, Limits: tokens(slow(100)), Reserved: reserve(lt, ls)}
		team := policy.Level{Account: b.org + "-t", Kind: policy.Team, Limits: tokens(lt), Reserved: reserve(lu1)}
		s := tree(org, policy.Level{Account: b.org + "-s", Kind: policy.Team, Limits: tokens(ls)})
		u1 := tree(org, team, policy.Level{Account: b.org + "-u1", Kind: policy.User, Limits: tokens(lu1)})
		u2 := tree(org, team, policy.Level{Account: b.org + "-u2", Kind: policy.User})

		got, d := fill(t, b.adm, u2, 5)
		require.Equal(t, int64(60), got)
		require.Equal(t, b.org, d.Blocked.Account)
		got, d = fill(t, b.adm, u1, 5)
		require.Equal(t, int64(10), got, "u1's guarantee")
		require.Equal(t, b.org, d.Blocked.Account, "u1 may borrow from t, t no more from the org")
		got, _ = fill(t, b.adm, s, 5)
		require.Equal(t, int64(30), got, "s's guarantee")
		require.Equal(t, map[string]int64{b.org + "-t:tokens": 30}, b.borrowed(t), "t borrowed the org's spare for u2")
	})
}
