package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
)

// RateLimit-Policy names the limit closest to running out; a guarantee's carries its
// ceiling.
func TestRateLimitHeadersCeiling(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	setRateLimitHeaders(h, []admission.LimitState{
		{Account: "org", Unit: "tokens", Limit: 1000, Remaining: 900, Window: time.Minute, Reset: 6 * time.Second},
		{Account: "team", Unit: "tokens", Limit: 200, Remaining: 10, Window: time.Minute, Reset: 57 * time.Second, Ceiling: 500},
	})
	require.Equal(t, `"team-tokens";q=200;w=60;ceiling=500`, h.Get("RateLimit-Policy"))
	require.Equal(t, `"team-tokens";r=10;t=57`, h.Get("RateLimit"))

	h = http.Header{}
	setRateLimitHeaders(h, []admission.LimitState{{Account: "org", Unit: "tokens", Limit: 1000, Remaining: 1, Window: time.Minute}})
	require.Equal(t, `"org-tokens";q=1000;w=60`, h.Get("RateLimit-Policy"), "no ceiling, no parameter")
}
