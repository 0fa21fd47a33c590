package refusals_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/refusals"
	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// testBundle is a refusal log on keys of the test's own, and what the tests reach around it.
type testBundle struct {
	ctx  context.Context // ends with the test, a minute at most
	rdb  redis.UniversalClient
	keys keyspace.Keys
	reg  *prometheus.Registry // the log's metrics
	log  *refusals.Log
	org  string // an org id unique to the test
}

// setupOpts selects what setup builds.
type setupOpts struct {
	rdb  redis.UniversalClient // testenv.Redis by default
	opts refusals.Options      // Registerer is the bundle's
	// idle does not start the writer (refusals.NewIdle): the test calls Start.
	idle bool
}

func setup(tb testing.TB, o setupOpts) *testBundle {
	tb.Helper()
	b := &testBundle{ctx: testenv.Context(tb, time.Minute), rdb: o.rdb, reg: prometheus.NewRegistry(),
		keys: keyspace.Keys{Prefix: testenv.Prefix(tb) + "mg", Shards: keyspace.DefaultShards},
		org:  strings.ReplaceAll(testenv.Name(tb), "_", "-")}
	if b.rdb == nil {
		b.rdb = testenv.Redis(tb)
	}
	o.opts.Registerer = b.reg
	if o.idle {
		b.log = refusals.NewIdle(b.rdb, b.keys, o.opts)
	} else {
		b.log = refusals.New(b.rdb, b.keys, o.opts)
	}
	tb.Cleanup(func() {
		// A log that never started its writer is never done: it is not waited for.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.log.Close(ctx)
	})
	return b
}

// close closes the log: every refusal queued is written.
func (b *testBundle) close(t *testing.T) {
	t.Helper()
	require.NoError(t, b.log.Close(b.ctx))
}

// written is metergate_refusal_log_written_total.
func (b *testBundle) written(t *testing.T) float64 {
	t.Helper()
	return testenv.CounterValue(t, b.reg, "metergate_refusal_log_written_total")
}

// dropped is metergate_refusal_log_dropped_total{reason} (every reason when reason is "").
func (b *testBundle) dropped(t *testing.T, reason string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "metergate_refusal_log_dropped_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "reason" && (reason == "" || lp.GetValue() == reason) {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
