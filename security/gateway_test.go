package security_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/metergate/metergate/internal/gatewaytest"
)

// Finding 5: the operator decides what a request is charged at a gateway, not the client.
// Finding 6: an end client sees its own account's id only.
func gatewayProbes() []probe {
	return []probe{
		{name: "F5-nginx-charge", desc: "through nginx, X-Estimated-Tokens: 0 / 999999 and X-Tool: image_generate are charged as a request without them",
			run: func(p *P, s *stack) { charge(p, s, s.nginx, "nginx") }},
		{name: "F5-caddy-charge", desc: "through Caddy, X-Estimated-Tokens: 0 / 999999 and X-Tool: image_generate are charged as a request without them",
			run: func(p *P, s *stack) { charge(p, s, s.caddy, "caddy") }},
		{name: "F6-nginx-account-ids", desc: "through nginx, a team's 402 and 429 name the level \"team\" but neither the org's nor the team's id, in body or headers",
			run: func(p *P, s *stack) { hiddenIDs(p, s, s.nginx+"/v1/chat", nil, true) }},
		{name: "F6-caddy-account-ids", desc: "through Caddy, a team's 402 and 429 name the level \"team\" but neither the org's nor the team's id, in body or headers",
			run: func(p *P, s *stack) { hiddenIDs(p, s, s.caddy+"/v1/chat", nil, true) }},
		{name: "F6-check-account-ids", desc: "GET /v1/check: a team's 402 and 429 name the level \"team\" but neither the org's nor the team's id, in body or headers",
			run: func(p *P, s *stack) {
				hiddenIDs(p, s, s.admit+"/v1/check", [][2]string{{"X-Metergate-Token", serviceToken}}, false)
			}},
		{name: "F6-grpc-account-ids", desc: "ShouldRateLimit: a team's refusal names the level \"team\" but neither the org's nor the team's id anywhere in the response",
			run: grpcHiddenIDs},
	}
}

// charge sends requests through a gateway with and without the headers a client might
// add to change what it is charged, and compares what each charged (GET /v1/usage of the
// org, quotas of requests, tokens and credits).
func charge(p *P, s *stack, gw, name string) {
	org := s.id("charge-" + name)
	big := map[string]any{"quota": 1_000_000_000_000, "quota_period": "month"}
	s.org(p, org, "pro", map[string]any{"tokens": big, "credits": big})
	key := s.apiKey(p, org)

	used := func() map[string]int64 {
		a := do(p, http.MethodGet, s.admit+"/v1/usage/"+org, [][2]string{bearer(serviceToken)}, nil)
		require.Equal(p, http.StatusOK, a.status, a.body)
		units, _ := a.json["units"].(map[string]any)
		out := map[string]int64{}
		for _, u := range []string{"requests", "tokens", "credits"} {
			m, _ := units[u].(map[string]any)
			v, _ := m["used"].(float64)
			out[u] = int64(v)
		}
		return out
	}
	charged := func(extra ...[2]string) map[string]int64 {
		before := used()
		a := do(p, http.MethodGet, gw+"/v1/chat", append([][2]string{{"X-Api-Key", key}}, extra...), nil)
		require.Equal(p, http.StatusOK, a.status, "through %s with %v: %s", name, extra, a.body)
		require.Equal(p, gatewaytest.Reply, a.body)
		after := used()
		d := map[string]int64{}
		for u, v := range after {
			d[u] = v - before[u]
		}
		return d
	}
	plain := charged()
	require.Equal(p, int64(1), plain["requests"], "a plain request is charged one request: %v", plain)
	var differ []string
	for _, h := range [][2]string{{"X-Estimated-Tokens", "0"}, {"X-Estimated-Tokens", "999999"}, {"X-Tool", "image_generate"}} {
		if got := charged(h); fmt.Sprint(got) != fmt.Sprint(plain) {
			differ = append(differ, fmt.Sprintf("%s: %s charged %v", h[0], h[1], got))
		}
	}
	none(p, differ, "the client changed its charge (a request without these headers is charged %v)", plain)
}

