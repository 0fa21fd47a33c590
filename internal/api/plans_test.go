package api_test

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/testenv"
)

// planRank is a rank no other plan of the package schema has (they share the plans), far
// above the seeds' so the smallest plan stays free.
func planRank() int { return 1_000_000 + rand.IntN(1<<30) }

// examplePrice is the price of docs/api.md.
func examplePrice() map[string]any {
	return map[string]any{"currency": "EUR", "base_fee_minor": 4900, "units": map[string]any{
		"tokens": map[string]any{"included": 10_000_000, "tiers": []any{
			map[string]any{"from": 10_000_000, "up_to": 100_000_000, "price_minor": 2, "per_units": 1000},
			map[string]any{"from": 100_000_000, "price_minor": 1, "per_units": 1000},
		}},
	}}
}

func TestPlans(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id, rank := b.id("gold"), planRank()
	create := map[string]any{"id": id, "rank": rank, "concurrency": 3, "priority": 70,
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 50, "burst": 100, "quota": 1_000_000, "quota_period": "month"}},
		"price":  examplePrice()}
	r := b.call(t, "POST", "/v1/admin/plans", adminToken, create)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, id, r.Body["id"])
	require.EqualValues(t, rank, r.Body["rank"])
	require.EqualValues(t, 70, r.Body["priority"])
	require.EqualValues(t, 1, r.Body["current_price_version"])
	prices := r.Body["prices"].([]any)
	require.Len(t, prices, 1)
	v1 := prices[0].(map[string]any)
	require.EqualValues(t, 1, v1["version"])
	require.NotContains(t, v1, "effective_period", "a first price applies from the start")
	require.EqualValues(t, 4900, v1["base_fee_minor"])
	tokens := v1["units"].(map[string]any)["tokens"].(map[string]any)
	require.EqualValues(t, 10_000_000, tokens["included"])
	require.Len(t, tokens["tiers"], 2)
	require.NotContains(t, tokens["tiers"].([]any)[1], "up_to", "the last tier has no end")

	got := b.call(t, "GET", "/v1/admin/plans/"+id, adminToken, nil)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, r.Body, got.Body)
	require.Equal(t, http.StatusConflict, b.call(t, "POST", "/v1/admin/plans", adminToken, create).Status)
	require.Equal(t, http.StatusNotFound, b.call(t, "GET", "/v1/admin/plans/"+b.id("none"), adminToken, nil).Status)

	list := b.call(t, "GET", "/v1/admin/plans", adminToken, nil)
	require.Equal(t, http.StatusOK, list.Status, list.Raw)
	plans := list.Body["plans"].([]any)
	require.Equal(t, "free", plans[0].(map[string]any)["id"], "smallest first")
	found := false
	for i, p := range plans {
		if i > 0 {
			require.Greater(t, p.(map[string]any)["rank"], plans[i-1].(map[string]any)["rank"])
		}
		found = found || p.(map[string]any)["id"] == id
	}
	require.True(t, found)

	// An org on the plan; a PUT changes its limits on every admit node within a second and
	// adds a price version for a future month.
	org := b.id("acme")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": id})
	b.waitResolvable(t, org)
	price := examplePrice()
	price["base_fee_minor"], price["effective_period"] = 5900, "2099-01"
	update := map[string]any{"rank": rank, "priority": 80,
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 500, "burst": 1000}}, "price": price}
	r = b.call(t, "PUT", "/v1/admin/plans/"+id, adminToken, update)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	written := time.Now()
	prices = r.Body["prices"].([]any)
	require.Len(t, prices, 2)
	require.Equal(t, "2099-01", prices[1].(map[string]any)["effective_period"])
	require.EqualValues(t, 4900, prices[0].(map[string]any)["base_fee_minor"], "version 1 is kept")
	require.EqualValues(t, 1, r.Body["current_price_version"], "2099 is not here yet")
	for {
		pol, err := b.cache.Resolve(org)
		require.NoError(t, err)
		if pol.Path[0].Limits[policy.Requests].Burst == 1000 && pol.Priority == 80 {
			break
		}
		require.Less(t, time.Since(written), time.Second, "the plan's new limits reach the cache within 1 s")
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}

	// Without a price the prices stay.
	delete(update, "price")
	r = b.call(t, "PUT", "/v1/admin/plans/"+id, adminToken, update)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.Len(t, r.Body["prices"], 2)
	require.Equal(t, http.StatusNotFound, b.call(t, "PUT", "/v1/admin/plans/"+b.id("none"), adminToken, update).Status)
	update["id"] = b.id("other")
	r = b.call(t, "PUT", "/v1/admin/plans/"+id, adminToken, update)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Equal(t, "invalid_id", errCode(r))
}

