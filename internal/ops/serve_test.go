package ops_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/ops"
)

// limits are short enough for a test, with a clear gap between the header deadline and the
// whole request's.
var limits = ops.HTTP{
	ReadHeaderTimeout: 300 * time.Millisecond,
	ReadTimeout:       2 * time.Second,
	WriteTimeout:      10 * time.Second,
	IdleTimeout:       500 * time.Millisecond,
	MaxHeaderBytes:    8 << 10,
	ShutdownTimeout:   5 * time.Second,
}

// serve runs ops.ServeListener with c on a loopback port until the test ends and returns
// the address. The handler reads the whole body (400 when it cannot), then waits for
// hold, if the request asks (?hold=1s), as a request waiting for capacity does.
func serve(t *testing.T, c ops.HTTP) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"body_unreadable"}`)
			return
		}
		if hold, err := time.ParseDuration(r.URL.Query().Get("hold")); err == nil {
			select {
			case <-time.After(hold):
			case <-r.Context().Done():
				return // no answer: the test sees the request cut
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ops.ServeListener(ctx, slog.New(slog.DiscardHandler), ln, c, h) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// closedWithin reads conn until the server closes it and returns how long that took from
// start and what the server sent; it fails the test if the server still holds it after
// limit.
func closedWithin(t *testing.T, conn net.Conn, start time.Time, limit time.Duration) (time.Duration, string) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(start.Add(limit)))
	got, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server still holds the connection after %s (got %q)", limit, got)
	}
	return time.Since(start), string(got)
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A client that sends its headers and 1 byte of a 50,000-byte body is cut at the read
// deadline: its handler sees a read error (400), and the connection is closed.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	conn := dial(t, serve(t, limits))
	start := time.Now()
	_, err := io.WriteString(conn, "POST /v1/admit HTTP/1.1\r\nHost: admit\r\nContent-Type: application/json\r\nContent-Length: 50000\r\n\r\n{")
	require.NoError(t, err)
	took, got := closedWithin(t, conn, start, limits.ReadTimeout+3*time.Second)
	t.Logf("cut after %s: %q", took, got)
	require.GreaterOrEqual(t, took, limits.ReadTimeout-100*time.Millisecond, "cut by the read deadline, not before")
	require.True(t, strings.HasPrefix(got, "HTTP/1.1 400"), "the handler answered its read error: %q", got)
}

// A client that sends its headers one line at a time, forever (slowloris), is cut at the
// header deadline, long before the whole request's.
func TestSlowHeadersAreCut(t *testing.T) {
	t.Parallel()
	conn := dial(t, serve(t, limits))
	start := time.Now()
	_, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: admit\r\n")
	require.NoError(t, err)
	closed := make(chan time.Duration, 1)
	go func() {
		_, _ = io.Copy(io.Discard, conn)
		closed <- time.Since(start)
	}()
	tick := time.NewTicker(50 * time.Millisecond) // the client's pace, not synchronisation
	defer tick.Stop()
	deadline := time.After(limits.ReadTimeout + 3*time.Second)
	for {
		select {
		case took := <-closed:
			t.Logf("slow headers cut after %s", took)
			require.Less(t, took, limits.ReadTimeout, "cut by the header deadline (%s)", limits.ReadHeaderTimeout)
			return
		case <-deadline:
			t.Fatal("the server still reads the headers")
		case <-tick.C:
			_, _ = io.WriteString(conn, "X-Slow: 1\r\n") // fails once the server has closed
		}
	}
}

// Headers past MaxHeaderBytes (and net/http's 4 KiB slack) are answered 431; within the
// limit they are served.
func TestHeadersOverTheLimit(t *testing.T) {
	t.Parallel()
	addr := serve(t, limits)
	for _, tc := range []struct {
		size int
		want int
	}{{limits.MaxHeaderBytes / 2, http.StatusOK}, {limits.MaxHeaderBytes + 5<<10, http.StatusRequestHeaderFieldsTooLarge}} {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		require.NoError(t, err)
		req.Header.Set("X-Big", strings.Repeat("a", tc.size))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, tc.want, resp.StatusCode, "a header of %d bytes", tc.size)
	}
}

// A kept-alive connection without a next request is closed after the idle deadline.
func TestIdleConnectionIsClosed(t *testing.T) {
	t.Parallel()
	conn := dial(t, serve(t, limits))
	_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: admit\r\n\r\n")
	require.NoError(t, err)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(start.Add(limits.IdleTimeout+3*time.Second)))
	_, err = r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "closed by the server, not by the test's deadline")
	took := time.Since(start)
	t.Logf("idle connection closed after %s", took)
	require.GreaterOrEqual(t, took, limits.IdleTimeout-100*time.Millisecond)
	require.Less(t, took, limits.ReadTimeout, "by the idle deadline (net/http falls back to the read deadline without one)")
}

// A request whose body is in may be held past the read deadline (a wait for capacity):
// the read deadline does not cut it, and its answer arrives.
func TestHeldRequestOutlivesTheReadDeadline(t *testing.T) {
	t.Parallel()
	addr := serve(t, limits)
	hold := limits.ReadTimeout + time.Second
	start := time.Now()
	resp, err := http.Post("http://"+addr+"/?hold="+hold.String(), "application/json", strings.NewReader(`{"units":{"requests":1}}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok", string(body))
	require.GreaterOrEqual(t, time.Since(start), hold)
}
