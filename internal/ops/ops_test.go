package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/ops"
)

func get(_ *testing.T, h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestProbes(t *testing.T) {
	var p ops.Probes
	failing := errors.New("connection refused")
	var redisErr error
	p.Add("redis", func(context.Context) error { return redisErr })
	p.Add("postgres", func(context.Context) error { return nil })
	mux := http.NewServeMux()
	p.Mount(mux, ops.NewRegistry())

	code, _ := get(t, mux, "/healthz")
	require.Equal(t, 200, code)

	code, body := get(t, mux, "/readyz")
	require.Equal(t, 200, code, body)

	redisErr = failing
	code, body = get(t, mux, "/readyz")
	require.Equal(t, 503, code)
	var got struct {
		Status string `json:"status"`
		Checks []struct {
			Name  string `json:"name"`
			OK    bool   `json:"ok"`
			Error string `json:"error"`
		} `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &got))
	require.Equal(t, "not ready", got.Status)
	require.Len(t, got.Checks, 2)
	require.Equal(t, "postgres", got.Checks[0].Name)
	require.True(t, got.Checks[0].OK)
	require.Equal(t, "redis", got.Checks[1].Name)
	require.Equal(t, "connection refused", got.Checks[1].Error)

	code, body = get(t, mux, "/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, "go_goroutines")
	require.Contains(t, body, "process_")
}

func TestReadyTimesOut(t *testing.T) {
	p := ops.Probes{Timeout: 10_000_000} // 10ms
	p.Add("slow", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	res := p.Run(context.Background())
	require.Contains(t, res["slow"], "deadline")
}

// A degraded check that fails is reported but leaves the binary ready; a critical one
// that fails makes it unready whatever the degraded ones say.
func TestDegradedCheck(t *testing.T) {
	var p ops.Probes
	var redisErr, pgErr error
	p.AddDegraded("redis", func(context.Context) error { return redisErr })
	p.Add("postgres", func(context.Context) error { return pgErr })
	mux := http.NewServeMux()
	p.Mount(mux, ops.NewRegistry())

	redisErr = errors.New("connection refused")
	code, body := get(t, mux, "/readyz")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"status":"degraded"`)
	require.Contains(t, body, `"name":"redis","ok":false,"error":"connection refused","degraded":true`)

	pgErr = errors.New("down")
	code, body = get(t, mux, "/readyz")
	require.Equal(t, 503, code, body)
	require.Contains(t, body, `"status":"not ready"`)

	redisErr, pgErr = nil, nil
	code, body = get(t, mux, "/readyz")
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"status":"ready"`)
}
