package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadShard(t *testing.T) {
	t.Parallel()
	const now = 1_800_000_000_123 // ms
	margin := markMargin.Milliseconds()
	for _, tc := range []struct {
		name  string
		reply []string
		want  shardMark
	}{
		{"empty outbox, no mark: Redis time", []string{"1800000000", "123456", "", "", ""},
			shardMark{now: now, old: -1, mark: now - margin}},
		{"an entry waiting: its time", []string{"1800000000", "123456", "1799999000000", "1799999990000-3", ""},
			shardMark{now: now, old: 1_799_999_000_000, mark: 1_799_999_990_000 - margin}},
		{"the oldest of the streams", []string{"1800000000", "123456", "", "1799999990000-0", "1799999980000-7"},
			shardMark{now: now, old: -1, mark: 1_799_999_980_000 - margin}},
		{"an entry stamped after TIME (a clock step): TIME", []string{"1800000000", "123456", "", "1800000005000-0"},
			shardMark{now: now, old: -1, mark: now - margin}},
	} {
		got, err := readShard(tc.reply)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
	for _, bad := range [][]string{{"1"}, {"x", "1", ""}, {"1", "1", "m"}, {"1", "1", "", "zz-1"}} {
		_, err := readShard(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	const hot, ttl = 1000, 10_000 // buckets of 1 s, a TTL of 10
	for _, tc := range []struct {
		name           string
		s              shardMark
		wantLo, wantHi int64
	}{
		{"the mark's bucket and the previous one stay", shardMark{now: 20_500, old: 15_200, mark: 20_100}, 14, 19},
		{"a mark in the current bucket: the previous one stays", shardMark{now: 20_500, old: 19_000, mark: 20_400}, 18, 19},
		{"a mark far behind: from its bucket on", shardMark{now: 20_500, old: 12_000, mark: 16_900}, 11, 16},
		{"no mark before: from the oldest bucket that may exist", shardMark{now: 20_500, old: -1, mark: 20_100}, 9, 19},
		{"a bucket the previous pass kept as the one before the current", shardMark{now: 20_500, old: 19_900, mark: 19_950}, 18, 19},
		{"a mark behind the one in force: nothing", shardMark{now: 20_500, old: 19_900, mark: 10_000}, 10, 10},
	} {
		lo, hi := sweep(tc.s, hot, ttl)
		require.Equal(t, [2]int64{tc.wantLo, tc.wantHi}, [2]int64{lo, hi}, tc.name)
	}
	// At most maxSweep buckets, the newest.
	lo, hi := sweep(shardMark{now: 1_000_000_000, old: -1, mark: 1_000_000_000}, 1, 1_000_000)
	require.Equal(t, int64(maxSweep), hi-lo)
	require.Equal(t, int64(1_000_000_000-1), hi)
}

func TestNewestCaughtUp(t *testing.T) {
	t.Parallel()
	cs := []candidate{{ends: map[int]int64{0: 5, 1: 0}}, {ends: map[int]int64{0: 9, 1: 2}}, {ends: map[int]int64{0: 12, 1: 2}}}
	for _, tc := range []struct {
		name      string
		committed map[int]int64
		want      int
	}{
		{"nothing committed yet", map[int]int64{0: -1, 1: -1}, -1},
		{"an empty partition needs no commit", map[int]int64{0: 5, 1: -1}, 0},
		{"the newest passed", map[int]int64{0: 12, 1: 2}, 2},
		{"past it", map[int]int64{0: 40, 1: 3}, 2},
		{"between two", map[int]int64{0: 11, 1: 2}, 1},
		{"one partition behind holds all back", map[int]int64{0: 40, 1: 1}, 0},
		{"a partition missing from the reply", map[int]int64{0: 40}, -1},
	} {
		require.Equal(t, tc.want, newestCaughtUp(cs, tc.committed), tc.name)
	}
}

func TestFloorDiv(t *testing.T) {
	t.Parallel()
	for _, tc := range [][3]int64{{7, 2, 3}, {-7, 2, -4}, {-8, 2, -4}, {0, 5, 0}, {-1, 1000, -1}} {
		require.Equal(t, tc[2], floorDiv(tc[0], tc[1]), "%d / %d", tc[0], tc[1])
	}
}
