package main

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
)

// The admit binary serves Envoy's rate-limit service on ADMIT_GRPC_ADDR: health SERVING
// once the policies are loaded, a free key's burst cut at 20 with OVER_LIMIT, the
// stream-done call accepted as the outcome, and a graceful stop on SIGTERM.
func TestRateLimitServiceOnGRPCAddr(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	_, schema := testenv.EmptySchema(t)
	prefix := testenv.Name(t)
	addr, grpcAddr := testenv.FreeAddr(t), testenv.FreeAddr(t)
	p := testenv.StartMain(t, append(testenv.AdmitTokens(),
		"ADMIT_ADDR="+addr, "ADMIT_GRPC_ADDR="+grpcAddr, "ADMIT_KEY_PREFIX=t:"+prefix+":mg", "ADMIT_RELAY=false",
		"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=", "DATABASE_URL="+testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"KAFKA_BROKERS="+strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=t."+prefix, "LOG_LEVEL=warn"), "-migrate")
	base := "http://" + addr
	_, err := testenv.WaitHTTP(ctx, base+"/readyz", 200)
	require.NoError(t, err)

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		require.NoError(t, ctx.Err(), "the rate-limit service never SERVING: %v", err)
		time.Sleep(10 * time.Millisecond)
	}

	// Streaming calls need the service token (ops.StreamGuard); unary Check does not.
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
	require.NoError(t, err)
	_, err = w.Recv()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "Watch without a token: %v", err)
	wctx, endWatch := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+serviceToken()))
	w, err = hc.Watch(wctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
	require.NoError(t, err)
	hr, err := w.Recv()
	require.NoError(t, err, "Watch with the service token")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.GetStatus())
	endWatch()

	org := strings.ReplaceAll(prefix, "_", "-")
	post(t, http.DefaultClient, base+"/v1/admin/accounts", adminToken(), map[string]any{"id": org, "kind": "org", "plan": "free"}, 201)
	key := post(t, http.DefaultClient, base+"/v1/admin/api-keys", adminToken(), map[string]any{"account": org}, 201)["api_key"].(string)

	client := rlsv3.NewRateLimitServiceClient(conn)
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+serviceToken())
	call := func(descs ...*commonv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
		return client.ShouldRateLimit(authed, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: descs})
	}
	entry := func(kv ...string) *commonv3.RateLimitDescriptor {
		d := &commonv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	_, err = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: []*commonv3.RateLimitDescriptor{entry("api_key", key)}})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no token: %v", err)
	// A call is a few hundred bytes; one past ADMIT_GRPC_MAX_RECV_BYTES is refused unread.
	_, err = call(entry("api_key", strings.Repeat("k", 64<<10)))
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a 64 KiB call: %v", err)

	var first *rlsv3.RateLimitResponse
	for { // the key reaches the node's cache through LISTEN/NOTIFY
		first, err = call(entry("generic_key", "api"), entry("api_key", key))
		require.NoError(t, err)
		if first.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			break
		}
		require.Contains(t, string(first.GetRawBody()), "unknown_api_key")
		require.NoError(t, ctx.Err(), "the key never reached the node")
		time.Sleep(10 * time.Millisecond)
	}
	require.Len(t, first.GetRequestHeadersToAdd(), 1)
	id := first.GetRequestHeadersToAdd()[0].GetValue()

	// The rest of the burst of 30 at once. The free plan refills 10/s: what the calls took
	// (long under -race on a loaded machine) may add that many passes, never more.
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	ok, over := 1, 0
	for range 29 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := call(entry("generic_key", "api"), entry("api_key", key))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				t.Error(err)
			case r.GetOverallCode() == rlsv3.RateLimitResponse_OK:
				ok++
			default:
				over++
				if !strings.Contains(string(r.GetRawBody()), `"rate_limited"`) {
					t.Errorf("refused without rate_limited: %s", r.GetRawBody())
				}
			}
		}()
	}
	wg.Wait()
	refill := int(math.Ceil(10*time.Since(start).Seconds())) + 1
	require.GreaterOrEqual(t, ok, 20)
	require.LessOrEqual(t, ok, 20+refill, "the burst is cut at 20 (+%d refilled)", refill)
	if 20+refill < 30 {
		require.Positive(t, over)
	}

	done := entry("api_key", key, "event_id", id)
	done.HitsAddend = wrapperspb.UInt64(321)
	r, err := call(done)
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode(), "the stream-done call is the outcome, never refused")

	require.NoError(t, p.Signal(syscall.SIGTERM))
	code, err := p.Wait(30 * time.Second)
	require.NoError(t, err)
	require.Zero(t, code, "graceful stop:\n%s", p.Output())
	_, err = hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.Error(t, err, "the gRPC listener is closed")
}
