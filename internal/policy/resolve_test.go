package policy

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

func quota(n int64) *int64 { return &n }

// The overlay rules without a database: the rate part and the quota part are replaced as
// groups, and an override that sets only one leaves the other to the plan.
func TestOverlay(t *testing.T) {
	t.Parallel()
	plan := Limit{Algorithm: TokenBucket, RatePerS: 100, Burst: 300, Quota: quota(5_000_000), QuotaPeriod: Month}
	tests := []struct {
		name string
		over Limit
		want Limit
	}{
		{"rate only keeps the plan's quota", Limit{RatePerS: 5, Burst: 10}.Normalize(),
			Limit{Algorithm: TokenBucket, RatePerS: 5, Burst: 10, Quota: quota(5_000_000), QuotaPeriod: Month}},
		{"limit per window replaces the whole rate part", Limit{Limit: 60, WindowS: 60}.Normalize(),
			Limit{Algorithm: TokenBucket, RatePerS: 1, Burst: 60, Limit: 60, WindowS: 60, Quota: quota(5_000_000), QuotaPeriod: Month}},
		{"sliding window clears the bucket fields", Limit{Algorithm: SlidingWindow, Limit: 10, WindowS: 1800}.Normalize(),
			Limit{Algorithm: SlidingWindow, Limit: 10, WindowS: 1800, Quota: quota(5_000_000), QuotaPeriod: Month}},
		{"quota only keeps the plan's rate", Limit{Quota: quota(1000), QuotaPeriod: Day}.Normalize(),
			Limit{Algorithm: TokenBucket, RatePerS: 100, Burst: 300, Quota: quota(1000), QuotaPeriod: Day}},
		{"uncapped quota lifts the plan's", Limit{Quota: quota(Uncapped)}.Normalize(),
			Limit{Algorithm: TokenBucket, RatePerS: 100, Burst: 300, Quota: quota(Uncapped), QuotaPeriod: Month}},
		{"both parts", Limit{RatePerS: 1, Burst: 2, Quota: quota(3)}.Normalize(),
			Limit{Algorithm: TokenBucket, RatePerS: 1, Burst: 2, Quota: quota(3), QuotaPeriod: Month}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, overlay(plan, tt.over))
		})
	}
	// Without a plan limit, an override stands alone, normalized.
	require.Equal(t, Limit{Algorithm: TokenBucket, Quota: quota(7), QuotaPeriod: Month}, overlay(Limit{}, Limit{Quota: quota(7)}.Normalize()))
}

// Nodes with the same plan and overrides share one limits map, whatever order the
// overrides were read in; different ones do not.
func TestResolveAllSharesEqualLevels(t *testing.T) {
	t.Parallel()
	plans, err := newPlanSet(map[string]*Plan{"free": {ID: "free", Limits: map[Unit]Limit{Requests: {Algorithm: TokenBucket, RatePerS: 1, Burst: 1}}}})
	require.NoError(t, err)
	tokens, credits := Limit{Algorithm: TokenBucket, RatePerS: 2, Burst: 2}, Limit{Algorithm: TokenBucket, Quota: quota(5), QuotaPeriod: Month}
	nodes := []node{
		{id: "a3", kind: Agent, parent: "u", org: "o"},
		{id: "a1", kind: Agent, parent: "u", org: "o"},
		{id: "a2", kind: Agent, parent: "u", org: "o"},
		{id: "u", kind: User, parent: "o", org: "o"},
		{id: "o", kind: Org, org: "o"},
	}
	nodes[1].addOverride(Tokens, tokens)
	nodes[1].addOverride(Credits, credits)
	nodes[2].addOverride(Credits, credits)
	nodes[2].addOverride(Tokens, tokens)
	nodes[0].addOverride(Tokens, tokens)
	resolved, bad := resolveAll(nodes, plans)
	require.Empty(t, bad)
	require.Len(t, resolved, 5)
	limits := func(id string) map[Unit]Limit { r := resolved[id]; return r.Path[len(r.Path)-1].Limits }
	require.Equal(t, map[Unit]Limit{Tokens: tokens, Credits: credits}, limits("a1"))
	require.Equal(t, reflect.ValueOf(limits("a1")).Pointer(), reflect.ValueOf(limits("a2")).Pointer())
	require.NotEqual(t, reflect.ValueOf(limits("a1")).Pointer(), reflect.ValueOf(limits("a3")).Pointer())
	require.Equal(t, map[Unit]Limit{Tokens: tokens}, limits("a3"))
	require.Empty(t, limits("u"), "no plan, no overrides")
	require.Equal(t, "free", resolved["a1"].Plan, "the org without a plan is on the smallest")

	// Paths share their ancestors' levels but an append to one cannot write into another.
	p1 := resolved["a1"].Path
	_ = append(p1, Level{Account: "x"})
	require.Equal(t, "a2", resolved["a2"].Path[2].Account)
}

