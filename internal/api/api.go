// Package api is admit's HTTP interface: the decision API for calling services
// (POST /v1/admit, POST /v1/estimate, POST /v1/outcomes, GET /v1/usage/{account}) and the admin API for
// accounts, API keys, plans with their prices, and invoices with their documents, described by the OpenAPI
// document served at /openapi.yaml.
package api

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/customer"
	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/pkg/event"
)

//go:embed openapi.yaml
var openAPI []byte

// Policies answers who a caller is and what its limits are (policy.Cache).
type Policies interface {
	Resolve(account string) (policy.Resolved, error)
	Authenticate(secret string) (policy.APIKey, policy.Resolved, error)
	// WaitFresh waits until writes committed before since are visible.
	WaitFresh(ctx context.Context, since time.Time) error
	// Loaded reports whether the policies have been loaded once: before, every key and
	// account would look unknown.
	Loaded() bool
}

// Admin changes policies (policy.Store).
type Admin interface {
	CreateAccount(ctx context.Context, a policy.Account) (policy.Account, error)
	UpdateAccount(ctx context.Context, a policy.Account) (policy.Account, error)
	GetAccount(ctx context.Context, id string) (policy.Account, error)
	// Children lists an account's children by id after after, at most limit.
	Children(ctx context.Context, parent, after string, limit int) ([]policy.Account, error)
	CreateAPIKey(ctx context.Context, account string) (policy.APIKey, string, error)
	RevokeAPIKey(ctx context.Context, id string) error
	APIKey(ctx context.Context, id string) (policy.APIKey, error)
	APIKeys(ctx context.Context, account string) ([]policy.APIKey, error)
	// Plans: limits, concurrency, rank and priority, and versioned prices (nil: none added).
	CreatePlan(ctx context.Context, p policy.Plan, price *invoice.Plan) (policy.Plan, error)
	UpdatePlan(ctx context.Context, p policy.Plan, price *invoice.Plan) (policy.Plan, error)
	GetPlan(ctx context.Context, id string) (policy.Plan, error)
	Plans(ctx context.Context) ([]policy.Plan, error)
	// Alert rules of accounts and plans (docs/alerts.md).
	CreateAlert(ctx context.Context, r policy.AlertRule) (policy.AlertRule, error)
	UpdateAlert(ctx context.Context, r policy.AlertRule) (policy.AlertRule, error)
	GetAlert(ctx context.Context, id string) (policy.AlertRule, error)
	Alerts(ctx context.Context, account, plan string) ([]policy.AlertRule, error)
	DeleteAlert(ctx context.Context, id string) error
}

// Decider takes decisions in Redis (admission.Admitter).
type Decider interface {
	NewEventID(org string) string
	Decide(ctx context.Context, r admission.Request) (admission.Decision, error)
	// Void voids a request whose decision its caller was not told (admission.Admitter.Void).
	Void(ctx context.Context, v admission.Void) (bool, error)
	Outcome(ctx context.Context, o admission.Outcome) error
	Usage(ctx context.Context, p policy.Resolved) (map[policy.Unit]admission.UnitUsage, error)
}

// Recorder writes an event straight to Kafka, synchronously: the record of an admission
// decided without Redis.
type Recorder interface {
	Record(ctx context.Context, key string, ev event.CloudEvent) error
}

// FailPolicy says what happens to a kind of account while Redis is unavailable.
type FailPolicy = gate.FailPolicy

// Fail policies.
const (
	FailOpen   = gate.FailOpen
	FailClosed = gate.FailClosed
)

