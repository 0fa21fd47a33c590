package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// testRedis returns a client for REDIS_URL; it skips without one (fails instead under
// METERGATE_REQUIRE_SERVICES=1, as make test sets).
func testRedis(t *testing.T) *redis.Client {
	t.Helper()
	url := os.Getenv("REDIS_URL")
	if url == "" {
		if os.Getenv("METERGATE_REQUIRE_SERVICES") == "1" {
			t.Fatal("REDIS_URL is unset")
		}
		t.Skip("REDIS_URL is unset: run `make up && . .run/env` in the repository root")
	}
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Ping(context.Background()).Err())
	return rdb
}

func TestAdmitAllowsThenDenies(t *testing.T) {
	t.Parallel()
	rdb := testRedis(t)
	// A key of our own (redis_rate prefixes it with "rate:"), and a limit of one a minute so
	// the second request cannot pass however slow the machine is.
	key := fmt.Sprintf("bench-test:%s:%d", t.Name(), time.Now().UnixNano())
	t.Cleanup(func() { _ = rdb.Del(context.Background(), "rate:"+key).Err() })
	h := NewHandler(redis_rate.NewLimiter(rdb), key, redis_rate.PerMinute(1), slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	post := func(body string) (int, map[string]any) {
		t.Helper()
		resp, err := srv.Client().Post(srv.URL+"/v1/admit", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var got map[string]any
		require.NoError(t, json.Unmarshal(raw, &got), string(raw))
		return resp.StatusCode, got
	}

	status, got := post(`{"account":"a","units":{"requests":1}}`)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, true, got["allowed"])

	status, got = post(`{"account":"a","units":{"requests":1}}`)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, false, got["allowed"])
	require.Greater(t, got["retry_after_ms"], 0.0)

	status, _ = post(`not json`)
	require.Equal(t, http.StatusBadRequest, status)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := loadConfig([]string{"-rate", "0", "-key", "", "-redis-url", "http://x"})
	require.ErrorContains(t, err, "REDISRATE_RATE")
	require.ErrorContains(t, err, "REDISRATE_KEY")
	require.ErrorContains(t, err, "REDIS_URL")
}
