package ops_test

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/metergate/metergate/internal/ops"
)

const token = "service-token-0123456789"

// grpcLimits are admit's defaults but for what a test must see happen quickly.
var grpcLimits = ops.GRPC{
	MaxConns: 64, MaxStreams: 64, MaxRecvBytes: 64 << 10, MaxHeaderBytes: 64 << 10,
	HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 5 * time.Minute, MaxAge: 30 * time.Minute,
	MaxAgeGrace: 30 * time.Second, KeepaliveTime: time.Minute, KeepaliveTimeout: 20 * time.Second,
	KeepaliveMinTime: 10 * time.Second,
}

// grpcServer serves the standard health service with c's limits, behind StreamGuard with
// held streams at most, on a loopback listener capped at c.MaxConns, until the test
// ends. It returns the address and the counter of refused connections.
func grpcServer(t *testing.T, c ops.GRPC, held int) (string, prometheus.Counter) {
	t.Helper()
	guard, err := ops.StreamGuard(token, held)
	require.NoError(t, err)
	g := grpc.NewServer(append(c.ServerOptions(), grpc.ChainStreamInterceptor(guard))...)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"})
	go func() { _ = g.Serve(ops.LimitListener(ln, c.MaxConns, refused)) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), refused
}

func client(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func authed(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// watch opens a health Watch and returns its first status (or error); cancel ends it.
func watch(ctx context.Context, hc healthpb.HealthClient) (healthpb.HealthCheckResponse_ServingStatus, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return 0, cancel, err
	}
	r, err := w.Recv()
	return r.GetStatus(), cancel, err
}

// Health Watch needs the service token, and only so many are held at once; unary Check
// needs no token (Kubernetes' and Envoy's health checks send none).
func TestHealthWatchNeedsTheTokenAndIsCapped(t *testing.T) {
	t.Parallel()
	addr, _ := grpcServer(t, grpcLimits, 2)
	hc := client(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "Check without credentials")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.GetStatus())

	_, end, err := watch(ctx, hc)
	end()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "Watch without a token: %v", err)
	_, end, err = watch(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer not-the-token-0123456"), hc)
	end()
	require.Equal(t, codes.Unauthenticated, status.Code(err), "Watch with a wrong token: %v", err)

	st, end1, err := watch(authed(ctx), hc)
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, st)
	_, end2, err := watch(authed(ctx), hc)
	require.NoError(t, err)
	defer end2()
	_, end3, err := watch(authed(ctx), hc)
	end3()
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "a third held stream past the cap of 2: %v", err)

	end1() // its slot frees once the server sees the cancellation
	for {
		_, end, err := watch(authed(ctx), hc)
		end()
		if err == nil {
			break
		}
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		require.NoError(t, ctx.Err(), "the slot never freed")
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

// Past MaxStreams calls on one connection, grpc-go's client queues the next call until
// one ends (the server announced the limit in its HTTP/2 SETTINGS).
func TestStreamsPerConnectionAreQueued(t *testing.T) {
	t.Parallel()
	c := grpcLimits
	c.MaxStreams = 2
	addr, _ := grpcServer(t, c, 16)
	hc := client(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, end1, err := watch(authed(ctx), hc)
	require.NoError(t, err)
	_, end2, err := watch(authed(ctx), hc)
	require.NoError(t, err)
	defer end2()

	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = hc.Check(short, &healthpb.HealthCheckRequest{})
	cancelShort()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "a third call waits for a stream: %v", err)

	end1()
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "served once a stream ended")
}

// A request message past MaxRecvBytes is ResourceExhausted; one within is served.
func TestLargeMessageIsRefused(t *testing.T) {
	t.Parallel()
	addr, _ := grpcServer(t, grpcLimits, 16)
	hc := client(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("s", grpcLimits.MaxRecvBytes+1)})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = hc.Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("s", 1000)})
	require.Equal(t, codes.NotFound, status.Code(err), "a small message is read (an unknown service): %v", err)
}

// Past MaxConns open connections a new one is closed when accepted, and counted; closing
// one lets the next in.
func TestConnectionsAreCapped(t *testing.T) {
	t.Parallel()
	c := grpcLimits
	c.MaxConns = 2
	addr, refused := grpcServer(t, c, 16)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conns []*grpc.ClientConn
	for range 2 {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		conns = append(conns, conn)
	}
	third := client(t, addr)
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	_, err := third.Check(short, &healthpb.HealthCheckRequest{})
	cancelShort()
	require.Equal(t, codes.Unavailable, status.Code(err), "a third connection is closed: %v", err)
	require.Positive(t, testutil.ToFloat64(refused))

	require.NoError(t, conns[0].Close())
	for { // the slot frees once the server has closed its side; a new client connects then
		short, cancelShort := context.WithTimeout(ctx, time.Second)
		_, err := client(t, addr).Check(short, &healthpb.HealthCheckRequest{})
		cancelShort()
		if err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "no slot freed: %v", err)
	}
}

// A connection that never finishes its HTTP/2 handshake is closed at HandshakeTimeout.
func TestSilentConnectionIsClosed(t *testing.T) {
	t.Parallel()
	addr, _ := grpcServer(t, grpcLimits, 16)
	conn := dial(t, addr)
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(start.Add(grpcLimits.HandshakeTimeout+5*time.Second)))
	_, err := io.Copy(io.Discard, conn) // the server's SETTINGS, then EOF when it closes
	require.NoError(t, err, "closed by the server, not by the test's deadline")
	took := time.Since(start)
	t.Logf("silent connection closed after %s", took)
	require.GreaterOrEqual(t, took, grpcLimits.HandshakeTimeout-50*time.Millisecond)
}

// A connection without calls for IdleTimeout is closed by the server (GOAWAY).
func TestIdleGRPCConnectionIsClosed(t *testing.T) {
	t.Parallel()
	c := grpcLimits
	c.IdleTimeout = 300 * time.Millisecond
	addr, _ := grpcServer(t, c, 16)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, connectivity.Ready, conn.GetState())
	require.True(t, conn.WaitForStateChange(ctx, connectivity.Ready), "the server never closed the idle connection")
}

// An empty token would let everyone in: StreamGuard refuses it.
func TestStreamGuardNeedsAToken(t *testing.T) {
	t.Parallel()
	_, err := ops.StreamGuard("", 16)
	require.ErrorIs(t, err, ops.ErrNoToken)
}