// Config assembles a Server.
type Config struct {
	Log          *slog.Logger
	Policies     Policies
	Admin        Admin
	Decider      Decider
	Recorder     Recorder // for fail-open admissions; nil means fail closed for everyone
	ServiceToken string
	AdminToken   string
	Source       string           // this node's name, the CloudEvents source
	Tools        map[string]int64 // tool → credits; policy.ToolCredits when nil
	// While Redis is unavailable: rate-only accounts (default open) and quota-bearing
	// accounts (default closed).
	RedisDownRateOnly FailPolicy
	RedisDownQuota    FailPolicy
	// RedisDownRetryAfter is the Retry-After of a 503 while Redis is unavailable.
	RedisDownRetryAfter time.Duration
	Registerer          prometheus.Registerer
	// Clock gives the period of a fail-open decision and a void (nil: the system clock).
	Clock period.Clock
	// Estimate configures token estimation (POST /v1/estimate, admit's estimate).
	Estimate estimate.Options
	// MaxWait bounds admit's max_wait_ms, how long a request may wait for capacity
	// (ADMIT_MAX_WAIT); 0 refuses every wait with 400 invalid_max_wait.
	MaxWait time.Duration
	// Shadow puts every request in shadow mode (ADMIT_SHADOW): decided and recorded, never
	// refused; an account or plan can be in shadow mode by itself (policy.Resolved.Shadow).
	Shadow bool
	// Credits grants, voids and reads prepaid credit balances (credit.Store); nil answers
	// those routes 503.
	Credits Credits
	// Webhooks keeps webhook endpoints and their delivery log (webhook.Store, which refuses
	// private targets unless WEBHOOK_ALLOW_PRIVATE); nil answers those routes 503.
	Webhooks Webhooks
	// Invoices reads invoices and credit notes, changes statuses and keeps billing details
	// (InvoiceStore); nil answers those routes 503.
	Invoices Invoices
	// Check names the headers of the forward-auth check (check.go); an empty name takes
	// DefaultCheckHeaders' (but Account, which stays off unless named).
	Check CheckHeaders
	// RevealAccounts shows end clients behind a gateway (the check, the rate-limit service)
	// the ids of every account of their path in refusals and RateLimit fields
	// (ADMIT_GATEWAY_REVEAL_ACCOUNTS). Off by default: they see their own account's id, the
	// others by their kind ("org", "team", …).
	RevealAccounts bool
	// Staff authenticates named staff credentials and keeps the audit log (staff.Store);
	// nil: the admin token alone opens the admin API, and its writes are not audited.
	Staff Staff
	// Customers issues, lists and revokes customer tokens (customer.Store); nil answers
	// those routes 503.
	Customers Customers
	// PortalURL is the base of portal session links (PORTAL_PUBLIC_URL,
	// https://admit.example); empty: the links are paths of this host.
	PortalURL string
	// Usage reads usage per account and day from the billing log (billinglog.Daily), for
	// the customer API; nil answers its usage route 503.
	Usage UsageLog
	// Refusals is told every refusal by a limit (refusals.Log, the console's refusal log);
	// nil: none is recorded.
	Refusals gate.Refusals
	// MaxEstimates bounds the token estimates of large bodies running at once on this node
	// (ADMIT_MAX_ESTIMATES; 2 × GOMAXPROCS when 0).
	MaxEstimates int
}

// Server serves the API.
type Server struct {
	cfg       Config
	mux       *http.ServeMux
	gate      *gate.Gate
	estimates chan struct{} // a slot per estimate running (estimating)
}

