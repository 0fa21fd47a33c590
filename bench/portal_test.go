package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/migrations"
)

// The portal section in miniature, on a migrated schema of its own: a year of 36,500
// events loaded through the triggers, every read timed, the baseline the same figures
// (a few seconds, -race included).
func TestPortalBench(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	pool, _ := testenv.EmptySchema(t)
	_, err := migrations.Up(ctx, pool)
	require.NoError(t, err)
	res := newResults()
	var out bytes.Buffer
	require.NoError(t, portalUsage(ctx, pool, portalOptions{Events: 36_500, Requests: 2, Rounds: 1, Now: time.Now().UTC()}, &out, res), out.String())

	raw := res.Raw["portal"].(map[string]any)
	load := raw["load"].(map[string]float64)
	require.Equal(t, 36_500.0, load["events"], out.String())
	require.Equal(t, float64(36_500/4), load["outcomes"])
	require.Positive(t, load["voids"])
	for _, r := range raw["reads"].([]readTiming) {
		require.Equal(t, 2, r.N, r.Name)
		require.Positive(t, r.Rows, r.Name)
		v, ok := res.Value("portal_usage_p95_ms_" + r.Name)
		require.True(t, ok, r.Name)
		require.LessOrEqual(t, r.P50, v, r.Name)
	}
	for _, k := range []string{"portal_usage_rollup_speedup", "portal_load_events_per_s"} {
		_, ok := res.Value(k)
		require.True(t, ok, k)
	}
}
