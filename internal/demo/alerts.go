package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/webhook"
)

// The demo's alert rules (docs/alerts.md): a default of the free plan, 50, 80 and 100 % of
// the month's requests quota (tinyco's, its own override, runs out during the traffic), and
// prepaidco's balance below half of what it was granted (its first grant is drawn below
// half, and so, once it is topped up, is the larger total: the top-up re-arms it).
var alertRules = []map[string]any{
	{"plan": "free", "kind": "quota_percent", "unit": "requests", "thresholds": []int{50, 80, 100}},
	{"account": prepaidOrg, "kind": "balance_percent", "unit": prepaidUnit, "thresholds": []int{50}},
}

// expectedAlerts are the thresholds the traffic crosses whatever its length: tinyco's three
// and prepaidco's first half.
var expectedAlerts = []string{"tinyco/requests/p50", "tinyco/requests/p80", "tinyco/requests/p100", prepaidOrg + "/" + prepaidUnit + "/bp50"}

// Alerts is what the demo's alert rules fired and what its webhook receiver got.
type Alerts struct {
	Endpoint string // the webhook endpoint's id
	// Fired are the usage_alerts rows, oldest first.
	Fired []Fired
	// Accepted counts, by webhook-id, the deliveries the receiver accepted (signature
	// verified); BadSignatures the requests it refused for their signature.
	Accepted      map[string]int
	BadSignatures int
	// Attempts is webhook_attempts' rows.
	Attempts int
	Read     bool
	// told are the event ids of the 200s: an admitted request that fired must be one.
	told map[string]bool
}

// Fired is one usage_alerts row.
type Fired struct {
	ID, Account, Unit, Kind string
	Threshold, At, Value    int64
	Period, Grant           string
	TriggeredBy             string
	Admitted                bool
	At0                     time.Duration // after the traffic's start
}

// receiver is the demo's webhook endpoint: it verifies each request's signature with the
// endpoint's secret and counts the deliveries it accepts by webhook-id.
type receiver struct {
	url    string
	mu     sync.Mutex
	secret string
	got    map[string]int
	bad    int
}

func startReceiver() (*receiver, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	rc := &receiver{url: "http://" + ln.Addr().String() + "/hooks/metergate", got: map[string]int{}}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return rc, func() { _ = srv.Close() }, nil
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.secret == "" || webhook.Verify(rc.secret, body, r.Header) != nil {
		rc.bad++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	rc.got[r.Header.Get("webhook-id")]++
	w.WriteHeader(http.StatusNoContent)
}

func (rc *receiver) accepted() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string]int, len(rc.got))
	for k, v := range rc.got {
		out[k] = v
	}
	return out
}

