package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/go-redis/redis_rate/v10"
)

// maxBody matches admit's limit, so both sides read bodies of the same size.
const maxBody = 64 << 10

// NewHandler serves POST /v1/admit: one AllowN(key, limit, 1) per request. The body must be
// JSON (it is read and checked, as admit reads its body, but its content is ignored).
func NewHandler(limiter *redis_rate.Limiter, key string, limit redis_rate.Limit, log *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/admit", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil || !json.Valid(body) {
			reply(w, http.StatusBadRequest, map[string]any{"error": "invalid_json"})
			return
		}
		res, err := limiter.AllowN(r.Context(), key, limit, 1)
		if err != nil {
			log.Warn("allow", "err", err)
			reply(w, http.StatusServiceUnavailable, map[string]any{"error": "redis_unavailable"})
			return
		}
		if res.Allowed == 0 {
			reply(w, http.StatusTooManyRequests, map[string]any{
				"allowed": false, "retry_after_ms": res.RetryAfter.Milliseconds()})
			return
		}
		reply(w, http.StatusOK, map[string]any{"allowed": true, "remaining": res.Remaining})
	})
	return mux
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away: nothing to do
}