func errCode(r reply) string {
	e, _ := r.Body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestPlanValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// A closed period, for the version that would take effect in it.
	_, err := testenv.Postgres(t).Exec(testenv.Context(t, time.Minute),
		`INSERT INTO periods (period, closed_at, closed_by) VALUES ('2001-01-01', now(), 'api test') ON CONFLICT DO NOTHING`)
	require.NoError(t, err)
	existing := b.id("existing")
	r := b.call(t, "POST", "/v1/admin/plans", adminToken, map[string]any{"id": existing, "rank": planRank(), "price": examplePrice()})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)

	tier := func(from, upTo any, price any) map[string]any {
		m := map[string]any{"from": from, "price_minor": price, "per_units": 1000}
		if upTo != nil {
			m["up_to"] = upTo
		}
		return m
	}
	withTiers := func(tiers ...any) func(p map[string]any) {
		return func(p map[string]any) {
			p["units"] = map[string]any{"tokens": map[string]any{"included": 100, "tiers": tiers}}
		}
	}
	for _, tc := range []struct {
		name  string
		put   bool // on the existing plan
		body  func(b map[string]any)
		price func(p map[string]any)
		raw   string // the whole body instead
		code  string
	}{
		{name: "no rank", body: func(b map[string]any) { delete(b, "rank") }, code: "invalid_rank"},
		{name: "rank taken", body: func(b map[string]any) { b["rank"] = 1 }, code: "invalid_rank"},
		{name: "bad id", body: func(b map[string]any) { b["id"] = "a b" }, code: "invalid_id"},
		{name: "priority", body: func(b map[string]any) { b["priority"] = 101 }, code: "invalid_priority"},
		{name: "concurrency", body: func(b map[string]any) { b["concurrency"] = -1 }, code: "invalid_concurrency"},
		{name: "limit", body: func(b map[string]any) {
			b["limits"] = map[string]any{"requests": map[string]any{"rate_per_s": 5}}
		}, code: "invalid_limits"},
		{name: "limit unit", body: func(b map[string]any) {
			b["limits"] = map[string]any{"gpus": map[string]any{"rate_per_s": 5, "burst": 5}}
		}, code: "invalid_limits"},
		{name: "unknown field", body: func(b map[string]any) { b["tier"] = "gold" }, code: "unknown_field"},
		{name: "smallest without price", body: func(b map[string]any) { b["rank"] = -1_000_000 - rand.IntN(1<<20); delete(b, "price") },
			code: "invalid_price"},
		{name: "currency lowercase", price: func(p map[string]any) { p["currency"] = "eur" }, code: "invalid_price_currency"},
		{name: "currency missing", price: func(p map[string]any) { delete(p, "currency") }, code: "invalid_price_currency"},
		{name: "fee fraction", price: func(p map[string]any) { p["base_fee_minor"] = 4900.5 }, code: "invalid_price_base_fee_minor"},
		{name: "fee exponent", raw: `{"id":"ID","rank":RANK,"price":{"currency":"EUR","base_fee_minor":1e3}}`, code: "invalid_price_base_fee_minor"},
		{name: "fee quoted", price: func(p map[string]any) { p["base_fee_minor"] = "4900" }, code: "invalid_price_base_fee_minor"},
		{name: "fee negative", price: func(p map[string]any) { p["base_fee_minor"] = -1 }, code: "invalid_price_base_fee_minor"},
		{name: "tier gap", price: withTiers(tier(100, 200, 1), tier(300, nil, 1)), code: "invalid_price_units"},
		{name: "tiers not from included", price: withTiers(tier(0, nil, 1)), code: "invalid_price_units"},
		{name: "tiers descending", price: withTiers(tier(100, 50, 1), tier(50, nil, 1)), code: "invalid_price_units"},
		{name: "last tier ends", price: withTiers(tier(100, 200, 1)), code: "invalid_price_units"},
		{name: "tier up_to 0", price: withTiers(tier(100, 0, 1)), code: "invalid_price_units"},
		{name: "price fraction", price: withTiers(tier(100, nil, 1.5)), code: "invalid_price_units"},
		{name: "price negative", price: withTiers(tier(100, nil, -1)), code: "invalid_price_units"},
		{name: "per_units zero", price: withTiers(map[string]any{"from": 100, "price_minor": 1, "per_units": 0}), code: "invalid_price_units"},
		{name: "price unit", price: func(p map[string]any) { p["units"] = map[string]any{"gpus": map[string]any{"included": 1}} },
			code: "invalid_price_units"},
		{name: "period malformed", put: true, price: func(p map[string]any) { p["effective_period"] = "2026-13" },
			code: "invalid_price_effective_period"},
		{name: "period a day", put: true, price: func(p map[string]any) { p["effective_period"] = "2099-01-01" },
			code: "invalid_price_effective_period"},
		{name: "first price dated", price: func(p map[string]any) { p["effective_period"] = "2099-01" },
			code: "invalid_price_effective_period"},
		{name: "change undated", put: true, code: "invalid_price_effective_period"},
		{name: "period closed", put: true, price: func(p map[string]any) { p["effective_period"] = "2001-01" },
			code: "invalid_price_effective_period"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, rank := b.id(strconv.Itoa(rand.IntN(1<<30))), planRank()
			method, path := "POST", "/v1/admin/plans"
			if tc.put {
				id, method, path = existing, "PUT", "/v1/admin/plans/"+existing
			}
			var body any
			if tc.raw != "" {
				body = strings.NewReplacer("ID", id, "RANK", strconv.Itoa(rank)).Replace(tc.raw)
			} else {
				price := examplePrice()
				if tc.price != nil {
					tc.price(price)
				}
				m := map[string]any{"id": id, "rank": rank, "price": price}
				if tc.body != nil {
					tc.body(m)
				}
				body = m
			}
			r := b.call(t, method, path, adminToken, body)
			require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
			require.Equal(t, tc.code, errCode(r), r.Raw)
		})
	}
}

