package policy_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

func quota(n int64) *int64 { return &n }

func TestBeyond(t *testing.T) {
	t.Parallel()
	bucket := policy.Limit{Algorithm: policy.TokenBucket, RatePerS: 10, Burst: 100, Quota: quota(1000), QuotaPeriod: policy.Month}
	for _, tt := range []struct {
		name   string
		l      policy.Limit
		beyond bool
	}{
		{"the same", bucket, false},
		{"less of each", policy.Limit{RatePerS: 5, Burst: 50, Quota: quota(10)}.Normalize(), false},
		{"no rate, no quota: the bound's apply", policy.Limit{}.Normalize(), false},
		{"a faster rate", policy.Limit{RatePerS: 11, Burst: 50}.Normalize(), true},
		{"a bigger burst", policy.Limit{RatePerS: 1, Burst: 101}.Normalize(), true},
		{"a ceiling past the burst", policy.Limit{RatePerS: 1, Burst: 10, Ceiling: 101}.Normalize(), true},
		{"a bigger quota", policy.Limit{Quota: quota(1001)}.Normalize(), true},
		{"an uncapped quota", policy.Limit{Quota: quota(-1)}.Normalize(), true},
		{"a bigger daily quota", policy.Limit{Quota: quota(1001), QuotaPeriod: policy.Day}.Normalize(), true},
		{"a window within", policy.Limit{Algorithm: policy.SlidingWindow, Limit: 100, WindowS: 10}, false},
		{"a window faster", policy.Limit{Algorithm: policy.SlidingWindow, Limit: 100, WindowS: 5}, true},
		{"a window past the burst", policy.Limit{Algorithm: policy.SlidingWindow, Limit: 200, WindowS: 100}, true},
	} {
		why := tt.l.Beyond(bucket)
		require.Equal(t, tt.beyond, why != "", "%s: %q", tt.name, why)
	}
	require.Empty(t, policy.Limit{Quota: quota(-1)}.Normalize().Beyond(policy.Limit{Quota: quota(-1)}), "uncapped under uncapped")
	// Without a bound, anything is within.
	require.Empty(t, policy.Limit{RatePerS: 1e6, Burst: 1e9, Quota: quota(1e12)}.Normalize().Beyond(policy.Limit{}))
}
