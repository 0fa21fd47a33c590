package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/ops"
)

// listenGRPC opens the listener of Envoy's rate-limit service when ADMIT_GRPC_ADDR is set. It
// returns what serves it until ctx ends (nil when off) and what closes the listener, which
// the server closes once it serves: the close covers an early return.
func listenGRPC(cfg config.Admit, log *slog.Logger, server *api.Server, reg prometheus.Registerer) (func(context.Context) error, func(), error) {
	if cfg.RLS.Addr == "" {
		return nil, func() {}, nil
	}
	lis, gs, hs, err := grpcListener(cfg, server, reg)
	if err != nil {
		return nil, nil, err
	}
	log.Info("grpc listening", "addr", lis.Addr().String())
	serve := func(ctx context.Context) error { return server.ServeGRPC(ctx, lis, gs, hs, cfg.Server.ShutdownTimeout) }
	return serve, func() { _ = lis.Close() }, nil
}

// grpcListener opens the gRPC listener, at most ADMIT_GRPC_MAX_CONNS connections at once,
// and builds the server with the listener's limits: streams, message and metadata sizes,
// handshake, idle, age and keepalive bounds, and the service token for every streaming
// call (health Watch, reflection), ADMIT_GRPC_MAX_HELD_STREAMS of them at once. Unary
// calls are not concerned: health Check stays open to orchestrators, ShouldRateLimit
// checks the token itself.
func grpcListener(cfg config.Admit, server *api.Server, reg prometheus.Registerer) (net.Listener, *grpc.Server, *health.Server, error) {
	guard, err := ops.StreamGuard(cfg.Admission.ServiceToken, cfg.RLS.MaxHeldStreams)
	if err != nil {
		return nil, nil, nil, err
	}
	opts := append(cfg.GRPC().ServerOptions(), grpc.ChainStreamInterceptor(guard))
	gs, hs, err := server.NewGRPCServer(cfg.RLS.Mapping(), opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	lis, err := net.Listen("tcp", cfg.RLS.Addr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("ADMIT_GRPC_ADDR: %w", err)
	}
	refused := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "metergate_grpc_connections_refused_total",
		Help: "gRPC connections closed when accepted because ADMIT_GRPC_MAX_CONNS were open.",
	})
	reg.MustRegister(refused)
	return ops.LimitListener(lis, cfg.RLS.Limits.MaxConns, refused), gs, hs, nil
}
