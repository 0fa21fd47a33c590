package security_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/require"
)

// Finding 4: every listener has read and idle deadlines: slow clients are cut, a request
// allowed to wait is still answered.
func slowProbes() []probe {
	return []probe{
		{name: "F4-slow-body", serial: true, desc: fmt.Sprintf("30 connections send a POST /v1/admit's headers (Content-Length 50000) and 1 byte of body: all closed by admit within the read timeout (%s) + 3 s", readTimeout),
			run: slowBody},
		{name: "F4-slow-headers", serial: true, desc: fmt.Sprintf("30 connections send their headers one byte a second: all closed by admit within the read timeout (%s) + 3 s", readTimeout),
			run: slowHeaders},
		{name: "F4-long-wait", serial: true, desc: fmt.Sprintf("a request with max_wait_ms longer than the read timeout (%s) is still answered, 200 after waiting", readTimeout),
			run: longWait},
	}
}

// slowMargin is how long past the read timeout a slow client's connection may stay open.
const slowMargin = 3 * time.Second

// slowClients opens 30 connections to the slow-client admit, each sending first at once and
// then trickle one byte a second (nothing when empty), and requires every one closed by
// admit (EOF or a reset, after whatever it answers) within readTimeout + slowMargin.
func slowClients(p *P, s *stack, first, trickle string) {
	const n = 30
	addr := strings.TrimPrefix(s.slow, "http://")
	limit := readTimeout + slowMargin
	type closed struct {
		after time.Duration
		err   error // nil: closed by admit
	}
	results := make(chan closed, n)
	var wg sync.WaitGroup
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(p, err)
		p.Cleanup(func() { _ = c.Close() })
		begin := time.Now()
		_, err = io.WriteString(c, first)
		require.NoError(p, err)
		done := make(chan struct{})
		wg.Go(func() { // the trickle, until admit closes the connection or the probe ends
			for i := 0; i < len(trickle); i++ {
				select {
				case <-done:
					return
				case <-time.After(time.Second):
				}
				if _, err := c.Write([]byte{trickle[i]}); err != nil {
					return
				}
			}
		})
		wg.Go(func() {
			defer close(done)
			_ = c.SetReadDeadline(begin.Add(limit))
			_, err := io.Copy(io.Discard, c) // what admit answers, up to its close
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
				results <- closed{after: time.Since(begin), err: fmt.Errorf("still open after %s", limit)}
				return
			}
			results <- closed{after: time.Since(begin)} // EOF (nil from Copy) or a reset
		})
	}
	wg.Wait()
	close(results)
	open, slowest := 0, time.Duration(0)
	for r := range results {
		if r.err != nil {
			open++
		}
		slowest = max(slowest, r.after)
	}
	p.Logf("%d slow connections: %d still open after %s; the last closed after %s", n, open, limit, slowest.Round(time.Millisecond))
	require.Zero(p, open, "of %d slow connections, %d were still open %s after they started", n, open, limit)
}

func slowBody(p *P, s *stack) {
	head := fmt.Sprintf("POST /v1/admit HTTP/1.1\r\nHost: admit\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 50000\r\n\r\n{", serviceToken)
	slowClients(p, s, head, "")
}

func slowHeaders(p *P, s *stack) {
	slowClients(p, s, "POST /v1/admit HTTP/1.1\r\n", "Host: admit\r\nX-Slow: "+strings.Repeat("a", 60))
}

func longWait(p *P, s *stack) {
	org := s.id("long-wait")
	// One request per 4 s: the second waits about 4 s for its token.
	s.org(p, org, "pro", map[string]any{"requests": map[string]any{"rate_per_s": 0.25, "burst": 1}})
	key := s.apiKey(p, org)
	first := post(p, s.slow+"/v1/admit", serviceToken, map[string]any{"api_key": key, "units": map[string]any{"requests": 1}})
	require.Equal(p, http.StatusOK, first.status, first.body)
	begin := time.Now()
	a := post(p, s.slow+"/v1/admit", serviceToken, map[string]any{"api_key": key, "units": map[string]any{"requests": 1}, "max_wait_ms": 8000})
	took := time.Since(begin)
	require.Equal(p, http.StatusOK, a.status, "after %s: %s", took, a.body)
	waited, _ := a.json["waited_ms"].(float64)
	require.Greater(p, waited, float64(readTimeout.Milliseconds()), "the request waited past the read timeout: %s", a.body)
}
