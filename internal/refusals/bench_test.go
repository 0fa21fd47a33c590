package refusals_test

import (
	"testing"

	"github.com/metergate/metergate/internal/refusals"
)

// BenchmarkRefused is the refusal log's cost on the decision path of a refusal: "queued"
// with the writer running against the test Redis (a refusal queued, or dropped when the
// writer falls behind), "full" with the queue full and no writer (every refusal dropped and
// counted). Both parallel, as the gate's doors call it. Measured: 20-40 ns, no allocation.
func BenchmarkRefused(b *testing.B) {
	for _, name := range []string{"queued", "full"} {
		b.Run(name, func(b *testing.B) {
			bb := setupBench(b, name == "full")
			r := rateLimited(bb.org, bb.org+".alice", "k", 0)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bb.log.Refused(r)
				}
			})
		})
	}
}

// setupBench is setup for a benchmark: a Log on the test Redis, its writer started unless
// full (then its queue of one is filled first).
func setupBench(b *testing.B, full bool) *testBundle {
	b.Helper()
	opts := refusals.Options{}
	if full {
		opts.Queue = 1
	}
	bb := setup(b, setupOpts{opts: opts, idle: full})
	if full {
		bb.log.Refused(rateLimited(bb.org, bb.org+".alice", "k", 0))
		b.Cleanup(bb.log.Start) // before setup's Close, which waits for the writer
	}
	return bb
}