// New returns a Server; mount Handler on the listener.
func New(cfg Config) *Server {
	if cfg.Tools == nil {
		cfg.Tools = policy.ToolCredits
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.MaxEstimates <= 0 {
		cfg.MaxEstimates = 2 * runtime.GOMAXPROCS(0)
	}
	cfg.Check = cfg.Check.withDefaults()
	g := gate.New(gate.Config{Log: cfg.Log, Policies: cfg.Policies, Decider: cfg.Decider, Recorder: cfg.Recorder,
		Source: cfg.Source, RedisDownRateOnly: cfg.RedisDownRateOnly, RedisDownQuota: cfg.RedisDownQuota,
		RedisDownRetryAfter: cfg.RedisDownRetryAfter, Clock: cfg.Clock, Shadow: cfg.Shadow, Registerer: cfg.Registerer, Refusals: cfg.Refusals})
	s := &Server{cfg: cfg, mux: http.NewServeMux(), gate: g, estimates: make(chan struct{}, cfg.MaxEstimates)}
	s.routes()
	return s
}

// Routes lists every route the server answers, as "METHOD /path" patterns ("/path" for
// any method: the forward-auth check).
var Routes = []string{
	"POST /v1/admit",
	"POST /v1/estimate",
	"POST /v1/outcomes",
	"GET /v1/usage/{account}",
	"GET /v1/balance/{account}",
	"POST /v1/admin/accounts",
	"PUT /v1/admin/accounts/{id}",
	"GET /v1/admin/accounts/{id}",
	"POST /v1/admin/api-keys",
	"DELETE /v1/admin/api-keys/{id}",
	"POST /v1/admin/plans",
	"GET /v1/admin/plans",
	"GET /v1/admin/plans/{id}",
	"PUT /v1/admin/plans/{id}",
	"POST /v1/admin/accounts/{id}/grants",
	"DELETE /v1/admin/accounts/{id}/grants/{grant}",
	"POST /v1/admin/alerts",
	"GET /v1/admin/alerts",
	"GET /v1/admin/alerts/{id}",
	"PUT /v1/admin/alerts/{id}",
	"DELETE /v1/admin/alerts/{id}",
	"POST /v1/admin/webhooks",
	"GET /v1/admin/webhooks",
	"GET /v1/admin/webhooks/{id}",
	"PUT /v1/admin/webhooks/{id}",
	"DELETE /v1/admin/webhooks/{id}",
	"POST /v1/admin/webhooks/{id}/rotate",
	"GET /v1/admin/webhooks/{id}/deliveries",
	"GET /v1/admin/webhooks/{id}/deliveries/{delivery}",
	"POST /v1/admin/webhooks/{id}/deliveries/{delivery}/replay",
	"POST /v1/admin/webhooks/{id}/replay",
	"GET /v1/admin/invoices",
	"GET /v1/admin/invoices/{id}",
	"POST /v1/admin/invoices/{id}/status",
	"POST /v1/admin/invoices/{id}/void",
	"POST /v1/admin/invoices/{id}/reissue",
	"GET /v1/admin/credit-notes",
	"GET /v1/admin/credit-notes/{id}",
	"POST /v1/admin/amendments",
	"PUT /v1/admin/accounts/{id}/billing",
	"GET /v1/admin/accounts/{id}/billing",
	"POST /v1/admin/staff",
	"GET /v1/admin/staff",
	"DELETE /v1/admin/staff/{id}",
	"GET /v1/admin/audit",
	"POST /v1/admin/customer-tokens",
	"GET /v1/admin/customer-tokens",
	"GET /v1/admin/customer-tokens/{id}",
	"DELETE /v1/admin/customer-tokens/{id}",
	"POST /v1/admin/portal-sessions",
	"GET /v1/portal/me",
	"GET /v1/portal/accounts/{id}",
	"GET /v1/portal/accounts/{id}/children",
	"GET /v1/portal/accounts/{id}/usage",
	"POST /v1/portal/accounts",
	"PUT /v1/portal/accounts/{id}",
	"GET /v1/portal/accounts/{id}/api-keys",
	"POST /v1/portal/accounts/{id}/api-keys",
	"DELETE /v1/portal/api-keys/{id}",
	"GET /v1/portal/accounts/{id}/balance",
	"GET /v1/portal/invoices",
	"GET /v1/portal/invoices/{id}",
	"GET /v1/portal/credit-notes",
	"GET /v1/portal/credit-notes/{id}",
	"GET /openapi.yaml",
	// The forward-auth check answers every method: gateways send the original one.
	"/v1/check",
	"/v1/check/{path...}",
}

// AnyMethod are the methods a route of Routes without one (the forward-auth check)
// answers, as the OpenAPI document lists them.
var AnyMethod = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// Operations are the routes as the OpenAPI document lists its operations ("METHOD /path"):
// a route without a method once per AnyMethod, and "{path...}" written "{path}".
func Operations() []string {
	var out []string
	for _, r := range Routes {
		if strings.Contains(r, " ") {
			out = append(out, r)
			continue
		}
		for _, m := range AnyMethod {
			out = append(out, m+" "+strings.ReplaceAll(r, "...}", "}"))
		}
	}
	return out
}

func (s *Server) routes() {
	handlers := map[string]http.HandlerFunc{
		"POST /v1/admit":                 s.service(s.admit),
		"POST /v1/estimate":              s.service(s.estimate),
		"POST /v1/outcomes":              s.service(s.outcome),
		"GET /v1/usage/{account}":        s.service(s.usage),
		"POST /v1/admin/accounts":        s.admin(s.createAccount),
		"PUT /v1/admin/accounts/{id}":    s.admin(s.updateAccount),
		"GET /v1/admin/accounts/{id}":    s.admin(s.getAccount),
		"POST /v1/admin/api-keys":        s.admin(s.createAPIKey),
		"DELETE /v1/admin/api-keys/{id}": s.admin(s.revokeAPIKey),
		"POST /v1/admin/plans":           s.admin(s.createPlan),
		"GET /v1/admin/plans":            s.admin(s.listPlans),
		"GET /v1/admin/plans/{id}":       s.admin(s.getPlan),
		"PUT /v1/admin/plans/{id}":       s.admin(s.updatePlan),

		// Prepaid credits (credits.go).
		"GET /v1/balance/{account}":                     s.service(s.balance),
		"POST /v1/admin/accounts/{id}/grants":           s.admin(s.createGrant),
		"DELETE /v1/admin/accounts/{id}/grants/{grant}": s.admin(s.voidGrant),

		// Alert rules (alerts.go).
		"POST /v1/admin/alerts":        s.admin(s.createAlert),
		"GET /v1/admin/alerts":         s.admin(s.listAlerts),
		"GET /v1/admin/alerts/{id}":    s.admin(s.getAlert),
		"PUT /v1/admin/alerts/{id}":    s.admin(s.updateAlert),
		"DELETE /v1/admin/alerts/{id}": s.admin(s.deleteAlert),

		// Webhook endpoints, the delivery log and replay (webhooks.go).
		"POST /v1/admin/webhooks":                                   s.webhooks(s.createWebhook),
		"GET /v1/admin/webhooks":                                    s.webhooks(s.listWebhooks),
		"GET /v1/admin/webhooks/{id}":                               s.webhooks(s.getWebhook),
		"PUT /v1/admin/webhooks/{id}":                               s.webhooks(s.updateWebhook),
		"DELETE /v1/admin/webhooks/{id}":                            s.webhooks(s.deleteWebhook),
		"POST /v1/admin/webhooks/{id}/rotate":                       s.webhooks(s.rotateWebhook),
		"GET /v1/admin/webhooks/{id}/deliveries":                    s.webhooks(s.listDeliveries),
		"GET /v1/admin/webhooks/{id}/deliveries/{delivery}":         s.webhooks(s.getDelivery),
		"POST /v1/admin/webhooks/{id}/deliveries/{delivery}/replay": s.webhooks(s.replayDelivery),
		"POST /v1/admin/webhooks/{id}/replay":                       s.webhooks(s.replayWebhooks),

		// Invoices, their renderings (123.pdf, .html, .csv), statuses and credit notes,
		// amendments of closed periods (amendments.go), and customers' billing details
		// (invoices.go).
		"GET /v1/admin/invoices":               s.invoices(s.listInvoices),
		"GET /v1/admin/invoices/{id}":          s.invoices(s.getInvoice),
		"POST /v1/admin/invoices/{id}/status":  s.invoices(s.setInvoiceStatus),
		"POST /v1/admin/invoices/{id}/void":    s.invoices(s.voidInvoice),
		"POST /v1/admin/invoices/{id}/reissue": s.invoices(s.reissueInvoice),
		"GET /v1/admin/credit-notes":           s.invoices(s.listCreditNotes),
		"GET /v1/admin/credit-notes/{id}":      s.invoices(s.getCreditNote),
		"POST /v1/admin/amendments":            s.invoices(s.amend),
		"PUT /v1/admin/accounts/{id}/billing":  s.invoices(s.putBillingDetails),
		"GET /v1/admin/accounts/{id}/billing":  s.invoices(s.getBillingDetails),

		// Staff members and the audit log (staff.go).
		"POST /v1/admin/staff":        s.staffStore(s.createStaff),
		"GET /v1/admin/staff":         s.staffStore(s.listStaff),
		"DELETE /v1/admin/staff/{id}": s.staffStore(s.revokeStaff),
		"GET /v1/admin/audit":         s.staffStore(s.listAudit),

		// Customer tokens, for the customer API and portal (customers.go).
		"POST /v1/admin/customer-tokens":     s.customers(s.createCustomerToken),
		"GET /v1/admin/customer-tokens":      s.customers(s.listCustomerTokens),
		"GET /v1/admin/customer-tokens/{id}": s.customers(s.getCustomerToken),

		"DELETE /v1/admin/customer-tokens/{id}": s.customers(s.revokeCustomerToken),
		// One-time links to portal sessions (portal_sessions.go).
		"POST /v1/admin/portal-sessions": s.customers(s.createPortalSession),

		// The customer API (portal*.go): a customer token's view of its subtree, each route
		// with the scope it takes ("": any).
		"GET /v1/portal/me":                      s.portal("", s.portalMe),
		"GET /v1/portal/accounts/{id}":           s.portal(customer.UsageRead, s.portalGetAccount),
		"GET /v1/portal/accounts/{id}/children":  s.portal(customer.UsageRead, s.portalChildren),
		"GET /v1/portal/accounts/{id}/usage":     s.portal(customer.UsageRead, s.portalUsage),
		"POST /v1/portal/accounts":               s.portal(customer.AccountsWrite, s.portalCreateAccount),
		"PUT /v1/portal/accounts/{id}":           s.portal(customer.AccountsWrite, s.portalUpdateAccount),
		"GET /v1/portal/accounts/{id}/api-keys":  s.portal(customer.KeysWrite, s.portalKeys),
		"POST /v1/portal/accounts/{id}/api-keys": s.portal(customer.KeysWrite, s.portalCreateKey),
		"DELETE /v1/portal/api-keys/{id}":        s.portal(customer.KeysWrite, s.portalRevokeKey),
		"GET /v1/portal/accounts/{id}/balance":   s.portal(customer.BillingRead, s.portalBalance),
		"GET /v1/portal/invoices":                s.portal(customer.BillingRead, s.portalInvoices),
		"GET /v1/portal/invoices/{id}":           s.portal(customer.BillingRead, s.portalGetInvoice),
		"GET /v1/portal/credit-notes":            s.portal(customer.BillingRead, s.portalCreditNotes),
		"GET /v1/portal/credit-notes/{id}":       s.portal(customer.BillingRead, s.portalGetCreditNote),

		// Forward-auth for nginx, Traefik, Caddy and Envoy's ext_authz (check.go); below
		// /v1/check/ for Envoy, which appends the original path to its path_prefix.
		"/v1/check":           s.checkService(s.check),
		"/v1/check/{path...}": s.checkService(s.check),

		"GET /openapi.yaml": func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/yaml")
			_, _ = w.Write(openAPI)
		},
	}
	for _, pattern := range Routes {
		s.mux.HandleFunc(pattern, handlers[pattern])
	}
}

