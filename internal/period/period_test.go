package period_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
)

func TestLabelsAndBounds(t *testing.T) {
	t.Parallel()
	// The last microsecond of a year, in a zone east of UTC: still December UTC.
	at := time.Date(2027, 1, 1, 0, 59, 59, 999_999_000, time.FixedZone("CET", 3600))
	require.Equal(t, "2026-12", period.MonthLabel(at))
	require.Equal(t, "2026-12-31", period.DayLabel(at))
	require.Equal(t, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), period.MonthStart(at))
	require.Equal(t, time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), period.DayStart(at))

	for label, want := range map[string][2]time.Time{
		"2026-12":    {time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
		"2028-02-28": {time.Date(2028, 2, 28, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)},
		"2028-02-29": {time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)},
	} {
		start, err := period.Parse(label)
		require.NoError(t, err, label)
		end, err := period.End(label)
		require.NoError(t, err, label)
		require.Equal(t, want, [2]time.Time{start, end}, label)
	}
	for _, bad := range []string{"", "2026", "2026-1", "2026-13", "2026-11-31", "2026-11-01T00", "26-11", " 2026-11"} {
		_, err := period.Parse(bad)
		require.Error(t, err, bad)
	}
	_, err := period.ParseMonth("2026-11-01")
	require.Error(t, err, "a day is not a month")
}

func TestClock(t *testing.T) {
	t.Parallel()
	before := time.Now()
	now := period.Clock(nil).Now()
	require.False(t, now.Before(before), "nil is the system clock")
	require.WithinDuration(t, time.Now(), now, time.Minute)

	at := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	require.Equal(t, at, period.Fixed(at).Now())
}
