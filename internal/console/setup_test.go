package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/document"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/refusals"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/webhook"
	"github.com/metergate/metergate/migrations"
)

const (
	serviceToken = "svc-token-0123456789abcdef"
	adminToken   = "adm-token-0123456789abcdef"
)

var testIssuer = invoice.Issuer{Prefix: "MG", Seller: document.Party{LegalName: "Metergate Test GmbH",
	Address: []string{"Teststraße 1"}, City: "Berlin", PostalCode: "10115", Country: "DE"}}

// testBundle is admit's API and console as cmd/admit wires them, on a migrated schema of
// the test's own and the test Redis, served over HTTP.
type testBundle struct {
	url    string
	ctx    context.Context
	pool   *pgxpool.Pool
	cache  *policy.Cache
	staff  *staff.Store
	reg    *prometheus.Registry
	prefix string // account ids unique to the test start with it
}

type setupOpts struct {
	// noRefusals runs without the refusal log.
	noRefusals bool
}

func setup(t *testing.T, o setupOpts) *testBundle {
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
	for !b.cache.Loaded() {
		select {
		case <-b.ctx.Done():
			t.Fatal("policy cache never loaded")
		case <-time.After(10 * time.Millisecond):
		}
	}
	rdb := testenv.Redis(t)
	adm := admission.New(rdb, admission.Options{KeyPrefix: testenv.Prefix(t) + "mg", LeaseTTL: 5 * time.Second})
	t.Cleanup(adm.Close)
	b.staff = staff.NewStore(b.pool)
	var gateLog gate.Refusals
	var consoleLog console.Refusals
	if !o.noRefusals {
		l := refusals.New(rdb, adm.Keys(), refusals.Options{Log: log})
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		gateLog, consoleLog = l, l
	}
	credits := credit.NewStore(b.pool, rdb, adm.Keys(), nil)
	srv := api.New(api.Config{Refusals: gateLog, Log: log, ServiceToken: serviceToken, AdminToken: adminToken, Registerer: b.reg,
		Policies: b.cache, Admin: policy.NewStore(b.pool), Decider: adm, Source: "test-node",
		Credits: credits, Webhooks: webhook.NewStore(b.pool, true),
		Invoices: api.InvoiceStore{Pool: b.pool, Issuer: testIssuer}, Staff: b.staff})
	mux := http.NewServeMux()
	srv.Mount(mux)
	console.New(console.Config{Log: log, API: srv, Staff: b.staff, AdminToken: adminToken, Pool: b.pool,
		Policies: b.cache, Counters: adm, Refusals: consoleLog, Balances: credits, Metrics: b.reg, InsecureCookies: true}).Mount(mux)
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	b.url = ts.URL
	return b
}

// id is an account id unique to the test.
func (b *testBundle) id(name string) string { return b.prefix + "-" + name }

// member makes a staff member of role and returns its token.
func (b *testBundle) member(t *testing.T, role staff.Role) (staff.Member, string) {
	t.Helper()
	m, token, err := b.staff.Create(b.ctx, "test "+string(role)+" "+testenv.Name(t), role, "test")
	require.NoError(t, err)
	return m, token
}

// browser is an HTTP client with a cookie jar, as a browser is: it does not follow
// redirects, so a test sees them.
type browser struct {
	t    *testing.T
	b    *testBundle
	c    *http.Client
	csrf string // the last page's CSRF token
}

func (b *testBundle) browser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, b: b, c: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// signedIn is a browser signed in with token.
func (b *testBundle) signedIn(t *testing.T, token string) *browser {
	br := b.browser(t)
	page := br.get("/console/login")
	require.Equal(t, http.StatusOK, page.status)
	r := br.post("/console/login", url.Values{"token": {token}})
	require.Equal(t, http.StatusSeeOther, r.status, r.body)
	return br
}

// page is a reply.
type page struct {
	status   int
	header   http.Header
	body     string
	location string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (br *browser) do(req *http.Request) page {
	br.t.Helper()
	res, err := br.c.Do(req)
	require.NoError(br.t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(br.t, err)
	if m := csrfField.FindSubmatch(body); m != nil {
		br.csrf = string(m[1])
	}
	return page{status: res.StatusCode, header: res.Header, body: string(body), location: res.Header.Get("Location")}
}

func (br *browser) get(path string) page {
	br.t.Helper()
	req, err := http.NewRequestWithContext(br.b.ctx, http.MethodGet, br.b.url+path, nil)
	require.NoError(br.t, err)
	return br.do(req)
}

// post submits a form with the last page's CSRF token (unless form sets one).
func (br *browser) post(path string, form url.Values) page {
	br.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if !form.Has("csrf") {
		form.Set("csrf", br.csrf)
	}
	req, err := http.NewRequestWithContext(br.b.ctx, http.MethodPost, br.b.url+path, strings.NewReader(form.Encode()))
	require.NoError(br.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return br.do(req)
}

// api calls admit's API with token, as a client does, and returns the status and body.
func (b *testBundle) api(t *testing.T, method, path, token string, body any) (int, string) {
	t.Helper()
	var in io.Reader = http.NoBody
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		in = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(b.ctx, method, b.url+path, in)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(out)
}