// The plan routes take the admin token: none is 401, the service token 403.
func TestPlansNeedTheAdminToken(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, rt := range []struct{ method, path string }{
		{"POST", "/v1/admin/plans"}, {"GET", "/v1/admin/plans"}, {"GET", "/v1/admin/plans/pro"}, {"PUT", "/v1/admin/plans/pro"},
	} {
		for token, status := range map[string]int{"": 401, "nope": 401, serviceToken: 403} {
			r := b.call(t, rt.method, rt.path, token, map[string]any{"id": "x", "rank": planRank()})
			require.Equal(t, status, r.Status, "%s %s with %q: %s", rt.method, rt.path, token, r.Raw)
		}
	}
	r := b.call(t, "GET", "/v1/admin/plans/pro", adminToken, nil)
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	require.EqualValues(t, 1, r.Body["current_price_version"], "the seeded prices are version 1")
}

// A plan's recurring credit grants go through the plans API: written with the plan, read
// back, replaced by a PUT (left out: none), refused when malformed with nothing written.
func TestPlanGrants(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id, rank := b.id("prepaid"), planRank()
	create := map[string]any{"id": id, "rank": rank, "price": examplePrice(),
		"grants": map[string]any{"cost_micros": map[string]any{"amount": 5_000_000, "priority": 10}}}
	r := b.call(t, "POST", "/v1/admin/plans", adminToken, create)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	require.Equal(t, map[string]any{"cost_micros": map[string]any{"amount": 5e6, "priority": 10.0}}, r.Body["grants"])
	got := b.call(t, "GET", "/v1/admin/plans/"+id, adminToken, nil)
	require.Equal(t, r.Body["grants"], got.Body["grants"])

	for _, bad := range []any{0, -5, 1.5, "100", 2e15} {
		body := map[string]any{"rank": rank, "grants": map[string]any{"credits": map[string]any{"amount": bad}}}
		r := b.call(t, "PUT", "/v1/admin/plans/"+id, adminToken, body)
		require.Equal(t, http.StatusBadRequest, r.Status, "%v: %s", bad, r.Raw)
		require.Equal(t, "invalid_grants", r.Body["error"].(map[string]any)["code"], bad)
	}
	require.Equal(t, r.Body["grants"], b.call(t, "GET", "/v1/admin/plans/"+id, adminToken, nil).Body["grants"], "nothing written")

	upd := b.call(t, "PUT", "/v1/admin/plans/"+id, adminToken, map[string]any{"rank": rank})
	require.Equal(t, http.StatusOK, upd.Status, upd.Raw)
	require.NotContains(t, upd.Body, "grants", "a PUT without grants leaves none")
}