// Guarantees: each child's token bucket with a ceiling is reserved in its parent (summed
// per unit, every descendant's path seeing it); a limit without a ceiling reserves
// nothing; an org's ceiling (from its plan) is dropped, and the same plan below the org
// keeps it. Priorities: own, else the named plan's, else the parent's.
func TestResolveGuaranteesAndPriority(t *testing.T) {
	t.Parallel()
	tier := Limit{Algorithm: TokenBucket, RatePerS: 10, Burst: 100, Ceiling: 400}
	plans, err := newPlanSet(map[string]*Plan{
		"free": {ID: "free", Priority: 5, Limits: map[Unit]Limit{Tokens: {Algorithm: TokenBucket, RatePerS: 100, Burst: 1000}}},
		"tier": {ID: "tier", Rank: 1, Priority: 40, Limits: map[Unit]Limit{Tokens: tier}},
	})
	require.NoError(t, err)
	g1 := Limit{Algorithm: TokenBucket, RatePerS: 2, Burst: 20, Ceiling: 50}
	g2 := Limit{Algorithm: TokenBucket, RatePerS: 3, Burst: 30, Ceiling: 30}
	capOnly := Limit{Algorithm: TokenBucket, RatePerS: 50, Burst: 500}
	seven := 7
	nodes := []node{
		{id: "o", kind: Org, org: "o"},
		{id: "t1", kind: Team, parent: "o", org: "o", priority: &seven},
		{id: "t2", kind: Team, parent: "o", org: "o"},
		{id: "t3", kind: Team, parent: "o", org: "o"},
		{id: "t4", kind: Team, parent: "o", org: "o", plan: "tier"},
		{id: "u1", kind: User, parent: "t1", org: "o"},
		{id: "o2", kind: Org, org: "o2", plan: "tier"},
	}
	nodes[1].addOverride(Tokens, g1)
	nodes[2].addOverride(Tokens, g2)
	nodes[2].addOverride(Requests, g1)
	nodes[3].addOverride(Tokens, capOnly)
	resolved, bad := resolveAll(nodes, plans)
	require.Empty(t, bad)

	org := resolved["u1"].Path[0]
	require.Equal(t, map[Unit]Reservation{
		Tokens:   {RatePerS: 2 + 3 + 10, Burst: 20 + 30 + 100}, // t1, t2 and t4's plan; not t3
		Requests: {RatePerS: 2, Burst: 20},
	}, org.Reserved)
	require.Equal(t, org.Reserved, resolved["t3"].Path[0].Reserved, "every path sees the org's reservations")
	require.Nil(t, resolved["t2"].Path[1].Reserved, "t2 has no children")
	require.Equal(t, int64(400), resolved["t4"].Path[1].Limits[Tokens].Ceiling, "a plan's ceiling below the org")
	require.Zero(t, resolved["o2"].Path[0].Limits[Tokens].Ceiling, "an org has no parent to borrow from")
	require.Equal(t, int64(100), resolved["o2"].Path[0].Limits[Tokens].Burst)

	for id, want := range map[string]int{"o": 5, "t1": 7, "u1": 7, "t2": 5, "t4": 40, "o2": 40} {
		require.Equal(t, want, resolved[id].Priority, id)
	}
}
