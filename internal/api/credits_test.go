package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

func (b *testBundle) grant(t *testing.T, account string, body any) reply {
	t.Helper()
	return b.call(t, "POST", "/v1/admin/accounts/"+account+"/grants", adminToken, body)
}

// written counts account's grants in PostgreSQL and the grants Redis holds of it.
func (b *testBundle) written(t *testing.T, account string) (rows, fields int) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM credit_grants WHERE account = $1`, account).Scan(&rows))
	for _, u := range policy.Units {
		n, err := b.rdb.HLen(ctx, b.keys.Grants(b.org, account, u)).Result()
		require.NoError(t, err)
		fields += int(n)
	}
	return rows, fields
}

// A grant through the admin API: 201, mirrored into Redis, the same grant (200) on a retry
// with its idempotency key, 422 with the key and other terms; the balance shows it; a void
// takes what remains (200, again on a retry); the effective policy names the unit.
func TestGrantAPI(t *testing.T) {
	t.Parallel()
	testenv.EachRedis(t, func(t *testing.T, rdb redis.UniversalClient) {
		b := setup(t, setupOpts{rdb: rdb, credits: true})
		ctx := testenv.Context(t, time.Minute)
		exp := time.Now().Add(30 * 24 * time.Hour).UTC().Truncate(time.Second)
		body := map[string]any{"unit": "credits", "amount": 1000, "expires_at": exp.Format(time.RFC3339), "priority": 5,
			"source": "purchase", "idempotency_key": "order-42"}
		r := b.grant(t, b.org, body)
		require.Equal(t, http.StatusCreated, r.Status, r.Raw)
		id, _ := r.Body["id"].(string)
		require.True(t, event.ValidGrantID(id), r.Raw)
		require.Equal(t, b.org, r.Body["org"])
		require.Equal(t, b.org, r.Body["account"])
		require.Equal(t, "credits", r.Body["unit"])
		require.InDelta(t, 1000, r.Body["amount"], 0)
		require.InDelta(t, 5, r.Body["priority"], 0)
		require.Equal(t, exp.Format(time.RFC3339), r.Body["expires_at"])
		require.Equal(t, "order-42", r.Body["idempotency_key"])
		require.NotContains(t, r.Body, "voided_at")
		require.Equal(t, "1000", rdb.HGet(ctx, b.keys.Grants(b.org, b.org, policy.Credits), id).Val())

		again := b.grant(t, b.org, body)
		require.Equal(t, http.StatusOK, again.Status, again.Raw)
		require.Equal(t, r.Body, again.Body)
		body["amount"] = 2000
		reused := b.grant(t, b.org, body)
		require.Equal(t, http.StatusUnprocessableEntity, reused.Status, reused.Raw)
		require.Equal(t, "idempotency_key_reused", reused.Body["error"].(map[string]any)["code"])
		rows, fields := b.written(t, b.org)
		require.Equal(t, []int{1, 1}, []int{rows, fields})

		// Defaults: effective now, no expiry, priority 0.
		r2 := b.grant(t, b.team, map[string]any{"unit": "tokens", "amount": 50, "source": "promotional"})
		require.Equal(t, http.StatusCreated, r2.Status, r2.Raw)
		require.InDelta(t, 0, r2.Body["priority"], 0)
		require.NotContains(t, r2.Body, "expires_at")
		eff, err := time.Parse(time.RFC3339Nano, r2.Body["effective_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now(), eff, 10*time.Second)

		// Admission drew 100; the balance, with the service token.
		require.NoError(t, rdb.HIncrBy(ctx, b.keys.Grants(b.org, b.org, policy.Credits), id, -100).Err())
		bal := b.call(t, "GET", "/v1/balance/"+b.org, serviceToken, nil)
		require.Equal(t, http.StatusOK, bal.Status, bal.Raw)
		credits := bal.Body["units"].(map[string]any)["credits"].(map[string]any)
		require.InDelta(t, 900, credits["balance"], 0)
		require.Equal(t, exp.Format(time.RFC3339), credits["next_expiry"])
		grants := credits["grants"].([]any)
		require.Len(t, grants, 1)
		g := grants[0].(map[string]any)
		require.Equal(t, id, g["id"])
		require.InDelta(t, 900, g["remaining"], 0)
		require.Equal(t, true, g["drawable"])
		require.InDelta(t, 1000, g["ledger"].(map[string]any)["remaining"], 0, "consumption reaches the ledger through the meter")
		require.NotContains(t, bal.Body["units"], "tokens", "the team's grant is the team's")

		// The effective policy names the units the org has grants of.
		deadline := time.Now().Add(5 * time.Second)
		for {
			res, err := b.cache.Resolve(b.org)
			if err == nil && len(res.Path[0].Credits) > 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "the org's grants never reached the cache")
			time.Sleep(5 * time.Millisecond)
		}
		acct := b.call(t, "GET", "/v1/admin/accounts/"+b.org, adminToken, nil)
		require.Equal(t, http.StatusOK, acct.Status, acct.Raw)
		path := acct.Body["effective"].(map[string]any)["path"].([]any)
		require.Equal(t, []any{"credits"}, path[0].(map[string]any)["credits"])

		// Void: what remains leaves the balance; again answers the same.
		v := b.call(t, "DELETE", "/v1/admin/accounts/"+b.org+"/grants/"+id, adminToken, nil)
		require.Equal(t, http.StatusOK, v.Status, v.Raw)
		require.InDelta(t, 900, v.Body["voided_units"], 0)
		require.NotEmpty(t, v.Body["voided_at"])
		v2 := b.call(t, "DELETE", "/v1/admin/accounts/"+b.org+"/grants/"+id, adminToken, nil)
		require.Equal(t, http.StatusOK, v2.Status, v2.Raw)
		require.Equal(t, v.Body, v2.Body)
		bal = b.call(t, "GET", "/v1/balance/"+b.org, serviceToken, nil)
		require.Equal(t, http.StatusOK, bal.Status, bal.Raw)
		credits = bal.Body["units"].(map[string]any)["credits"].(map[string]any)
		require.InDelta(t, 0, credits["balance"], 0)
		require.NotContains(t, credits, "next_expiry")
		require.InDelta(t, 1000, credits["ledger"].(map[string]any)["voided"], 0)
	})
}

// Every 400 of POST grants writes nothing, in PostgreSQL or Redis.
func TestGrantAPIRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credits: true})
	now := time.Now().UTC()
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	ok := func(change map[string]any) map[string]any {
		body := map[string]any{"unit": "credits", "amount": 10, "source": "purchase", "idempotency_key": "k-" + testenv.Random(4)}
		for k, v := range change {
			if v == nil {
				delete(body, k)
			} else {
				body[k] = v
			}
		}
		return body
	}
	for _, tc := range []struct {
		code string
		body any
	}{
		{"invalid_json", "{"},
		{"invalid_json", ""},
		{"unknown_field", ok(map[string]any{"colour": "red"})},
		{"invalid_unit", ok(map[string]any{"unit": nil})},
		{"unknown_unit", ok(map[string]any{"unit": "gold"})},
		{"invalid_field", ok(map[string]any{"unit": 5})},
		{"invalid_amount", ok(map[string]any{"amount": nil})},
		{"invalid_amount", ok(map[string]any{"amount": 0})},
		{"invalid_amount", ok(map[string]any{"amount": -3})},
		{"invalid_amount", ok(map[string]any{"amount": 1.5})},
		{"invalid_amount", `{"unit":"credits","amount":1.0,"source":"purchase"}`},
		{"invalid_amount", ok(map[string]any{"amount": "10"})},
		{"invalid_amount", ok(map[string]any{"amount": int64(credit.MaxAmount + 1)})},
		{"invalid_amount", `{"unit":"credits","amount":99999999999999999999,"source":"purchase"}`},
		{"invalid_effective_at", ok(map[string]any{"effective_at": "yesterday"})},
		{"invalid_expiry", ok(map[string]any{"expires_at": "2026-13-01T00:00:00Z"})},
		{"invalid_expiry", ok(map[string]any{"effective_at": at(2 * time.Hour), "expires_at": at(time.Hour)})},
		{"invalid_expiry", ok(map[string]any{"effective_at": at(time.Hour), "expires_at": at(time.Hour)})},
		{"invalid_expiry", ok(map[string]any{"effective_at": at(-2 * time.Hour), "expires_at": at(-time.Hour)})},
		{"invalid_priority", ok(map[string]any{"priority": -1})},
		{"invalid_priority", ok(map[string]any{"priority": 101})},
		{"invalid_priority", ok(map[string]any{"priority": 2.5})},
		{"invalid_source", ok(map[string]any{"source": nil})},
		{"invalid_source", ok(map[string]any{"source": "gift"})},
		{"invalid_idempotency_key", ok(map[string]any{"idempotency_key": "has space"})},
		{"invalid_idempotency_key", ok(map[string]any{"idempotency_key": strings.Repeat("k", 256)})},
	} {
		r := b.grant(t, b.org, tc.body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%v: %s", tc.body, r.Raw)
		require.Equal(t, tc.code, r.Body["error"].(map[string]any)["code"], "%v: %s", tc.body, r.Raw)
	}
	rows, fields := b.written(t, b.org)
	require.Zero(t, rows)
	require.Zero(t, fields)
}

// Unknown accounts and grants, and another account's grant, are 404; a malformed account
// id is 400 on the balance.
func TestGrantAPINotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credits: true})
	nobody := b.id("nobody")
	r := b.grant(t, nobody, map[string]any{"unit": "credits", "amount": 1, "source": "plan", "idempotency_key": "x"})
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	require.Equal(t, "not_found", r.Body["error"].(map[string]any)["code"])

	g := b.grant(t, b.team, map[string]any{"unit": "credits", "amount": 1, "source": "plan"})
	require.Equal(t, http.StatusCreated, g.Status, g.Raw)
	id := g.Body["id"].(string)
	for _, path := range []string{
		"/v1/admin/accounts/" + b.org + "/grants/" + id, // another account's
		"/v1/admin/accounts/" + nobody + "/grants/" + id,
		"/v1/admin/accounts/" + b.team + "/grants/gr_00000000000000000000000000000000",
		"/v1/admin/accounts/" + b.team + "/grants/not-a-grant",
	} {
		r := b.call(t, "DELETE", path, adminToken, nil)
		require.Equal(t, http.StatusNotFound, r.Status, "%s: %s", path, r.Raw)
	}
	r = b.call(t, "GET", "/v1/balance/"+nobody, serviceToken, nil)
	require.Equal(t, http.StatusNotFound, r.Status, r.Raw)
	r = b.call(t, "GET", "/v1/balance/-bad", serviceToken, nil)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Equal(t, "invalid_account", r.Body["error"].(map[string]any)["code"])

	// The grant was not voided by the 404s.
	bal := b.call(t, "GET", "/v1/balance/"+b.team, serviceToken, nil)
	require.Equal(t, http.StatusOK, bal.Status, bal.Raw)
	require.InDelta(t, 1, bal.Body["units"].(map[string]any)["credits"].(map[string]any)["balance"], 0)
	rows, _ := b.written(t, nobody)
	require.Zero(t, rows)
}

// The admin routes take the admin token, the balance the service token: 401 without one
// (or with an unknown one), 403 with the other API's; nothing is written or voided.
func TestGrantAPITokens(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{credits: true})
	g := b.grant(t, b.org, map[string]any{"unit": "requests", "amount": 10, "source": "purchase"})
	require.Equal(t, http.StatusCreated, g.Status, g.Raw)
	id := g.Body["id"].(string)
	body := map[string]any{"unit": "requests", "amount": 5, "source": "purchase"}
	for _, tc := range []struct {
		method, path string
		body         any
		right, other string
	}{
		{"POST", "/v1/admin/accounts/" + b.org + "/grants", body, adminToken, serviceToken},
		{"DELETE", "/v1/admin/accounts/" + b.org + "/grants/" + id, nil, adminToken, serviceToken},
		{"GET", "/v1/balance/" + b.org, nil, serviceToken, adminToken},
	} {
		for token, want := range map[string]int{"": 401, "wrong-token": 401, tc.other: 403} {
			r := b.call(t, tc.method, tc.path, token, tc.body)
			require.Equal(t, want, r.Status, "%s %s with %q: %s", tc.method, tc.path, token, r.Raw)
		}
	}
	rows, fields := b.written(t, b.org)
	require.Equal(t, []int{1, 1}, []int{rows, fields}, "only the first grant, not voided")
}
