package security_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// Finding 3: every number has a maximum, 10^15 (policy.MaxAmount).
func boundProbes() []probe {
	return []probe{
		{name: "F3-admit-units-bound", desc: "POST /v1/admit with units.tokens 2^53+1, 2^62, 2^63-1, 10^15+1: 400 invalid_units naming units.tokens; 10^15 is not a 400",
			run: admitUnitsBound},
		{name: "F3-check-units-bound", desc: "GET /v1/check with X-Estimated-Tokens: 2^62 is 400 invalid_units",
			run: checkUnitsBound},
		{name: "F3-quota-counter-integer", desc: "a counting-only quota (-1) of requests and tokens, charged 10^15 tokens: its Redis counters stay integer strings",
			run: quotaCounterInteger},
	}
}

func admitUnitsBound(p *P, s *stack) {
	org := s.id("units-bound")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	for _, n := range []string{"9007199254740993", "4611686018427387904", "9223372036854775807", "1000000000000001"} {
		a := postRaw(p, s.admit+"/v1/admit", serviceToken, fmt.Sprintf(`{"api_key":%q,"units":{"tokens":%s}}`, key, n))
		require.Equal(p, http.StatusBadRequest, a.status, "units.tokens %s: %s", n, a.body)
		require.Equal(p, "invalid_units", a.code(), "units.tokens %s: %s", n, a.body)
		require.Contains(p, a.message(), "units.tokens", "units.tokens %s: %s", n, a.body)
	}
	a := postRaw(p, s.admit+"/v1/admit", serviceToken, fmt.Sprintf(`{"api_key":%q,"units":{"tokens":%d}}`, key, policy.MaxAmount))
	require.NotEqual(p, http.StatusBadRequest, a.status, "units.tokens 10^15 is within the bound: %s", a.body)
	require.Less(p, a.status, 500, a.body)
}

func checkUnitsBound(p *P, s *stack) {
	org := s.id("check-bound")
	s.org(p, org, "pro", nil)
	key := s.apiKey(p, org)
	a := do(p, http.MethodGet, s.admit+"/v1/check", checkHeaders(key, [2]string{"X-Estimated-Tokens", "4611686018427387904"}), nil)
	require.Equal(p, http.StatusBadRequest, a.status, a.body)
	require.Equal(p, "invalid_units", a.code(), a.body)
}

func quotaCounterInteger(p *P, s *stack) {
	org := s.id("counting")
	uncapped := map[string]any{"quota": -1, "quota_period": "month"}
	s.org(p, org, "pro", map[string]any{"requests": uncapped, "tokens": uncapped})
	key := s.apiKey(p, org)
	var period string
	for _, tokens := range []int64{policy.MaxAmount, 7} {
		a := post(p, s.admit+"/v1/admit", serviceToken, map[string]any{"api_key": key, "units": map[string]any{"tokens": tokens}})
		require.Equal(p, http.StatusOK, a.status, "tokens %d: %s", tokens, a.body)
		period, _ = a.json["period"].(string)
	}
	require.NotEmpty(p, period, "the admission names its period")
	for _, unit := range []policy.Unit{policy.Requests, policy.Tokens} {
		k := s.keys.Quota(org, org, unit, period)
		v, err := s.rdb.Get(p.Context(), k).Result()
		require.NoError(p, err, "the counting-only quota's counter %s", k)
		_, err = strconv.ParseInt(v, 10, 64)
		require.NoError(p, err, "the counter %s holds %q, not an integer string", k, v)
	}
}

// reconcileVerify runs `reconcile verify` until it exits 0 (the pipeline drains: the meter
// writes what the relay sends) or a deadline passes.
func reconcileVerify(p *P, s *stack) {
	deadline := time.Now().Add(pick(45*time.Second, 2*time.Minute))
	for {
		code, out := s.reconcile(p, "verify")
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) > 12 {
				lines = lines[len(lines)-12:]
			}
			require.Failf(p, "reconcile verify", "exit %d:\n%s", code, strings.Join(lines, "\n"))
		}
		time.Sleep(2 * time.Second)
	}
}
