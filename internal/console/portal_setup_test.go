package console_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/migrations"
)

// The portal's branding in the tests.
const (
	testBrand    = "Acme Cloud"
	testTopUp    = "https://billing.example/top-up?account={account}"
	testReturnTo = "https://cloud.example/account?tab=usage&x=<y>"
)

// portalBundle is admit's API with the customer API and the portal mounted as cmd/admit
// wires them (no console), on a migrated schema of the test's own and the test Redis.
type portalBundle struct {
	*testBundle
	customers *customer.Store
	// portalConfig is the portal's configuration, for a second portal of other settings.
	portalConfig console.PortalConfig
}

func setupPortal(t *testing.T) *portalBundle {
	t.Helper()
	b := &testBundle{ctx: testenv.Context(t, 3*time.Minute), reg: prometheus.NewRegistry(),
		prefix: strings.ReplaceAll(testenv.Name(t), "_", "-")}
	owner, schema := testenv.EmptySchema(t)
	_, err := migrations.Up(b.ctx, owner)
	require.NoError(t, err)
	b.pool, err = pgxpool.New(b.ctx, testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema))
	require.NoError(t, err)
	t.Cleanup(b.pool.Close)

	log := slog.New(slog.DiscardHandler)
	b.cache = policy.NewCache(b.pool, log, time.Minute)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.cache.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, b.cache.Loaded, time.Minute, 10*time.Millisecond, "the policy cache loads")
	rdb := testenv.Redis(t)
	adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(t) + "mg", LeaseTTL: 5 * time.Second})
	t.Cleanup(adm.Close)
	b.staff = staff.NewStore(b.pool)
	customers := customer.NewStore(b.pool)
	srv := api.New(api.Config{Log: log, ServiceToken: serviceToken, AdminToken: adminToken, Registerer: b.reg,
		Policies: b.cache, Admin: policy.NewStore(b.pool), Decider: adm, Source: "test-node",
		Credits: credit.NewStore(b.pool, rdb, adm.Keys(), nil), Webhooks: webhook.NewStore(b.pool, true),
		Invoices: api.InvoiceStore{Pool: b.pool, Issuer: testIssuer}, Staff: b.staff, Customers: customers,
		Usage: api.UsageOf{Pool: b.pool}})
	mux := http.NewServeMux()
	srv.Mount(mux)
	cfg := console.PortalConfig{Log: log, API: srv, Sessions: customers, InsecureCookies: true,
		Brand: testBrand, Color: "#6f42c1", TopUpURL: testTopUp}
	console.NewPortal(cfg).Mount(mux)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	b.url = ts.URL
	return &portalBundle{testBundle: b, customers: customers, portalConfig: cfg}
}

// tree makes an org on plan pro with a quota of 1000 requests a month, its team ml with a
// user below it, and another org, globex; it returns their ids once this node resolves
// them.
func (b *portalBundle) tree(t *testing.T) (org, team, user, other string) {
	t.Helper()
	org, team, user, other = b.id("acme"), b.id("ml"), b.id("ada"), b.id("globex")
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"quota": 1000, "quota_period": "month"}}})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": team, "kind": "team", "parent": org})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": user, "kind": "user", "parent": team})
	b.adminCall(t, http.MethodPost, "/v1/admin/accounts", map[string]any{"id": other, "kind": "org", "plan": "pro"})
	b.resolvable(t, org, team, user, other)
	return org, team, user, other
}

// resolvable waits until this node's policies know every id.
func (b *portalBundle) resolvable(t *testing.T, ids ...string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if _, err := b.cache.Resolve(id); err != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "the node loads %v", ids)
}

// use is an admission of 1 request and Tokens tokens, at At, by the last account of Path
// (the org first).
type use struct {
	Path   []string
	At     time.Time
	Tokens int64
}

// used records uses in the billing log as the meter would, in one batch.
func (b *portalBundle) used(t *testing.T, uses ...use) {
	t.Helper()
	var batch pgx.Batch
	months := map[time.Time]bool{}
	for _, u := range uses {
		if m := period.MonthStart(u.At); !months[m] {
			months[m] = true
			batch.Queue(`select usage_events_partition($1::date)`, m)
		}
	}
	for _, u := range uses {
		batch.Queue(`
insert into usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind, path,
    source, requests, tokens, kafka_partition, kafka_offset)
select gen_random_uuid()::text, $1, $2, $1, $3, a.id, a.kind, $5, 'test-node', 1, $6, 0, 0
from accounts a where a.id = $4`,
			period.MonthStart(u.At), u.At, u.Path[0], u.Path[len(u.Path)-1], u.Path, u.Tokens)
	}
	require.NoError(t, b.pool.SendBatch(b.ctx, &batch).Close())
}

// link asks the admin API for a portal session's link of account with scopes, and returns
// its path (PORTAL_PUBLIC_URL is empty here).
func (b *portalBundle) link(t *testing.T, account string, scopes ...customer.Scope) string {
	t.Helper()
	status, raw := b.api(t, http.MethodPost, "/v1/admin/portal-sessions", adminToken,
		map[string]any{"account": account, "scopes": scopes, "return_url": testReturnTo})
	require.Equal(t, http.StatusCreated, status, raw)
	var s struct {
		URL string `json:"url"`
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &s))
	require.True(t, strings.HasPrefix(s.URL, "/portal/session/mgp_"), s.URL)
	return s.URL
}

// session opens a new link of account with scopes in a browser of its own, which it
// returns signed into the portal.
func (b *portalBundle) session(t *testing.T, account string, scopes ...customer.Scope) *browser {
	t.Helper()
	br := b.browser(t)
	r := br.get(b.link(t, account, scopes...))
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	require.Equal(t, "/portal/", r.location)
	return br
}

// invoicedOrg makes org on plan pro with billing details named legalName (19 % tax),
// closes billedMonth as reconcile's close would, and returns the org's invoice (as
// invoiced does, for an org of a plain name).
func (b *portalBundle) invoicedOrg(t *testing.T, org, legalName string) invoice.Invoice {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, org, plan, created_at) VALUES ($1, 'org', $1, 'pro', '2020-01-01')`, org)
	require.NoError(t, err)
	rate := 1900
	_, err = invoice.PutBillingDetails(b.ctx, b.pool, invoice.BillingDetails{Org: org, Party: document.Party{
		LegalName: legalName, Address: []string{"Hauptstraße 5"}, City: "München", PostalCode: "80331", Country: "DE"},
		Currency: "EUR", TaxRateBP: &rate, UpdatedBy: "test"}, billedMonth)
	require.NoError(t, err)
	res, err := invoice.Close(b.ctx, b.pool, billedMonth, invoice.Options{
		Clock: period.Fixed(billedMonth.AddDate(0, 1, 9)), Issuer: testIssuer, By: "portal test"})
	require.NoError(t, err)
	for _, inv := range res.Invoices {
		if inv.Org == org {
			return inv
		}
	}
	t.Fatalf("no invoice of %s in %+v", org, res)
	return invoice.Invoice{}
}