// Every limit, quota, cap, price and threshold the admin API takes has a maximum: at it a
// write is accepted, one past it is a 400 whose message names the field. The contract
// check holds the document's maximum to the API's on every exchange.
func TestAdminBounds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const most = policy.MaxAmount
	org, team := b.id("org"), b.id("team")
	b.account(t, map[string]any{"id": org, "kind": "org", "concurrency": math.MaxInt32,
		"limits": map[string]any{"tokens": map[string]any{"rate_per_s": 1e6, "burst": most, "quota": most}}})
	b.account(t, map[string]any{"id": team, "kind": "team", "parent": org})

	for _, c := range []struct {
		field    string
		ok, past map[string]any
	}{
		{"burst", map[string]any{"rate_per_s": 1e6, "burst": most}, map[string]any{"rate_per_s": 1e7, "burst": most + 1}},
		{"rate_per_s", map[string]any{"rate_per_s": most, "burst": 10}, map[string]any{"rate_per_s": most + 1, "burst": 10}},
		{"burst / rate_per_s", map[string]any{"rate_per_s": 0.001, "burst": 1_000_000}, map[string]any{"rate_per_s": 0.001, "burst": 1_000_001}},
		{"window_s", map[string]any{"limit": 5, "window_s": 1_000_000_000}, map[string]any{"limit": 5, "window_s": 1_000_000_001}},
		{"limit", map[string]any{"algorithm": "sliding_window", "limit": most, "window_s": 60},
			map[string]any{"algorithm": "sliding_window", "limit": most + 1, "window_s": 60}},
		{"quota", map[string]any{"quota": most}, map[string]any{"quota": most + 1}},
		{"quota", map[string]any{"quota": most, "quota_period": "day"}, map[string]any{"quota": most + 1, "quota_period": "day"}},
		{"ceiling", map[string]any{"rate_per_s": 1, "burst": 10, "ceiling": most}, map[string]any{"rate_per_s": 1, "burst": 10, "ceiling": most + 1}},
	} {
		r := b.call(t, "PUT", "/v1/admin/accounts/"+team, adminToken, map[string]any{"limits": map[string]any{"credits": c.ok}})
		require.Equal(t, http.StatusOK, r.Status, "%s at its maximum: %s", c.field, r.Raw)
		r = b.call(t, "PUT", "/v1/admin/accounts/"+team, adminToken, map[string]any{"limits": map[string]any{"credits": c.past}})
		require.Equal(t, http.StatusBadRequest, r.Status, "%s past its maximum: %s", c.field, r.Raw)
		require.Equal(t, "invalid_limits", errCode(r), r.Raw)
		require.Contains(t, r.Raw, "credits: ")
		require.Contains(t, r.Raw, c.field+" ", r.Raw)
	}
	r := b.call(t, "PUT", "/v1/admin/accounts/"+team, adminToken, map[string]any{"concurrency": int64(math.MaxInt32) + 1})
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Equal(t, "invalid_concurrency", errCode(r), r.Raw)

	// A plan with every number at its maximum, then each one past it.
	plan := func() map[string]any {
		return map[string]any{"id": b.id("big"), "rank": planRank(), "concurrency": math.MaxInt32,
			"limits": map[string]any{"tokens": map[string]any{"rate_per_s": 1e6, "burst": most, "quota": most}},
			"grants": map[string]any{"credits": map[string]any{"amount": most}},
			"price": map[string]any{"currency": "EUR", "base_fee_minor": most, "units": map[string]any{
				"tokens": map[string]any{"included": most - 2, "tiers": []any{
					map[string]any{"from": most - 2, "up_to": most, "price_minor": most, "per_units": most},
					map[string]any{"from": most, "price_minor": 1, "per_units": 1},
				}},
			}}}
	}
	price := func(p map[string]any) map[string]any { return p["price"].(map[string]any) }
	tier := func(p map[string]any, i int) map[string]any {
		return price(p)["units"].(map[string]any)["tokens"].(map[string]any)["tiers"].([]any)[i].(map[string]any)
	}
	for _, c := range []struct {
		code, field string
		change      func(p map[string]any)
	}{
		{"invalid_limits", "tokens: quota", func(p map[string]any) { p["limits"] = map[string]any{"tokens": map[string]any{"quota": most + 1}} }},
		{"invalid_grants", "credits: amount", func(p map[string]any) { p["grants"] = map[string]any{"credits": map[string]any{"amount": most + 1}} }},
		{"invalid_concurrency", "concurrency", func(p map[string]any) { p["concurrency"] = int64(math.MaxInt32) + 1 }},
		{"invalid_price_base_fee_minor", "price.base_fee_minor", func(p map[string]any) { price(p)["base_fee_minor"] = most + 1 }},
		{"invalid_price_units", "price.units.tokens.included", func(p map[string]any) {
			price(p)["units"].(map[string]any)["tokens"].(map[string]any)["included"] = most + 1
		}},
		{"invalid_price_units", "price.units.tokens.tiers[1].from", func(p map[string]any) { tier(p, 1)["from"] = most + 1 }},
		{"invalid_price_units", "price.units.tokens.tiers[0].up_to", func(p map[string]any) { tier(p, 0)["up_to"] = most + 1 }},
		{"invalid_price_units", "price.units.tokens.tiers[0].price_minor", func(p map[string]any) { tier(p, 0)["price_minor"] = most + 1 }},
		{"invalid_price_units", "price.units.tokens.tiers[0].per_units", func(p map[string]any) { tier(p, 0)["per_units"] = most + 1 }},
	} {
		p := plan()
		c.change(p)
		r := b.call(t, "POST", "/v1/admin/plans", adminToken, p)
		require.Equal(t, http.StatusBadRequest, r.Status, "%s: %s", c.field, r.Raw)
		require.Equal(t, c.code, errCode(r), r.Raw)
		require.Contains(t, r.Raw, c.field, r.Raw)
	}
	r = b.call(t, "POST", "/v1/admin/plans", adminToken, plan())
	require.Equal(t, http.StatusCreated, r.Status, "every number at its maximum: %s", r.Raw)

	// An alert's balance threshold.
	rule := map[string]any{"account": org, "kind": "balance_below", "unit": "credits", "thresholds": []int64{most + 1}}
	r = b.call(t, "POST", "/v1/admin/alerts", adminToken, rule)
	require.Equal(t, http.StatusBadRequest, r.Status, r.Raw)
	require.Equal(t, "invalid_thresholds", errCode(r), r.Raw)
	rule["thresholds"] = []int64{most}
	r = b.call(t, "POST", "/v1/admin/alerts", adminToken, rule)
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
}
