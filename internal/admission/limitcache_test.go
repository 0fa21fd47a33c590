package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// TestLimitCacheLivesTwoSnapshots: limits derived from a policy are found again while its
// snapshot is the newest or the one before, and dropped after that; a policy without a
// stamp is never kept.
func TestLimitCacheLivesTwoSnapshots(t *testing.T) {
	var c limitCache
	stamp := func(snapshot, i uint64) policy.Stamp { return policy.Stamp(snapshot<<32 | i) }
	a, b, d := &limits{}, &limits{}, &limits{}

	c.put(0, a)
	require.Nil(t, c.get(0), "an unstamped policy is derived at each decision")

	c.put(stamp(1, 1), a)
	require.Same(t, a, c.get(stamp(1, 1)))
	c.put(stamp(2, 1), b) // a reload: snapshot 1 retires
	require.Same(t, b, c.get(stamp(2, 1)))
	require.Same(t, a, c.get(stamp(1, 1)), "a request of the earlier snapshot still finds it")
	c.put(stamp(3, 1), d)
	c.put(stamp(4, 1), d) // two reloads later snapshot 1 is gone
	require.Nil(t, c.get(stamp(1, 1)))
	require.Nil(t, c.get(stamp(2, 1)))
	require.Same(t, d, c.get(stamp(4, 1)))

	loose := policy.NewStamp()
	require.Zero(t, loose.Snapshot())
	c.put(loose, a) // a stamp made outside a cache never retires the current snapshot
	require.Same(t, a, c.get(loose))
	require.Same(t, d, c.get(stamp(4, 1)))
}
