// Package client calls admit from Go services, and wraps an http.Handler so that every
// request is admitted first: denials are forwarded with their headers, and the handler's
// status is reported back as the request's outcome.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Client calls one admit service.
type Client struct {
	// BaseURL of admit, e.g. "http://127.0.0.1:8080".
	BaseURL string
	// Token is the service token (ADMIT_SERVICE_TOKEN).
	Token string
	// HTTP is the client used; http.DefaultClient when nil.
	HTTP *http.Client
	// MaxWait enables the "queue" burst policy: a request denied by a rate limit whose
	// retry_after_ms fits in what is left of MaxWait waits and is retried (with the same
	// idempotency key, so it is charged once). Zero rejects at once.
	MaxWait time.Duration
	// Log receives outcome-reporting failures; slog.Default when nil.
	Log *slog.Logger
}

// Request is what to admit.
type Request struct {
	APIKey         string           `json:"api_key,omitempty"`
	Account        string           `json:"account,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	Units          map[string]int64 `json:"units,omitempty"`
	Tool           string           `json:"tool,omitempty"`
	// Estimate, instead of Units["tokens"], has admit charge the estimated tokens of the
	// model request.
	Estimate *EstimateRequest `json:"estimate,omitempty"`
	// MaxWait lets a request refused by a rate limit or concurrency cap wait for capacity
	// in admit, in that limit's queue (max_wait_ms, at most admit's ADMIT_MAX_WAIT; whole
	// milliseconds). Admit sends at most what is left before ctx's deadline and the HTTP
	// client's Timeout, less waitMargin, so the 429 arrives before the caller gives up.
	// Client.MaxWait's retries, if any, come after this wait (Admit).
	MaxWait time.Duration `json:"-"`
}

// admitBody is a Request as POST /v1/admit takes it.
type admitBody struct {
	Request
	MaxWaitMS int64 `json:"max_wait_ms,omitempty"`
}

// waitMargin is the time left for admit's answer after a wait: its last decision and the
// round trip.
const waitMargin = 250 * time.Millisecond

// EstimateRequest is a model request whose tokens admit estimates: an OpenAI
// chat-completions or Anthropic messages body, as sent to the provider.
type EstimateRequest struct {
	// Model picks the encoding; the body's model when empty.
	Model string `json:"model,omitempty"`
	// Provider is "openai" or "anthropic"; inferred from the model and body when empty.
	Provider string          `json:"provider,omitempty"`
	Request  json.RawMessage `json:"request"`
}

// Estimate is admit's token estimate of a model request.
type Estimate struct {
	Model        string `json:"model"`
	Provider     string `json:"provider"`
	Method       string `json:"method"` // o200k_base, cl100k_base or chars/3.5
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	TotalTokens  int64  `json:"total_tokens"`
	OutputFrom   string `json:"output_from"` // max_tokens, max_completion_tokens or default
	Breakdown    struct {
		Text       int64 `json:"text"`
		Overhead   int64 `json:"overhead"`
		Images     int64 `json:"images"`
		ImageCount int64 `json:"image_count"`
	} `json:"breakdown"`
}

// Blocker names the limit that denied a request.
type Blocker struct {
	Account string `json:"account"`
	Level   string `json:"level"`
	Unit    string `json:"unit"`
}

// Decision is admit's answer.
type Decision struct {
	Status       int      `json:"-"`
	Decision     string   `json:"decision"`
	EventID      string   `json:"event_id"`
	Account      string   `json:"account"`
	Org          string   `json:"org"`
	Period       string   `json:"period"`
	Replayed     bool     `json:"replayed"`
	BlockedBy    *Blocker `json:"blocked_by"`
	RetryAfterMS *int64   `json:"retry_after_ms"`
	// Estimated is what was charged as tokens when the request sent an Estimate.
	Estimated *Estimate `json:"estimated"`
	// WaitedMS is how long admit held the request for capacity (its last attempt's), when
	// it had a MaxWait.
	WaitedMS *int64 `json:"waited_ms"`
	// Balances are the credit balances an allowed request drew from, after the draw.
	Balances []Balance `json:"balances"`
	// Balance is, for "insufficient_balance" (402), what the blocking account's grants of
	// the unit hold.
	Balance *int64 `json:"balance"`
	// Header holds the reply's RateLimit, RateLimit-Policy and Retry-After fields.
	Header http.Header `json:"-"`
	// Body is the raw reply.
	Body []byte `json:"-"`
}

// Balance is a credit balance of an account and unit.
type Balance struct {
	Account string `json:"account"`
	Unit    string `json:"unit"`
	Balance int64  `json:"balance"`
}

// Allowed reports whether the request may proceed.
func (d Decision) Allowed() bool { return d.Status == http.StatusOK }

// APIError is a reply other than a decision (400, 401, 403, 422, 503, ...).
type APIError struct {
	Status  int
	Code    string
	Message string
	Header  http.Header
	Body    []byte
}

func (e *APIError) Error() string {
	return fmt.Sprintf("admit: %d %s: %s", e.Status, e.Code, e.Message)
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *Client) log() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

func (c *Client) post(ctx context.Context, path string, body any) (*http.Response, []byte, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, nil, fmt.Errorf("encode %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.BaseURL, "/")+path, bytes.NewReader(raw))
	if err != nil {
		return nil, nil, fmt.Errorf("build %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("call %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("read %s reply: %w", path, err)
	}
	return resp, b, nil
}

// Admit asks for a decision. 200, 429 and 402 are decisions; anything else is an *APIError.
// With r.MaxWait, a rate-limited request first waits in admit for up to r.MaxWait; with
// c.MaxWait, a 429 (after that wait, if any) is retried while c.MaxWait allows. Both count
// from the call.
func (c *Client) Admit(ctx context.Context, r Request) (Decision, error) {
	if c.MaxWait > 0 && r.IdempotencyKey == "" {
		r.IdempotencyKey = newKey() // so a retry is charged once
	}
	start := time.Now()
	deadline := start.Add(c.MaxWait)
	for {
		d, err := c.admitOnce(ctx, admitBody{Request: r, MaxWaitMS: c.serverWait(ctx, start.Add(r.MaxWait))})
		if err != nil || d.Status != http.StatusTooManyRequests || d.RetryAfterMS == nil || *d.RetryAfterMS < 0 {
			return d, err
		}
		wait := max(time.Duration(*d.RetryAfterMS)*time.Millisecond, minWait)
		if c.MaxWait <= 0 || time.Now().Add(wait).After(deadline) {
			return d, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
			return d, nil // the caller cannot wait that long: the 429 is the answer
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return d, ctx.Err()
		case <-t.C:
		}
	}
}

// minWait keeps a retry loop from spinning on a retry_after_ms of 0.
const minWait = 5 * time.Millisecond

// serverWait is an attempt's max_wait_ms: what is left until until, ending waitMargin
// before ctx's deadline and the HTTP client's Timeout.
func (c *Client) serverWait(ctx context.Context, until time.Time) int64 {
	now := time.Now()
	if dl, ok := ctx.Deadline(); ok && dl.Add(-waitMargin).Before(until) {
		until = dl.Add(-waitMargin)
	}
	if t := c.http().Timeout; t > 0 && now.Add(t-waitMargin).Before(until) {
		until = now.Add(t - waitMargin)
	}
	return max(0, until.Sub(now).Milliseconds())
}

func (c *Client) admitOnce(ctx context.Context, r admitBody) (Decision, error) {
	resp, body, err := c.post(ctx, "/v1/admit", r)
	if err != nil {
		return Decision{}, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests, http.StatusPaymentRequired:
		d := Decision{Status: resp.StatusCode, Header: resp.Header, Body: body}
		if err := json.Unmarshal(body, &d); err != nil {
			return Decision{}, fmt.Errorf("decode admit reply: %w", err)
		}
		return d, nil
	}
	return Decision{}, apiError(resp, body)
}

func apiError(resp *http.Response, body []byte) error {
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.Unmarshal(body, &e) // a non-JSON reply keeps the status alone
	return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Header: resp.Header, Body: body}
}

// Estimate asks admit for the tokens of a model request, charging nothing.
func (c *Client) Estimate(ctx context.Context, r EstimateRequest) (Estimate, error) {
	resp, body, err := c.post(ctx, "/v1/estimate", r)
	if err != nil {
		return Estimate{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Estimate{}, apiError(resp, body)
	}
	var e Estimate
	if err := json.Unmarshal(body, &e); err != nil {
		return Estimate{}, fmt.Errorf("decode estimate reply: %w", err)
	}
	return e, nil
}

// Outcome reports how an admitted request ended upstream (its HTTP status and, optionally,
// the units it really used, e.g. tokens).
func (c *Client) Outcome(ctx context.Context, eventID string, status int, units map[string]int64) error {
	resp, body, err := c.post(ctx, "/v1/outcomes", map[string]any{"event_id": eventID, "status": status, "units": units})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusAccepted {
		return apiError(resp, body)
	}
	return nil
}

func newKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails
	return "mgc-" + hex.EncodeToString(b)
}

// Identify tells the middleware what to admit for an incoming request (the caller's API
// key, the estimated tokens, the tool). An error answers 400 with its text.
type Identify func(*http.Request) (Request, error)

// Middleware admits every request before next serves it: a 429 or 402 is forwarded with
// admit's body, RateLimit fields and Retry-After; an allowed request runs, and its status is
// reported to admit as the outcome (in the background, so it adds no latency). A replay of
// an idempotency key that identify took from the client (admitted and served before) is
// 409 idempotency_key_replayed, never served again: it would be served unbilled. When admit
// cannot be reached the request gets 503, unless failOpen.
func (c *Client) Middleware(identify Identify, failOpen bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, err := identify(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			d, err := c.Admit(r.Context(), req)
			var apiErr *APIError
			switch {
			case errors.As(err, &apiErr):
				copyHeaders(w.Header(), apiErr.Header)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(apiErr.Status)
				_, _ = w.Write(apiErr.Body)
				return
			case d.Status != 0 && !d.Allowed():
				// A denial, also when the caller's context ended while queueing after it.
				copyHeaders(w.Header(), d.Header)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(d.Status)
				_, _ = w.Write(d.Body)
				return
			case err != nil && failOpen && r.Context().Err() == nil:
				c.log().Warn("admit unreachable: serving fail-open", "err", err)
				next.ServeHTTP(w, r)
				return
			case err != nil:
				w.Header().Set("Retry-After", "1")
				http.Error(w, "admission unavailable", http.StatusServiceUnavailable)
				return
			case d.Replayed:
				w.Header().Set("Idempotent-Replayed", "true")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				_, _ = w.Write([]byte(`{"error":{"code":"idempotency_key_replayed","message":"a request with this idempotency key was admitted and served already"}}` + "\n"))
				return
			}
			copyHeaders(w.Header(), d.Header)
			rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
			defer func() {
				status := rec.status
				if v := recover(); v != nil {
					status = http.StatusInternalServerError
					defer panic(v)
				}
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if err := c.Outcome(ctx, d.EventID, status, nil); err != nil {
						c.log().Warn("report outcome", "event_id", d.EventID, "status", status, "err", err)
					}
				}()
			}()
			next.ServeHTTP(rec, r)
		})
	}
}

func copyHeaders(dst, src http.Header) {
	for _, k := range []string{"Ratelimit", "Ratelimit-Policy", "Retry-After"} {
		if v := src.Get(k); v != "" {
			dst.Set(k, v)
		}
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status  int
	written bool
}

func (s *statusRecorder) WriteHeader(code int) {
	// Informational replies (103 Early Hints) come before the real status.
	if !s.written && (code >= 200 || code == http.StatusSwitchingProtocols) {
		s.status, s.written = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.written = true
	return s.ResponseWriter.Write(b)
}

// Flush passes through to the underlying writer, so streaming handlers that assert
// http.Flusher keep working.
func (s *statusRecorder) Flush() {
	s.written = true
	_ = http.NewResponseController(s.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush, deadlines).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