// secretTrees are the account trees of finding 6: org → team → user, the API key on the
// user, and a team limit that refuses: a requests quota of 0 (402) in one, a bucket of one
// request a very long while (429 after the first) in the other.
type secretTrees struct {
	once     sync.Once
	quotaKey string
	rateKey  string
	hidden   []string // the ids no answer may contain
}

func (s *stack) secretTrees(p *P) *secretTrees {
	p.Helper()
	st := &s.secrets
	st.once.Do(func() {
		mk := func(n, teamLimits string) string {
			org, team, user := "secretorg"+n+"x"+s.run, "secretteam"+n+"x"+s.run, "user"+n+"x"+s.run
			st.hidden = append(st.hidden, org, team)
			s.org(p, org, "pro", nil)
			var limits map[string]any
			if teamLimits == "quota" {
				limits = map[string]any{"requests": map[string]any{"quota": 0, "quota_period": "month"}}
			} else {
				limits = map[string]any{"requests": map[string]any{"rate_per_s": 0.001, "burst": 1}}
			}
			s.account(p, map[string]any{"id": team, "kind": "team", "parent": org, "limits": limits})
			s.account(p, map[string]any{"id": user, "kind": "user", "parent": team})
			return s.apiKey(p, user)
		}
		st.quotaKey, st.rateKey = mk("7", "quota"), mk("8", "rate")
	})
	require.NotEmpty(p, st.quotaKey, "the account trees of finding 6 were not made (see the first probe that made them)")
	require.NotEmpty(p, st.rateKey, "the account trees of finding 6 were not made")
	return st
}

// leaks lists the hidden ids an answer (its whole text) contains.
func (st *secretTrees) leaks(text string) []string {
	var out []string
	for _, id := range st.hidden {
		if strings.Contains(text, id) {
			out = append(out, id)
		}
	}
	return out
}

// hiddenIDs sends the two trees' requests to url (a gateway, or the check with extra
// headers) until each is refused, and looks for the org's and team's ids in the refusals,
// and with all in every answer (a gateway's 200 goes to the client too; the check's and
// its event id, which names the org, go to the app).
func hiddenIDs(p *P, s *stack, url string, extra [][2]string, all bool) {
	st := s.secretTrees(p)
	var leaked []string
	refusals := map[int]string{}
	for _, key := range []string{st.quotaKey, st.rateKey} {
		for range 3 { // the rate tree passes its first request (whoever sends it)
			a := do(p, http.MethodGet, url, append([][2]string{{"X-Api-Key", key}}, extra...), nil)
			if l := st.leaks(a.String()); len(l) > 0 && (all || a.status != http.StatusOK) {
				leaked = append(leaked, fmt.Sprintf("%d answer contains %v:\n%s", a.status, l, a))
			}
			if a.status == http.StatusPaymentRequired || a.status == http.StatusTooManyRequests {
				refusals[a.status] = a.body
				break
			}
			require.Equal(p, http.StatusOK, a.status, a.String())
		}
	}
	none(p, leaked, "an end client saw account ids not its own")
	require.Contains(p, refusals, http.StatusPaymentRequired, "the team's quota of 0 refuses")
	require.Contains(p, refusals, http.StatusTooManyRequests, "the team's bucket of 1 refuses")
	for status, body := range refusals {
		require.Contains(p, body, `"team"`, "the %d names the level that refused", status)
	}
}

func grpcHiddenIDs(p *P, s *stack) {
	st := s.secretTrees(p)
	r := s.rls(p)
	var leaked []string
	refused := 0
	for _, key := range []string{st.quotaKey, st.rateKey} {
		for range 3 {
			resp, err := r.call(p, descriptor("api_key", key))
			require.NoError(p, err)
			text := protojson.Format(resp)
			// An OK's request headers name the event (and so the org) to the app only.
			if l := st.leaks(text); len(l) > 0 && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				leaked = append(leaked, fmt.Sprintf("%s contains %v:\n%s", resp.GetOverallCode(), l, text))
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
				require.Contains(p, string(resp.GetRawBody()), `"team"`, "the refusal names the level: %s", text)
				refused++
				break
			}
		}
	}
	none(p, leaked, "an end client saw account ids not its own")
	require.Equal(p, 2, refused, "both trees' teams refuse")
}
