package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"
)

// ErrForbiddenTarget is returned for a delivery to an address the client may not reach:
// any address of the IANA special-purpose registries that is not globally reachable
// (loopback, private, shared, link-local, documentation, multicast, ...; the table is in
// address.go), unless Options.AllowPrivate.
var ErrForbiddenTarget = errors.New("webhook target address not allowed")

// Options configure a Client.
type Options struct {
	// AllowPrivate lets deliveries reach loopback, private and link-local addresses (tests,
	// private deployments). Off by default: a webhook URL is the customer's input.
	AllowPrivate bool
	// Timeout bounds one attempt, connection to the end of the reply (10s).
	Timeout time.Duration
	// MaxReply is the most of a reply body read (4 KiB); the rest is dropped.
	MaxReply int64
	// Resolver looks up the names of endpoints; nil is the system's (net.DefaultResolver).
	// Every address it gives is checked when dialed.
	Resolver *net.Resolver
}

// Client delivers to webhook endpoints.
type Client struct {
	http     *http.Client
	maxReply int64
}

// NewClient returns a client that checks every address it connects to (after DNS, so a
// name that resolves to a private address is refused too), follows no redirect and reads
// at most MaxReply of a reply.
func NewClient(o Options) *Client {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.MaxReply <= 0 {
		o.MaxReply = 4 << 10
	}
	dialer := &net.Dialer{Timeout: o.Timeout, Resolver: o.Resolver, Control: func(_, address string, _ syscall.RawConn) error {
		if o.AllowPrivate {
			return nil
		}
		return checkAddress(address)
	}}
	transport := &http.Transport{DialContext: dialer.DialContext, Proxy: nil, ForceAttemptHTTP2: true,
		MaxIdleConns: 100, IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: o.Timeout}
	return &Client{maxReply: o.MaxReply, http: &http.Client{Transport: transport, Timeout: o.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// Reply is what an endpoint answered to one attempt.
type Reply struct {
	Status  int
	Body    []byte // at most Options.MaxReply
	Latency time.Duration
}

// Post sends one attempt of a signed delivery: body with the headers of Sign. A 3xx is a
// reply like any other (not followed); a refused address is ErrForbiddenTarget.
func (c *Client) Post(ctx context.Context, url string, h http.Header, body []byte) (Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Reply{}, fmt.Errorf("webhook request: %w", err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("deliver webhook: %w", err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, c.maxReply))
	if err != nil {
		return Reply{}, fmt.Errorf("read webhook reply: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // let the connection be reused
	return Reply{Status: resp.StatusCode, Body: reply, Latency: time.Since(start)}, nil
}
