package security_test

import (
	"context"
	"strings"
	"sync"
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
)

// Finding 8: the gRPC listener: streaming calls need the token and are bounded, messages
// are bounded. (Finding 3's hits_addend bound is here too.)
func grpcProbes() []probe {
	return []probe{
		{name: "F3-grpc-hits-bound", desc: "ShouldRateLimit with hits_addend over its maximum (request's 2^32-1, a descriptor's 2^62) is InvalidArgument",
			run: grpcHitsBound},
		{name: "F8-grpc-watch-auth", desc: "an unauthenticated health Watch is refused Unauthenticated; the unary health Check answers SERVING without credentials",
			run: grpcWatchAuth},
		{name: "F8-grpc-held-streams", desc: "3× the cap of authenticated health Watch streams at once: not all are held (the rest refused)",
			run: grpcHeldStreams},
		{name: "F8-grpc-max-message", desc: "a ShouldRateLimit message of 128 KiB (over the receive limit) is ResourceExhausted",
			run: grpcMaxMessage},
	}
}

// rlsClient calls Envoy's rate-limit service of the stack with the service token.
type rlsClient struct {
	conn *grpc.ClientConn
	c    rlsv3.RateLimitServiceClient
}

// rls connects to the stack's gRPC listener for the probe.
func (s *stack) rls(p *P) rlsClient {
	p.Helper()
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(p, err)
	p.Cleanup(func() { _ = conn.Close() })
	return rlsClient{conn: conn, c: rlsv3.NewRateLimitServiceClient(conn)}
}

// authed is ctx with the service token in the call's metadata.
func authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+serviceToken)
}

// call sends one ShouldRateLimit of the domain "metergate" with descs.
func (r rlsClient) call(p *P, descs ...*commonv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(authed(p.Context()), 10*time.Second)
	defer cancel()
	return r.c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: descs})
}

// descriptor is one descriptor of the entries kv (key, value, key, value…).
func descriptor(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func grpcHitsBound(p *P, s *stack) {
	org := s.id("grpc-bound")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	r := s.rls(p)
	ctx, cancel := context.WithTimeout(authed(p.Context()), 10*time.Second)
	defer cancel()
	_, err := r.c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", HitsAddend: 1<<32 - 1,
		Descriptors: []*commonv3.RateLimitDescriptor{descriptor("api_key", key)}})
	require.Equal(p, codes.InvalidArgument, status.Code(err), "request hits_addend 2^32-1: %v", err)
	d := descriptor("api_key", key)
	d.HitsAddend = wrapperspb.UInt64(1 << 62)
	_, err = r.call(p, d)
	require.Equal(p, codes.InvalidArgument, status.Code(err), "descriptor hits_addend 2^62: %v", err)
}

func grpcWatchAuth(p *P, s *stack) {
	r := s.rls(p)
	hc := healthpb.NewHealthClient(r.conn)
	ctx, cancel := context.WithTimeout(p.Context(), 10*time.Second)
	defer cancel()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
	require.NoError(p, err, "unary health Check without credentials")
	require.Equal(p, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())

	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
	if err == nil {
		var msg *healthpb.HealthCheckResponse
		msg, err = stream.Recv()
		require.Error(p, err, "an unauthenticated Watch was held open (got %v)", msg)
	}
	require.Equal(p, codes.Unauthenticated, status.Code(err), "unauthenticated Watch: %v", err)
}

func grpcHeldStreams(p *P, s *stack) {
	const n = 3 * heldStreams
	r := s.rls(p)
	hc := healthpb.NewHealthClient(r.conn)
	ctx, cancel := context.WithTimeout(authed(p.Context()), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	held, refused := 0, map[codes.Code]int{}
	var wg sync.WaitGroup
	holding := make(chan struct{})
	for range n {
		wg.Go(func() {
			stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: api.RLSService})
			if err == nil {
				_, err = stream.Recv()
			}
			mu.Lock()
			if err == nil {
				held++
			} else {
				refused[status.Code(err)]++
			}
			mu.Unlock()
			if err == nil {
				<-holding // keep the stream open until every one has its answer
			}
		})
	}
	// Every stream either got its first message (held) or its refusal; poll until all did.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		done := held + sum(refused)
		mu.Unlock()
		if done == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	h, ref := held, refused
	mu.Unlock()
	close(holding)
	cancel()
	wg.Wait()
	p.Logf("%d Watch streams at once: %d held, refused %v", n, h, ref)
	require.Less(p, h, n, "every one of %d streaming calls was held open", n)
	for c := range ref {
		require.Contains(p, []codes.Code{codes.ResourceExhausted, codes.Unavailable}, c, "refused with %v", ref)
	}
}

func sum(m map[codes.Code]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func grpcMaxMessage(p *P, s *stack) {
	r := s.rls(p)
	_, err := r.call(p, descriptor("api_key", "mgk_"+strings.Repeat("x", 128<<10)))
	require.Equal(p, codes.ResourceExhausted, status.Code(err), "a 128 KiB message: %v", err)
}
