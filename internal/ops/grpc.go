package ops

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// GRPC bounds a gRPC listener: its connections, the streams and messages of each, how long
// a connection may take to say hello, stay idle or live, how often clients may ping, and
// the streaming calls (health Watch, reflection) that may be held open at once.
type GRPC struct {
	// MaxConns is the most connections open at once; past it a new one is closed as soon
	// as it is accepted (LimitListener).
	MaxConns int
	// MaxStreams is the most concurrent calls of one connection (HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS): a grpc-go or Envoy client queues the others or
	// opens another connection; a stream past it is refused (REFUSED_STREAM).
	MaxStreams int
	// MaxRecvBytes is the largest request message; a larger one is ResourceExhausted.
	MaxRecvBytes int
	// MaxHeaderBytes is the largest metadata (HTTP/2 header list) of a call.
	MaxHeaderBytes int
	// HandshakeTimeout bounds a new connection up to the end of the HTTP/2 handshake.
	HandshakeTimeout time.Duration
	// IdleTimeout closes (GOAWAY) a connection without calls for that long; MaxAge any
	// connection that old, its calls given MaxAgeGrace to finish, so that no stream is held
	// for ever.
	IdleTimeout time.Duration
	MaxAge      time.Duration
	MaxAgeGrace time.Duration
	// KeepaliveTime is how long a connection may be silent before the server pings it, and
	// KeepaliveTimeout how long the ping's answer may take before the connection is closed.
	KeepaliveTime    time.Duration
	KeepaliveTimeout time.Duration
	// KeepaliveMinTime is the shortest interval between a client's pings; a client pinging
	// more often is sent GOAWAY (too_many_pings). Pings without calls are allowed.
	KeepaliveMinTime time.Duration
}

// ServerOptions are the grpc.ServerOptions of these limits. The connection cap is not one
// of them: wrap the listener with LimitListener.
func (c GRPC) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(c.MaxStreams)), //nolint:gosec // validated by internal/config: 1-65536
		grpc.MaxRecvMsgSize(c.MaxRecvBytes),
		grpc.MaxHeaderListSize(uint32(c.MaxHeaderBytes)), //nolint:gosec // validated by internal/config: at most 1 MiB
		grpc.ConnectionTimeout(c.HandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: c.IdleTimeout, MaxConnectionAge: c.MaxAge, MaxConnectionAgeGrace: c.MaxAgeGrace,
			Time: c.KeepaliveTime, Timeout: c.KeepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.KeepaliveMinTime, PermitWithoutStream: true}),
	}
}

// LimitListener returns ln accepting at most n connections open at once: a connection
// accepted past n is closed at once (counted in refused, which may be nil) rather than
// left waiting in the kernel's backlog, so that its client sees the refusal and backs off.
// A slot frees when a connection is closed.
func LimitListener(ln net.Listener, n int, refused prometheus.Counter) net.Listener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, n), refused: refused}
}

type limitListener struct {
	net.Listener
	slots   chan struct{}
	refused prometheus.Counter
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, free: func() { <-l.slots }}, nil
		default:
			_ = c.Close()
			if l.refused != nil {
				l.refused.Inc()
			}
		}
	}
}

// limitConn gives its slot back once, on the first Close.
type limitConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// ErrNoToken is the token StreamGuard refuses to run with: an empty token would let every
// caller in.
var ErrNoToken = errors.New("stream guard: empty token")

// StreamGuard returns a stream interceptor for every streaming call of a gRPC server
// (health Watch, reflection): it requires the bearer token in the call's metadata
// (authorization: Bearer <token>, compared in constant time), else Unauthenticated, and
// lets at most limit such calls run at once, else ResourceExhausted. A held stream costs the
// server a goroutine and a slot of its connection for as long as the client keeps it:
// unauthenticated clients may not hold any. Unary calls (health Check, which Kubernetes'
// and Envoy's health checks use without credentials) are not concerned.
func StreamGuard(token string, limit int) (grpc.StreamServerInterceptor, error) {
	if token == "" {
		return nil, ErrNoToken
	}
	slots := make(chan struct{}, limit)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !bearerMD(ss.Context(), token) {
			return status.Errorf(codes.Unauthenticated, "unauthorized: %s needs a valid service token (metadata authorization: Bearer …)", info.FullMethod)
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			return status.Errorf(codes.ResourceExhausted, "too many streams held open: at most %d at once; retry later", limit)
		}
		return handler(srv, ss)
	}, nil
}

// bearerMD reports whether the call's metadata carries "authorization: Bearer <token>".
func bearerMD(ctx context.Context, token string) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, h := range md.Get("authorization") {
		if Bearer(h, token) {
			return true
		}
	}
	return false
}
