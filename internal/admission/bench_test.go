package admission_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// benchTree is a 4-level path (org → team → user → agent), each level with a requests
// and a tokens bucket, a monthly requests quota at the org: 8 buckets, 1 quota and the
// outbox event per decision. Limits are high enough that every decision is allowed.
func benchTree(org string) policy.Resolved {
	levels := []policy.Level{}
	for i, kind := range []policy.Kind{policy.Org, policy.Team, policy.User, policy.Agent} {
		limits := map[policy.Unit]policy.Limit{
			policy.Requests: bucket(1e9, 1e12),
			policy.Tokens:   bucket(1e12, 1e15),
		}
		if i == 0 {
			limits[policy.Requests] = withQuota(limits[policy.Requests], 1e15, policy.Month)
		}
		levels = append(levels, policy.Level{Account: org + "-" + string(kind), Kind: kind, Limits: limits})
	}
	levels[0].Account = org
	pol := tree(levels...)
	pol.Stamp = policy.NewStamp() // as the policy cache makes them
	return pol
}

func cleanupShard(b *testing.B, rdb redis.UniversalClient, adm *admission.Admitter, org string) {
	b.Cleanup(func() {
		ctx := context.Background()
		k := adm.Keys()
		_ = rdb.Del(ctx, k.Outbox(k.Shard(org))).Err()
	})
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkDecide measures one decision through the Admitter on the local Redis:
// "serial" is a lone caller (the latency of one decision at low load: p50 and p99 are
// reported), "parallel" is many callers whose decisions share script calls.
func BenchmarkDecide(b *testing.B) {
	rdb := testenv.Redis(b)
	units := map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}

	// The baseline of the same run: one PING round trip to the same Redis, serially.
	b.Run("baseline-ping", func(b *testing.B) {
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	})

	b.Run("serial", func(b *testing.B) {
		adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(b) + "mg"})
		pol := benchTree("bench-serial")
		cleanupShard(b, rdb, adm, pol.Org)
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(pol.Org), Units: units, Policy: pol, Source: "bench"})
			lat = append(lat, time.Since(start))
			if err != nil || d.Result != admission.Allow {
				b.Fatalf("decision %v, %v", d.Result, err)
			}
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	})

	b.Run("parallel", func(b *testing.B) {
		adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(b) + "mg"})
		pol := benchTree("bench-parallel")
		cleanupShard(b, rdb, adm, pol.Org)
		b.ReportAllocs()
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				d, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(pol.Org), Units: units, Policy: pol, Source: "bench"})
				if err != nil || d.Result != admission.Allow {
					b.Errorf("decision %v, %v", d.Result, err)
					return
				}
			}
		})
	})
}

// BenchmarkEncode is the Go side of one decision's script call without Redis: the keys and
// arguments of a 4-level decision with 8 buckets, a quota and the event (ScriptCall).
//
//	go test -run '^$' -bench Encode ./internal/admission/
func BenchmarkEncode(b *testing.B) {
	adm := admission.New(nil, admission.Options{})
	pol := benchTree("bench-encode")
	units := map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 2500}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := adm.ScriptCall(admission.Request{EventID: adm.NewEventID(pol.Org), Units: units, Policy: pol, Source: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
}