// Mount adds the API's routes to mux, and makes the server answer every path mux has no
// other route for, so an unknown path gets the API's JSON 404.
func (s *Server) Mount(mux *http.ServeMux) { mux.Handle("/", s) }

// ServeHTTP serves the API; a panic in a handler becomes a logged 500, never a crash.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a sentinel panic value, compared as net/http does
				panic(v) // the response is aborted on purpose: net/http closes the connection
			}
			s.cfg.Log.Error("handler panicked", "path", r.URL.Path, "panic", v)
			writeError(w, &Error{Status: 500, Code: "internal", Message: "internal error"})
		}
	}()
	r.Body = http.MaxBytesReader(w, r.Body, int64(bodyLimit(r.URL.Path))+1)
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.noRoute(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// noRoute answers a request no route matches: 405 with the Allow header when the path
// has routes for other methods, 404 otherwise; both as JSON errors like every other answer.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		writeError(w, &Error{Status: http.StatusNotFound, Code: "not_found", Message: "no such route: " + r.URL.Path})
		return
	}
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeError(w, &Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
		Message: fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))})
}

// bearer checks the Authorization header against token in constant time.
func bearer(r *http.Request, token string) bool {
	return ops.Bearer(r.Header.Get("Authorization"), token)
}

func (s *Server) service(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !bearer(r, s.cfg.ServiceToken) {
			code := http.StatusUnauthorized
			if bearer(r, s.cfg.AdminToken) {
				code = http.StatusForbidden // the admin token does not take decisions
			}
			writeError(w, authError(code, "a valid service token is required (Authorization: Bearer …)"))
			return
		}
		if !s.cfg.Policies.Loaded() {
			// A node that has just started must not call a valid key unknown: retry shortly.
			w.Header().Set("Retry-After", "1")
			writeError(w, &Error{Status: http.StatusServiceUnavailable, Code: "policies_loading",
				Message: "this node has not loaded the policies yet; retry later"})
			return
		}
		h(w, r)
	}
}