// setupAlerts creates the webhook endpoint of rc (the secret it is shown once goes to rc)
// and the alert rules, and waits until admit's policy cache has the rules.
func setupAlerts(ctx context.Context, a sandbox.Admin, rc *receiver, al *Alerts) error {
	var ep struct{ ID, Secret string }
	body := map[string]any{"url": rc.url, "event_types": []string{"usage.threshold.v1"}}
	if err := a.Do(ctx, http.MethodPost, "/v1/admin/webhooks", body, http.StatusCreated, &ep); err != nil {
		return err
	}
	rc.mu.Lock()
	rc.secret = ep.Secret
	rc.mu.Unlock()
	al.Endpoint = ep.ID
	for _, rule := range alertRules {
		if err := a.Do(ctx, http.MethodPost, "/v1/admin/alerts", rule, http.StatusCreated, nil); err != nil {
			return err
		}
	}
	for _, id := range []string{"tinyco", prepaidOrg} {
		for {
			var acc struct {
				Effective *struct {
					Path []struct {
						Alerts []any `json:"alerts"`
					} `json:"path"`
				} `json:"effective"`
			}
			if err := a.Do(ctx, http.MethodGet, "/v1/admin/accounts/"+id, nil, http.StatusOK, &acc); err != nil {
				return err
			}
			if acc.Effective != nil && len(acc.Effective.Path) > 0 && len(acc.Effective.Path[len(acc.Effective.Path)-1].Alerts) > 0 {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// readAlerts waits (at most timeout) until the receiver has accepted a delivery of every
// usage_alerts row, then reads the rows and the attempts.
func readAlerts(ctx context.Context, pool *pgxpool.Pool, rc *receiver, begin time.Time, timeout time.Duration, al *Alerts) error {
	deadline := time.Now().Add(timeout)
	for {
		rows, err := pool.Query(ctx, `SELECT id, account, unit, kind, threshold, at_units, value, period,
			coalesce(arming_grant, ''), triggered_by, admitted, event_time FROM usage_alerts ORDER BY event_time, id`)
		if err != nil {
			return fmt.Errorf("read usage_alerts: %w", err)
		}
		al.Fired = al.Fired[:0]
		for rows.Next() {
			var f Fired
			var at time.Time
			if err := rows.Scan(&f.ID, &f.Account, &f.Unit, &f.Kind, &f.Threshold, &f.At, &f.Value, &f.Period, &f.Grant,
				&f.TriggeredBy, &f.Admitted, &at); err != nil {
				rows.Close()
				return fmt.Errorf("read usage_alerts: %w", err)
			}
			f.At0 = at.Sub(begin)
			al.Fired = append(al.Fired, f)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("read usage_alerts: %w", err)
		}
		al.Accepted = rc.accepted()
		all := len(al.Fired) > 0
		for _, f := range al.Fired {
			all = all && al.Accepted[f.ID] > 0
		}
		if all || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	rc.mu.Lock()
	al.BadSignatures = rc.bad
	rc.mu.Unlock()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM webhook_attempts`).Scan(&al.Attempts); err != nil {
		return fmt.Errorf("read webhook_attempts: %w", err)
	}
	al.Read = true
	return nil
}

// check: the expected thresholds fired, each row fired by a request its caller was told
// 200 (or, refused by the quota, one it was told 402), each delivered once, verified.
func (al Alerts) check() []error {
	if !al.Read {
		return []error{errors.New("alerts: not read")}
	}
	var errs []error
	have := map[string]bool{}
	for _, f := range al.Fired {
		if p := strings.Split(f.ID, "/"); len(p) == 5 { // alert/<account>/<unit>/<threshold>/<window>
			have[strings.Join(p[1:4], "/")] = true
		}
		if f.Admitted && !al.told[f.TriggeredBy] {
			errs = append(errs, fmt.Errorf("alert %s: fired by %s, which no caller was told 200", f.ID, f.TriggeredBy))
		}
		if n := al.Accepted[f.ID]; n != 1 {
			errs = append(errs, fmt.Errorf("alert %s: the receiver accepted it %d times, want once", f.ID, n))
		}
	}
	for _, want := range expectedAlerts {
		if !have[want] {
			errs = append(errs, fmt.Errorf("alert %s never fired", want))
		}
	}
	if len(al.Accepted) != len(al.Fired) {
		errs = append(errs, fmt.Errorf("the receiver accepted %d webhook-ids for %d alerts", len(al.Accepted), len(al.Fired)))
	}
	if al.BadSignatures > 0 {
		errs = append(errs, fmt.Errorf("%d webhook requests failed signature verification", al.BadSignatures))
	}
	return errs
}

func (r *Report) printAlerts(w io.Writer) {
	al := r.Alerts
	fmt.Fprintf(w, "\nAlerts (POST /v1/admin/alerts; usage_alerts; delivered to a local receiver that verifies signatures, endpoint %s)\n", al.Endpoint)
	if !al.Read {
		fmt.Fprintf(w, "  (not read)\n")
		return
	}
	fired := append([]Fired(nil), al.Fired...)
	sort.SliceStable(fired, func(i, j int) bool { return fired[i].At0 < fired[j].At0 })
	for _, f := range fired {
		what := fmt.Sprintf("%d %% of the %s quota: %s of %s", f.Threshold, f.Period, num(f.Value), f.Unit)
		switch f.Kind {
		case "balance_percent":
			what = fmt.Sprintf("balance below %d %% of granted (%s): %s %s, armed by grant %s", f.Threshold, num(f.At), num(f.Value), f.Unit, short(f.Grant))
		case "balance_below":
			what = fmt.Sprintf("balance below %s: %s %s", num(f.Threshold), num(f.Value), f.Unit)
		}
		by := "by request " + eventShort(f.TriggeredBy)
		if !f.Admitted {
			by += " (refused by the quota)"
		}
		fmt.Fprintf(w, "  %6s  %-10s %s\n          %s, delivered %d× (webhook-id %s)\n", f.At0.Round(100*time.Millisecond), f.Account, what, by, al.Accepted[f.ID], f.ID)
	}
	fmt.Fprintf(w, "  %d alerts, %d delivery attempts logged, %d accepted by the receiver (signatures verified), %d refused for their signature\n",
		len(al.Fired), al.Attempts, len(al.Accepted), al.BadSignatures)
}

// eventShort names an event id ("<uuid v7>.<shard>.<org>") by the end of its uuid, the part
// that differs between ids of the same second.
func eventShort(id string) string {
	u, _, _ := strings.Cut(id, ".")
	if len(u) < 12 {
		return id
	}
	return "…" + u[len(u)-12:]
}
