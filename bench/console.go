package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/console"
)

//go:embed console_seed.sql
var consoleSeedSQL string

// consoleGoalMS is the goal for a console page: p95 of the server's time ≤ 100 ms.
const consoleGoalMS = 100

// consoleWarmups is the requests of each page before its measured ones.
const consoleWarmups = 5

// consoleOrgSize is the accounts of each seeded org (console_seed.sql): the org, 3 teams,
// 16 users and 30 agents.
const consoleOrgSize = 50

// consoleFixture names what the pages are asked about: accounts, an event, an idempotency
// key and the records of the seed.
type consoleFixture struct {
	Big, Small, Other, User, Agent string // accounts
	Prefix, NamePart, Key          string // searches: an id prefix, a legal name's word, an API key id
	Event                          string // an event with an outcome and a correction
	Idem, IdemAccount              string // an idempotency key and the account that sent it
	Run, Webhook                   string
	Invoice, CreditNote            string // "" when the database has none
}

// consolePage is one page the section times: a GET of a console route.
type consolePage struct {
	Name, Route, Path string
}

// pageTiming is a page's measured requests: the server's time (Server-Timing app;dur)
// and the client's (request sent → body read), in ms.
type pageTiming struct {
	consolePage
	N         int     `json:"n"`
	ServerP50 float64 `json:"server_p50_ms"`
	ServerP95 float64 `json:"server_p95_ms"`
	ServerMax float64 `json:"server_max_ms"`
	ClientP50 float64 `json:"client_p50_ms"`
	ClientP95 float64 `json:"client_p95_ms"`
	// AdmitCPUMS is admit's CPU (user + system) per measured request: the console's own
	// work, not PostgreSQL's or Redis's.
	AdmitCPUMS float64 `json:"admit_cpu_ms"`
	Bytes      int     `json:"bytes"`
}

// consoleRound is one round of the console's effect on admission: admit alone, with the
// viewer's tabs, alone again.
type consoleRound struct {
	Alone  admitSample `json:"alone"`
	Viewed admitSample `json:"viewed"`
	Again  admitSample `json:"alone_again"`
	Viewer viewerStats `json:"viewer"`
}

// consoleBench is issue 32's proof of the console's speed: it seeds the bench's database
// with ConsoleAccounts accounts and ConsoleEvents admissions (console_seed.sql), times
// every console page that answers, then measures admission throughput alone against
// throughput while ConsoleTabs signed-in tabs reload the overview and an account page
// every ConsoleRefresh, in interleaved rounds.
func (s *stack) consoleBench(ctx context.Context, res *Results) error {
	raw := map[string]any{}
	res.Raw["console"] = raw
	fix, seeded, err := s.seedConsole(ctx)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	raw["seed"] = seeded
	var steps []string
	for _, st := range seedSteps(consoleSeedSQL) {
		steps = append(steps, fmt.Sprintf("%s %.1f", st.name, seeded[st.name+"_s"]))
	}
	fmt.Fprintf(s.out, "  seeded %.0f accounts and %.0f events in %.1f s (%s), vacuumed and analyzed in %.1f s; admit's cache held them %.1f s after the commit\n",
		seeded["accounts"], seeded["events"], seeded["insert_s"], strings.Join(steps, ", "), seeded["analyze_s"], seeded["cache_loaded_after_s"])

	browser, err := s.consoleSignIn(ctx)
	if err != nil {
		return err
	}
	pages, skipped := consolePages(fix)
	var timings []pageTiming
	for _, p := range pages {
		t, status, err := s.timePage(ctx, browser, p)
		switch {
		case err != nil:
			return fmt.Errorf("%s (%s): %w", p.Name, p.Path, err)
		case status == http.StatusNotImplemented:
			skipped = append(skipped, fmt.Sprintf("%s (%s): 501, not built yet", p.Route, p.Path))
			continue
		case status != http.StatusOK:
			return fmt.Errorf("%s (%s): answered %d", p.Name, p.Path, status)
		}
		timings = append(timings, t)
		fmt.Fprintf(s.out, "  %-24s p50 %6.1f  p95 %6.1f  max %6.1f ms  client p95 %6.1f ms  admit CPU %5.1f ms  n %3d  %s\n",
			t.Name, t.ServerP50, t.ServerP95, t.ServerMax, t.ClientP95, t.AdmitCPUMS, t.N, t.Path)
	}
	for _, k := range skipped {
		fmt.Fprintf(s.out, "  not timed: %s\n", k)
	}
	raw["pages"], raw["not_timed"] = timings, skipped
	if len(timings) == 0 {
		return errors.New("no console page answered 200")
	}
	data := fmt.Sprintf("%.0f accounts, %.0f events", seeded["accounts"], seeded["events"])
	worst := timings[0]
	for _, t := range timings {
		res.add("console_p95_ms_"+t.Name, t.ServerP95, "ms", fmt.Sprintf("≤ %d", consoleGoalMS),
			fmt.Sprintf("Server-Timing app;dur of GET %s, %d sequential requests after %d warm-ups, signed in as admin, %s: p50 %.1f, max %.1f ms; the client's p95 %.1f ms (p50 %.1f); admit's CPU %.1f ms a page; %d bytes",
				t.Path, t.N, consoleWarmups, data, t.ServerP50, t.ServerMax, t.ClientP95, t.ClientP50, t.AdmitCPUMS, t.Bytes))
		if t.ServerP95 > worst.ServerP95 {
			worst = t
		}
	}
	res.add("console_p95_ms_worst_page", worst.ServerP95, "ms", fmt.Sprintf("≤ %d", consoleGoalMS),
		fmt.Sprintf("the slowest of the %d pages timed above (%s, GET %s); %d routes not timed (raw.console.not_timed)",
			len(timings), worst.Name, worst.Path, len(skipped)))

	return s.consoleEffect(ctx, res, fix, raw)
}