// admin opens a route of the admin API to the admin token and to staff whose role allows
// it (staff.go), and audits its writes.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, e := s.staffOf(r)
		if e != nil {
			writeError(w, e)
			return
		}
		if !who.Role.Allows(r.Pattern) {
			writeError(w, &Error{Status: http.StatusForbidden, Code: "forbidden_role",
				Message: fmt.Sprintf("the role %s may not %s (docs/console.md#roles)", who.Role, r.Pattern)})
			return
		}
		if staff.IsWrite(r.Pattern) {
			s.audited(w, r, who, h)
			return
		}
		h(w, r)
	}
}

// authError is a 401 "unauthorized" (no or unknown token) or a 403 "forbidden" (a token
// of the other API).
func authError(status int, msg string) *Error {
	if status == http.StatusForbidden {
		return &Error{Status: status, Code: "forbidden", Message: msg}
	}
	return &Error{Status: status, Code: "unauthorized", Message: msg}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // a failed write means the client left
}

func writeError(w http.ResponseWriter, e *Error) {
	writeJSON(w, e.Status, map[string]*Error{"error": e})
}

// retryAfterSeconds rounds up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}

// errorFor maps policy errors to client errors; ok is false for anything else (a 5xx).
func errorFor(err error) (*Error, bool) {
	var inv *policy.InvalidError
	switch {
	case errors.As(err, &inv):
		return badRequest("invalid_"+strings.ReplaceAll(inv.Field, ".", "_"), "%s", inv.Error()), true
	case errors.Is(err, policy.ErrNotFound):
		return &Error{Status: 404, Code: "not_found", Message: err.Error()}, true
	case errors.Is(err, policy.ErrAlertExists):
		return &Error{Status: 409, Code: "alert_exists", Message: "the account or plan has a rule of that kind, unit and period already: change it with PUT"}, true
	case errors.Is(err, policy.ErrExists):
		return &Error{Status: 409, Code: "exists", Message: err.Error()}, true
	}
	return nil, false
}

// Close ends the voids still retried against Redis (gate.Gate.Close). Call it once the
// HTTP server and the rate-limit service have stopped.
func (s *Server) Close(ctx context.Context) error { return s.gate.Close(ctx) }
