package security_test

import (
	"context"
	"net/http"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Finding 14: staff credentials. A staff token opens the admin API as far as its role
// allows and no further, dies with its revocation on every node, and never takes
// decisions.
func staffProbes() []probe {
	return []probe{
		{name: "F14-staff-viewer-writes", desc: "a viewer's staff token: POST /v1/admin/api-keys, PUT /v1/admin/accounts/{id}, POST /v1/admin/staff (an admin), DELETE /v1/admin/staff/{id} each 403 forbidden_role; no key, limit, member or audit row written; its reads answer 200",
			run: staffViewerWrites},
		{name: "F14-staff-revoked", desc: "a support member's token, revoked through DELETE /v1/admin/staff/{id}, is 401 on the next read and write, on both admit nodes",
			run: staffRevoked},
		{name: "F14-staff-not-service", desc: "an admin member's staff token on the service API (POST /v1/admit, /v1/estimate, /v1/outcomes, GET /v1/usage, /v1/balance, /v1/check, gRPC ShouldRateLimit): 401/403 (Unauthenticated/PermissionDenied) each",
			run: staffNotService},
	}
}

// member is a staff member made through the admin API, with its token.
type member struct{ id, token string }

// staff adds a staff member of role through POST /v1/admin/staff with the admin token.
func (s *stack) staff(p *P, name, role string) member {
	p.Helper()
	a := post(p, s.admit+"/v1/admin/staff", adminToken, map[string]any{"name": name + " " + s.run, "role": role})
	require.Equal(p, http.StatusCreated, a.status, "add staff %s: %s", name, a.body)
	id, _ := a.json["id"].(string)
	token, _ := a.json["token"].(string)
	require.True(p, strings.HasPrefix(token, "mgs_"), a.body)
	return member{id: id, token: token}
}

// send is a request with a staff token's Authorization header and a JSON body (nil: none).
func (m member) send(p *P, method, url, body string) answer {
	p.Helper()
	var raw []byte
	if body != "" {
		raw = []byte(body)
	}
	return do(p, method, url, [][2]string{bearer(m.token), {"Content-Type", "application/json"}}, raw)
}

// databaseURL is the stack's DATABASE_URL (the services' role, the stack's schema).
func (s *stack) databaseURL() string {
	for _, kv := range s.env {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			return v
		}
	}
	return ""
}

func staffViewerWrites(p *P, s *stack) {
	org := s.id("staff-viewer")
	s.org(p, org, "pro", map[string]any{"requests": map[string]any{"quota": 100}})
	viewer := s.staff(p, "viewer", "viewer")
	account := func() string {
		a := viewer.send(p, http.MethodGet, s.admit+"/v1/admin/accounts/"+org, "")
		require.Equal(p, http.StatusOK, a.status, "a viewer reads: %s", a.body)
		return a.body
	}
	was := account()

	escalated := "escalated " + s.run
	var let []string
	for _, w := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/admin/api-keys", `{"account":"` + org + `"}`},
		{http.MethodPut, "/v1/admin/accounts/" + org, `{"plan":"pro","limits":{"requests":{"quota":1000000}}}`},
		{http.MethodPost, "/v1/admin/staff", `{"name":"` + escalated + `","role":"admin"}`},
		{http.MethodDelete, "/v1/admin/staff/" + viewer.id, ""},
	} {
		a := viewer.send(p, w.method, s.admit+w.path, w.body)
		if a.status != http.StatusForbidden || a.code() != "forbidden_role" {
			let = append(let, w.method+" "+w.path+": "+a.String())
		}
	}
	none(p, let, "a viewer's writes not refused 403 forbidden_role")

	ctx, cancel := context.WithTimeout(p.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.databaseURL())
	require.NoError(p, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var keys, members, audited int
	require.NoError(p, conn.QueryRow(ctx, `select count(*) from api_keys where account = $1`, org).Scan(&keys))
	require.NoError(p, conn.QueryRow(ctx, `select count(*) from staff where name = $1 or (id = $2 and revoked_at is not null)`,
		escalated, viewer.id).Scan(&members))
	require.NoError(p, conn.QueryRow(ctx, `select count(*) from audit_log where actor = $1`, viewer.id).Scan(&audited))
	require.Zero(p, keys, "no API key written")
	require.Zero(p, members, "no member added or revoked")
	require.Zero(p, audited, "a refused call is no audit row")
	require.JSONEq(p, was, account(), "the account's limits unchanged")
}

func staffRevoked(p *P, s *stack) {
	org := s.id("staff-revoked")
	s.org(p, org, "pro", nil)
	support := s.staff(p, "support", "support")
	for _, base := range []string{s.admit, s.slow} {
		a := support.send(p, http.MethodGet, base+"/v1/admin/plans", "")
		require.Equal(p, http.StatusOK, a.status, "%s before the revocation: %s", base, a.body)
	}
	a := do(p, http.MethodDelete, s.admit+"/v1/admin/staff/"+support.id, [][2]string{bearer(adminToken)}, nil)
	require.Equal(p, http.StatusOK, a.status, "revoke: %s", a.body)
	require.NotEmpty(p, a.json["revoked_at"], a.body)

	var let []string
	for _, base := range []string{s.admit, s.slow} {
		for _, w := range []struct{ method, path, body string }{
			{http.MethodGet, "/v1/admin/plans", ""},
			{http.MethodPost, "/v1/admin/api-keys", `{"account":"` + org + `"}`},
		} {
			a := support.send(p, w.method, base+w.path, w.body)
			if a.status != http.StatusUnauthorized || a.code() != "unauthorized" {
				let = append(let, base+" "+w.method+" "+w.path+": "+a.String())
			}
		}
	}
	none(p, let, "a revoked staff token still answered")
}

func staffNotService(p *P, s *stack) {
	org := s.id("staff-service")
	s.org(p, org, "pro", nil)
	admin := s.staff(p, "admin", "admin")
	refused := func(status int) bool { return status == http.StatusUnauthorized || status == http.StatusForbidden }
	var let []string
	for _, w := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/admit", `{"account":"` + org + `","units":{"requests":1}}`},
		{http.MethodPost, "/v1/estimate", `{"account":"` + org + `","model":"gpt-4o","body":{"messages":[]}}`},
		{http.MethodPost, "/v1/outcomes", `{"event_id":"x","status":200}`},
		{http.MethodGet, "/v1/usage/" + org, ""},
		{http.MethodGet, "/v1/balance/" + org, ""},
	} {
		if a := admin.send(p, w.method, s.admit+w.path, w.body); !refused(a.status) {
			let = append(let, w.method+" "+w.path+": "+a.String())
		}
	}
	for _, h := range [][2]string{{"X-Metergate-Token", admin.token}, bearer(admin.token)} {
		a := do(p, http.MethodGet, s.admit+"/v1/check", [][2]string{h, {"X-Metergate-Account", org}}, nil)
		if !refused(a.status) {
			let = append(let, "GET /v1/check with "+h[0]+": "+a.String())
		}
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(p.Context(), "authorization", "Bearer "+admin.token), 10*time.Second)
	defer cancel()
	_, err := s.rls(p).c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: nil})
	if c := status.Code(err); c != codes.Unauthenticated && c != codes.PermissionDenied {
		let = append(let, "gRPC ShouldRateLimit: "+c.String())
	}
	none(p, let, "a staff token opened the service API")
}