// seedConsole runs console_seed.sql in one transaction, analyzes the tables it filled and
// waits until admit's policy cache holds the new accounts.
func (s *stack) seedConsole(ctx context.Context) (consoleFixture, map[string]float64, error) {
	orgs := max(s.cfg.ConsoleAccounts/consoleOrgSize, 2)
	before, err := s.metric(ctx, s.admit.URL(), "metergate_policy_accounts")
	if err != nil {
		return consoleFixture{}, nil, err
	}
	seeded := map[string]float64{"orgs": float64(orgs), "accounts": float64(orgs * consoleOrgSize),
		"events": float64(s.cfg.ConsoleEvents)}
	begin := time.Now()
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select set_config('bench.orgs', $1, true), set_config('bench.events', $2, true)`,
			strconv.Itoa(orgs), strconv.Itoa(s.cfg.ConsoleEvents)); err != nil {
			return err
		}
		for _, st := range seedSteps(consoleSeedSQL) {
			begin := time.Now()
			if _, err := tx.Exec(ctx, st.sql, pgx.QueryExecModeSimpleProtocol); err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			seeded[st.name+"_s"] = time.Since(begin).Seconds()
		}
		return nil
	})
	if err != nil {
		return consoleFixture{}, nil, err
	}
	seeded["insert_s"] = time.Since(begin).Seconds()
	loadBegin := time.Now()
	// VACUUM sets the visibility map and hint bits, as autovacuum would have long since on
	// a deployment holding these rows; ANALYZE gives the planner their statistics.
	for _, t := range []string{"accounts", "api_keys", "billing_details", "usage_events", "usage_outcomes", "adjustments",
		"reconcile_runs", "dead_letters", "audit_log"} {
		if _, err := s.pool.Exec(ctx, "vacuum (analyze) "+t); err != nil {
			return consoleFixture{}, nil, fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	seeded["analyze_s"] = time.Since(loadBegin).Seconds()
	want := before + float64(orgs*consoleOrgSize)
	for {
		n, err := s.metric(ctx, s.admit.URL(), "metergate_policy_accounts")
		if err != nil {
			return consoleFixture{}, nil, err
		}
		if n >= want {
			break
		}
		if time.Since(loadBegin) > 3*time.Minute {
			return consoleFixture{}, nil, fmt.Errorf("admit's cache holds %.0f of %.0f accounts after 3 minutes", n, want)
		}
		select {
		case <-ctx.Done():
			return consoleFixture{}, nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	seeded["cache_loaded_after_s"] = time.Since(loadBegin).Seconds()
	fix, err := s.consoleFixture(ctx, orgs)
	return fix, seeded, err
}

// seedStep is a step of console_seed.sql: its statements from a "-- step: name" line to
// the next.
type seedStep struct{ name, sql string }

func seedSteps(file string) []seedStep {
	var out []seedStep
	for _, part := range strings.Split(file, "\n-- step: ")[1:] {
		name, sql, _ := strings.Cut(part, "\n")
		out = append(out, seedStep{strings.TrimSpace(name), sql})
	}
	return out
}

// consoleOrg is the id of seeded org n (1-based), as console_seed.sql names it.
func consoleOrg(n int) string { return fmt.Sprintf("con-%05d", n) }

// consoleFixture reads from the seeded database what the pages are asked about.
func (s *stack) consoleFixture(ctx context.Context, orgs int) (consoleFixture, error) {
	small := consoleOrg(min(42, orgs))
	f := consoleFixture{Big: consoleOrg(1), Small: small, Other: consoleOrg(min(777, orgs)),
		User: small + "-u5", Agent: small + "-a7",
		Prefix: "con-0004", NamePart: "Robotics", Key: small + "-key"}
	var err error
	for _, x := range []struct {
		dst  *string
		sql  string
		args []any
	}{
		{&f.Event, `select source_event from adjustments where org <> $1 and source_event is not null order by id limit 1`, []any{f.Big}},
		{&f.Idem, `select idempotency_key from usage_events where path @> array[$1] and idempotency_key is not null
			order by event_time desc limit 1`, []any{small}},
		{&f.IdemAccount, `select account from usage_events where path @> array[$1] and idempotency_key = $2`, []any{small, &f.Idem}},
		{&f.Run, `select run_id::text from reconcile_runs order by started_at desc limit 1`, nil},
		{&f.Webhook, `select id from webhook_endpoints where url = 'https://hooks.example/metergate'`, nil},
		{&f.Invoice, `select id::text from invoices order by id desc limit 1`, nil},
		{&f.CreditNote, `select id::text from credit_notes order by id desc limit 1`, nil},
	} {
		if err = s.pool.QueryRow(ctx, x.sql, x.args...).Scan(x.dst); errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		if err != nil {
			return f, err
		}
	}
	if f.Event == "" || f.Idem == "" || f.Run == "" || f.Webhook == "" {
		return f, fmt.Errorf("the seed left no corrected event, idempotency key, run or webhook: %+v", f)
	}
	return f, nil
}

// consolePages is what the section times, one or more pages per GET route of the console
// (console.Routes), and the GET routes it cannot ask (no id to ask for).
func consolePages(f consoleFixture) (pages []consolePage, skipped []string) {
	esc := url.QueryEscape
	byRoute := map[string][]consolePage{
		"GET /console/static/{file}": {{Name: "static_css", Path: "/console/static/console.css"}},
		"GET /console/login":         {{Name: "login_form", Path: "/console/login"}},
		"GET /console/{$}":           {{Name: "overview", Path: "/console/"}},
		"GET /console/accounts": {
			{Name: "accounts_orgs", Path: "/console/accounts"},
			{Name: "accounts_by_id_prefix", Path: "/console/accounts?q=" + esc(f.Prefix)},
			{Name: "accounts_by_legal_name", Path: "/console/accounts?q=" + esc(f.NamePart)},
			{Name: "accounts_by_api_key", Path: "/console/accounts?q=" + esc(f.Key)},
		},
		"GET /console/accounts/{id}": {
			{Name: "account_small_org", Path: "/console/accounts/" + f.Small},
			{Name: "account_big_org", Path: "/console/accounts/" + f.Big},
			{Name: "account_user", Path: "/console/accounts/" + f.User},
			{Name: "account_agent", Path: "/console/accounts/" + f.Agent},
		},
		"GET /console/why": {
			{Name: "why_event", Path: "/console/why?q=" + esc(f.Event)},
			{Name: "why_idempotency_key", Path: "/console/why?q=" + esc(f.Idem) + "&account=" + esc(f.IdemAccount)},
			{Name: "why_api_key", Path: "/console/why?q=" + esc(f.Key)},
		},
		"GET /console/plans":         {{Name: "plans", Path: "/console/plans"}},
		"GET /console/plans/{id}":    {{Name: "plan", Path: "/console/plans/pro"}},
		"GET /console/invoices":      {{Name: "invoices", Path: "/console/invoices"}},
		"GET /console/credit-notes":  {{Name: "credit_notes", Path: "/console/credit-notes"}},
		"GET /console/runs":          {{Name: "runs", Path: "/console/runs"}},
		"GET /console/runs/{id}":     {{Name: "run", Path: "/console/runs/" + f.Run}},
		"GET /console/dead-letters":  {{Name: "dead_letters", Path: "/console/dead-letters"}},
		"GET /console/webhooks":      {{Name: "webhooks", Path: "/console/webhooks"}},
		"GET /console/webhooks/{id}": {{Name: "webhook", Path: "/console/webhooks/" + f.Webhook}},
		"GET /console/audit":         {{Name: "audit", Path: "/console/audit"}},
		"GET /console/staff":         {{Name: "staff", Path: "/console/staff"}},
		"GET /console/sessions":      {{Name: "sessions", Path: "/console/sessions"}},
	}
	if f.Invoice != "" {
		for _, suffix := range []string{"", "/pdf", "/void", "/reissue"} {
			byRoute["GET /console/invoices/{id}"+suffix] = []consolePage{{Name: "invoice" + strings.ReplaceAll(suffix, "/", "_"),
				Path: "/console/invoices/" + f.Invoice + suffix}}
		}
	}
	if f.CreditNote != "" {
		for _, suffix := range []string{"", "/pdf"} {
			byRoute["GET /console/credit-notes/{id}"+suffix] = []consolePage{{Name: "credit_note" + strings.ReplaceAll(suffix, "/", "_"),
				Path: "/console/credit-notes/" + f.CreditNote + suffix}}
		}
	}
	for _, route := range console.Routes {
		if !strings.HasPrefix(route, "GET ") {
			continue
		}
		ps, ok := byRoute[route]
		if !ok {
			skipped = append(skipped, route+": nothing to ask it about in the bench's database (no invoices or credit notes are seeded)")
			continue
		}
		for _, p := range ps {
			p.Route = route
			pages = append(pages, p)
		}
	}
	return pages, skipped
}

// consoleBrowser is a signed-in browser of the console: its cookie jar holds an admin
// session.
type consoleBrowser struct {
	base string
	http *http.Client
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// consoleSignIn signs in to s.admit's console with the admin token, as the login form
// does: GET /console/login for its CSRF field and cookie, then POST the form.
func (s *stack) consoleSignIn(ctx context.Context) (*consoleBrowser, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	b := &consoleBrowser{base: s.admit.URL(), http: &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 2},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	status, body, _, err := b.get(ctx, "/console/login")
	if err != nil {
		return nil, err
	}
	m := csrfField.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		return nil, fmt.Errorf("console login form: %d, no csrf field", status)
	}
	form := url.Values{"token": {adminToken}, "csrf": {m[1]}, "next": {"/console/"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/console/login", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return nil, fmt.Errorf("console sign-in: %d (want 303; is CONSOLE_INSECURE_COOKIES=true in admit's env?)", resp.StatusCode)
	}
	status, _, _, err = b.get(ctx, "/console/staff")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("console sign-in: the session is not sent back (GET /console/staff: %d)", status)
	}
	return b, nil
}

// get fetches path and reads the whole reply: its status, body and the server's time
// (Server-Timing app;dur, ms; NaN when absent).
func (b *consoleBrowser) get(ctx context.Context, path string) (int, string, float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+path, nil)
	if err != nil {
		return 0, "", 0, err
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), serverTiming(resp.Header.Get("Server-Timing")), err
}

// serverTiming reads the app metric's dur from a Server-Timing header ("app;dur=12.3");
// NaN when there is none.
func serverTiming(h string) float64 {
	for _, m := range strings.Split(h, ",") {
		parts := strings.Split(strings.TrimSpace(m), ";")
		if parts[0] != "app" {
			continue
		}
		for _, p := range parts[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "dur="); ok {
				if d, err := strconv.ParseFloat(v, 64); err == nil {
					return d
				}
			}
		}
	}
	return math.NaN()
}

// timePage requests p consoleWarmups times, then ConsoleRequests times in turn (fewer when
// a page is slow: it stops after 5 s once it has 10), and returns the timings; a page
// whose first answer is not 200 is returned with that status and not timed.
func (s *stack) timePage(ctx context.Context, b *consoleBrowser, p consolePage) (pageTiming, int, error) {
	t := pageTiming{consolePage: p}
	for range consoleWarmups {
		status, body, _, err := b.get(ctx, p.Path)
		if err != nil || status != http.StatusOK {
			return t, status, err
		}
		t.Bytes = len(body)
	}
	var server, client []float64
	cpu0, err := procCPU(s.admit.Pid())
	if err != nil {
		return t, 0, err
	}
	begin := time.Now()
	for len(server) < s.cfg.ConsoleRequests && (len(server) < 10 || time.Since(begin) < 5*time.Second) {
		sent := time.Now()
		status, _, dur, err := b.get(ctx, p.Path)
		if err != nil {
			return t, status, err
		}
		if status != http.StatusOK {
			return t, status, fmt.Errorf("answered %d after answering 200", status)
		}
		if math.IsNaN(dur) {
			return t, status, errors.New("no Server-Timing app;dur in the reply")
		}
		client = append(client, float64(time.Since(sent).Microseconds())/1e3)
		server = append(server, dur)
	}
	cpu1, err := procCPU(s.admit.Pid())
	if err != nil {
		return t, 0, err
	}
	t.AdmitCPUMS = float64((cpu1 - cpu0).Microseconds()) / 1e3 / float64(len(server))
	slices.Sort(server)
	slices.Sort(client)
	t.N = len(server)
	t.ServerP50, t.ServerP95, t.ServerMax = nearestRank(server, 50), nearestRank(server, 95), server[len(server)-1]
	t.ClientP50, t.ClientP95 = nearestRank(client, 50), nearestRank(client, 95)
	return t, http.StatusOK, nil
}

// viewerStats is what the viewer's tabs loaded during a sample.
type viewerStats struct {
	Tabs      int            `json:"tabs"`
	Loads     int            `json:"loads"`
	Status    map[string]int `json:"status"`
	Errors    int            `json:"errors"`
	ServerP95 float64        `json:"server_p95_ms"`
	ServerMax float64        `json:"server_max_ms"`
}

// viewer is ConsoleTabs operators' tabs, each signed in on its own, each reloading the
// overview as it auto-refreshes (?refresh=on) and an account page every ConsoleRefresh,
// until stop.
func (s *stack) viewer(ctx context.Context, tabs []*consoleBrowser, accounts []string) (stop func() viewerStats) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	st := viewerStats{Tabs: len(tabs), Status: map[string]int{}}
	var server []float64
	var wg sync.WaitGroup
	for i, tab := range tabs {
		paths := []string{"/console/?refresh=on", "/console/accounts/" + accounts[i%len(accounts)]}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Tabs opened apart, as people do.
			offset := time.Duration(i) * s.cfg.ConsoleRefresh / time.Duration(len(tabs))
			select {
			case <-ctx.Done():
				return
			case <-time.After(offset):
			}
			tick := time.NewTicker(s.cfg.ConsoleRefresh)
			defer tick.Stop()
			for {
				for _, p := range paths {
					status, _, dur, err := tab.get(ctx, p)
					if ctx.Err() != nil {
						return
					}
					mu.Lock()
					st.Loads++
					if err != nil {
						st.Errors++
					} else {
						st.Status[strconv.Itoa(status)]++
						if !math.IsNaN(dur) {
							server = append(server, dur)
						}
					}
					mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	return func() viewerStats {
		cancel()
		wg.Wait()
		if len(server) > 0 {
			slices.Sort(server)
			st.ServerP95, st.ServerMax = nearestRank(server, 95), server[len(server)-1]
		}
		return st
	}
}

// consoleEffect measures admission throughput (the bench's closed loop against the
// default deployment, ConsoleDuration windows) alone, with the viewer's tabs, and alone
// again, in Rounds rounds. Each round gives the viewed sample ÷ the mean of the two alone
// samples around it (a drift over the round cancels) and the second alone sample ÷ the
// first (the same configuration twice: what noise alone does to such a ratio here).
func (s *stack) consoleEffect(ctx context.Context, res *Results, f consoleFixture, raw map[string]any) error {
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	tabs := make([]*consoleBrowser, s.cfg.ConsoleTabs)
	for i := range tabs {
		if tabs[i], err = s.consoleSignIn(ctx); err != nil {
			return err
		}
	}
	accounts := []string{f.Small, f.Big, f.User, f.Other, f.Agent}
	// The same stack and admit, with this section's load windows: shorter than the other
	// sections', and at least a refresh of every tab long.
	window := max(s.cfg.ConsoleDuration, s.cfg.ConsoleRefresh)
	short := *s
	short.cfg.Duration, short.cfg.Warmup = window, min(s.cfg.Warmup, time.Second)
	var rounds []consoleRound
	var effect, aa []float64
	for range s.cfg.Rounds {
		var r consoleRound
		if r.Alone, err = short.admitSample(ctx, s.admit, false, body, s.cfg.Clients); err != nil {
			return err
		}
		stop := s.viewer(ctx, tabs, accounts)
		r.Viewed, err = short.admitSample(ctx, s.admit, false, body, s.cfg.Clients)
		r.Viewer = stop()
		if err != nil {
			return fmt.Errorf("with the viewer: %w", err)
		}
		if r.Again, err = short.admitSample(ctx, s.admit, false, body, s.cfg.Clients); err != nil {
			return err
		}
		rounds = append(rounds, r)
		effect = append(effect, r.Viewed.Load.Rate/((r.Alone.Load.Rate+r.Again.Load.Rate)/2))
		aa = append(aa, r.Again.Load.Rate/r.Alone.Load.Rate)
		fmt.Fprintf(s.out, "  round: alone %.0f/s, with %d tabs %.0f/s (%d page loads, %v, server p95 %.1f ms; admit CPU per decision %.0f µs against %.0f µs alone), alone %.0f/s\n",
			r.Alone.Load.Rate, r.Viewer.Tabs, r.Viewed.Load.Rate, r.Viewer.Loads, r.Viewer.Status, r.Viewer.ServerP95,
			r.Viewed.CPU.Server, r.Alone.CPU.Server, r.Again.Load.Rate)
	}
	raw["effect_rounds"] = rounds
	sameConfig := spreadOf(aa)
	// The noise of a ratio of two samples of one configuration: the farthest from 1 that
	// the rounds' alone ÷ alone came. A slowdown smaller than that is not measurable here.
	noise := 0.0
	for _, v := range aa {
		noise = max(noise, math.Abs(1-v))
	}
	eff := spreadOf(effect)
	tabsWhat := fmt.Sprintf("%d tabs, each signed in and reloading /console/?refresh=on and an account page (%s) every %s",
		s.cfg.ConsoleTabs, strings.Join(accounts[:min(len(accounts), s.cfg.ConsoleTabs)], ", "), s.cfg.ConsoleRefresh)
	res.addSpread("console_viewer_throughput_ratio", eff, "×", "",
		fmt.Sprintf("admit's decisions/s (the bench's closed loop, %d clients, %s windows, relay inside) while %s ÷ the mean of the samples alone just before and after, each round; the same configuration twice (alone ÷ alone) gave %s, so a change within ±%.1f %% is noise here",
			s.cfg.Clients, window, tabsWhat, sameConfig, noise*100))
	// The goal is "none measurable": met when the median lies within the same-config noise.
	fig := &res.Figures[len(res.Figures)-1]
	met := eff.Median >= 1-noise
	fig.Goal, fig.Met = "none measurable", &met
	res.addSpread("console_same_config_throughput_ratio", sameConfig, "×", "",
		"admit's decisions/s alone ÷ alone, the two samples around each round's viewed one: the noise console_viewer_throughput_ratio is read against")
	return nil
}
