package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMinuteSamples: a minute's admissions and refusals are its counters' growth since
// the minute before; a minute without a sample on either side, or one overwritten by the
// ring a lap later, shows nothing.
func TestMinuteSamples(t *testing.T) {
	var s minuteSamples
	m := time.Date(2026, 11, 27, 15, 0, 0, 0, time.UTC)
	s.record(m.Add(-time.Minute+10*time.Second), map[string]float64{"decision/allow": 2})
	s.record(m.Add(-time.Minute+50*time.Second), map[string]float64{"decision/allow": 5, "decision/rate_limited": 1})
	s.record(m.Add(20*time.Second), map[string]float64{"decision/allow": 8, "decision/rate_limited": 2,
		"decision/quota_exceeded": 1, "decision/insufficient_balance": 1, "rejected/unknown_account": 9})
	a, r := s.growth(m)
	require.EqualValues(t, 3, a, "from the last sample of the minute before")
	require.EqualValues(t, 3, r, "every refusal by a limit, no rejection")
	a, r = s.growth(m.Add(-time.Minute))
	require.Zero(t, a+r, "no sample of the minute before it")
	a, r = s.growth(m.Add(time.Minute))
	require.Zero(t, a+r, "no sample of its own")

	s.record(m.Add(61*time.Minute), map[string]float64{"decision/allow": 100})
	a, _ = s.growth(m.Add(61 * time.Minute))
	require.Zero(t, a, "the minute before is a lap old")
	a, _ = s.growth(m)
	require.Zero(t, a, "its slot holds a later minute now")
}
