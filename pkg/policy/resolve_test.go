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
