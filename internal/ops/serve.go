package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a Prometheus registry with the Go runtime and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// HTTP is an HTTP listener: its address, how long a client may take over each part of a
// request, how large its headers may be, and how long a graceful shutdown may take. Every
// field must be set (internal/config fills them): a zero timeout would let a slow client hold a
// connection forever.
type HTTP struct {
	Addr string
	// ReadHeaderTimeout bounds the request line and headers, from the first byte;
	// ReadTimeout the whole request, headers and body: a client sending 1 byte of a large
	// body is cut there.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	// WriteTimeout bounds the handler and the reply, from the end of the headers: it must
	// exceed the longest time a request may wait for capacity (admit's ADMIT_MAX_WAIT), or
	// a request allowed to wait would lose its answer.
	WriteTimeout time.Duration
	// IdleTimeout bounds a kept-alive connection between two requests.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers; past it the reply is 431.
	MaxHeaderBytes  int
	ShutdownTimeout time.Duration
}

// Server returns the http.Server of h with these limits, its errors logged to log.
func (c HTTP) Server(log *slog.Logger, h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// Serve listens on c.Addr and serves h there until ctx ends (ServeListener).
func Serve(ctx context.Context, log *slog.Logger, c HTTP, h http.Handler) error {
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", c.Addr, err)
	}
	return ServeListener(ctx, log, ln, c, h)
}

// ServeListener serves h on ln with c's limits until ctx ends, then shuts down gracefully
// within c.ShutdownTimeout: in-flight requests finish, new connections are refused. It
// closes ln.
func ServeListener(ctx context.Context, log *slog.Logger, ln net.Listener, c HTTP, h http.Handler) error {
	addr := ln.Addr().String()
	srv := c.Server(log, h)
	log.Info("http listening", "addr", addr)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown %s: %w", addr, err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", addr, err)
	}
	log.Info("http stopped", "addr", addr)
	return nil
}
