package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/period"
)

// usageEvent inserts one recorded event of path's org in month, billing requests, charged to
// the last account of path (a team when there are two), and returns its id.
func (b *testBundle) usageEvent(t *testing.T, month time.Time, requests int64, path ...string) string {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `SELECT usage_events_partition($1)`, month)
	require.NoError(t, err)
	n := b.count(t, `SELECT count(*) FROM usage_events`)
	id, kind := fmt.Sprintf("ev-%d.%s", n, path[0]), "org"
	if len(path) > 1 {
		kind = "team"
	}
	_, err = b.pool.Exec(b.ctx, `
		INSERT INTO usage_events (event_id, billing_period, event_time, charged_period, org, account, account_kind,
		                          path, source, requests, tokens, late, kafka_partition, kafka_offset)
		VALUES ($1, $2, $3, $2, $4, $5, $6, $7, 'test', $8, 0, false, 0, $9)`,
		id, month, month.Add(36*time.Hour), path[0], path[len(path)-1], kind, path, requests, n)
	require.NoError(t, err)
	return id
}

// teamRow inserts a team of org.
func (b *testBundle) teamRow(t *testing.T, org, id string) string {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'team', $2, $2)`, id, org)
	require.NoError(t, err)
	return id
}

// closeAt closes month as reconcile's close would, issuing as testIssuer, and returns the
// invoices by org.
func (b *testBundle) closeAt(t *testing.T, month time.Time) map[string]invoice.Invoice {
	t.Helper()
	res, err := invoice.Close(b.ctx, b.pool, month, invoice.Options{
		Clock: period.Fixed(month.AddDate(0, 1, 9)), Issuer: testIssuer, By: "api test"})
	require.NoError(t, err)
	out := map[string]invoice.Invoice{}
	for _, inv := range res.Invoices {
		out[inv.Org] = inv
	}
	return out
}

// amend POSTs body to /v1/admin/amendments with the admin token.
func (b *testBundle) amend(t *testing.T, body any) reply {
	t.Helper()
	return b.call(t, "POST", "/v1/admin/amendments", adminToken, body)
}

// amendFixture is acme (19 % tax) and beta with a team, billed for closedMonth.
type amendFixture struct {
	acme, beta, team string
	// billed and wrong are acme's events; own is beta's, teamA and teamB its team's.
	billed, wrong, own, teamA, teamB string
	invoices                         map[string]invoice.Invoice
}

func (b *testBundle) amendFixture(t *testing.T) amendFixture {
	t.Helper()
	f := amendFixture{acme: b.orgRow(t, b.id("acme")), beta: b.orgRow(t, b.id("beta"))}
	f.team = b.teamRow(t, f.beta, b.id("beta-team"))
	r := b.call(t, "PUT", "/v1/admin/accounts/"+f.acme+"/billing", adminToken, map[string]any{
		"legal_name": "Acme AG", "country": "DE", "currency": "EUR", "tax_rate_bp": 1900})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	f.billed = b.usageEvent(t, closedMonth, 6_000_000, f.acme)
	f.wrong = b.usageEvent(t, closedMonth, 400_000, f.acme)
	f.own = b.usageEvent(t, closedMonth, 5_000_000, f.beta)
	f.teamA = b.usageEvent(t, closedMonth, 300_000, f.beta, f.team)
	f.teamB = b.usageEvent(t, closedMonth, 200_000, f.beta, f.team)
	f.invoices = b.closeAt(t, closedMonth)

	// acme, by hand: 6,400,000 requests, 1,400,000 past the 5,000,000 included at 50 per
	// 100,000 = 700; 4,900 + 700 = 5,600; 19 % tax = 1,064; total 6,664.
	acme := f.invoices[f.acme]
	require.Equal(t, []int64{5600, 1064, 6664}, []int64{acme.SubtotalMinor, acme.TaxMinor, acme.TotalMinor})
	// beta: 5,500,000 requests, 500,000 past = 250; 5,150, no tax.
	beta := f.invoices[f.beta]
	require.Equal(t, []int64{5150, 0, 5150}, []int64{beta.SubtotalMinor, beta.TaxMinor, beta.TotalMinor})
	return f
}

// An amendment of a closed period: a void settled by a credit note credits the difference at
// once, a set_units by filter settled on the next invoice is billed by the next close, and
// neither is billed twice.
func TestAmendments(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	f := b.amendFixture(t)

	// acme's 400,000 requests were test traffic: voided, credited at once. March bills
	// 6,000,000 now: 1,000,000 past = 500 against 700 charged, a credit of 200; tax 38;
	// total 238.
	r := b.amend(t, map[string]any{"event_ids": []string{f.wrong}, "action": "void", "reason": "test traffic",
		"settle": "credit_note"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	var am invoice.Amended
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &am))
	require.Positive(t, am.ID)
	require.Equal(t, f.acme, am.Org)
	require.Equal(t, "2025-03-01", am.Period)
	require.Equal(t, 1, am.Events)
	require.WithinDuration(t, time.Now(), am.AmendedAt, time.Minute)
	note := am.CreditNote
	require.NotNil(t, note, r.Raw)
	require.Regexp(t, `^MG-CN-[0-9]{4}-[0-9]{6}$`, note.Number)
	require.Equal(t, "amendment", note.Kind)
	require.Equal(t, am.ID, *note.AmendmentID)
	require.Equal(t, f.invoices[f.acme].ID, note.InvoiceID)
	require.Equal(t, f.invoices[f.acme].Number, note.InvoiceNumber)
	require.Equal(t, []int64{200, 1900, 38, 238}, []int64{note.SubtotalMinor, int64(note.TaxRateBP), note.TaxMinor, note.TotalMinor})
	require.Equal(t, "test traffic", note.Reason)
	require.Equal(t, "admin", note.IssuedBy)
	require.Len(t, note.Lines, 1)
	l := note.Lines[0]
	require.Equal(t, []any{"adjustment", "requests", int64(400_000), int64(200), "2025-03-01"},
		[]any{l.Kind, l.Unit, l.Quantity, l.AmountMinor, l.ForPeriod})

	var notes struct {
		CreditNotes []invoice.CreditNote `json:"credit_notes"`
	}
	b.getJSON(t, "/v1/admin/credit-notes?org="+f.acme, &notes)
	require.Len(t, notes.CreditNotes, 1)
	require.Equal(t, note.Number, notes.CreditNotes[0].Number)
	require.Equal(t, int64(238), notes.CreditNotes[0].TotalMinor)

	// beta's team was double-counted: its two events bill 50,000 requests each, settled on
	// the next invoice. Only the team's events are amended, not beta's own.
	r = b.amend(t, map[string]any{"org": f.beta, "period": "2025-03", "account": f.team, "action": "set_units",
		"units": map[string]any{"requests": 50_000}, "reason": "double-counted retries", "settle": "next_invoice"})
	require.Equal(t, http.StatusCreated, r.Status, r.Raw)
	am = invoice.Amended{}
	require.NoError(t, json.Unmarshal([]byte(r.Raw), &am))
	require.Equal(t, f.beta, am.Org)
	require.Equal(t, "2025-03-01", am.Period)
	require.Equal(t, 2, am.Events)
	require.Nil(t, am.CreditNote)
	require.NotContains(t, r.Raw, "credit_note")
	require.EqualValues(t, 2, b.count(t, `SELECT count(*) FROM amendment_events WHERE amendment_id = $1 AND event_id = ANY($2)`,
		am.ID, []string{f.teamA, f.teamB}))
	require.EqualValues(t, 1, b.count(t, `SELECT count(*) FROM amendments WHERE id = $1 AND amended_by = 'admin'
		AND action = 'set_units' AND requests = 50000 AND tokens IS NULL AND settle = 'next_invoice'`, am.ID))

	// April's close bills beta's correction once: March bills 5,100,000 now, 100,000 past =
	// 50 against 250 charged: -200; 4,900 - 200 = 4,700. acme's credit note settled its
	// difference: April is the base fee alone, 4,900 + 931 tax = 5,831.
	april := b.closeAt(t, closedMonth.AddDate(0, 1, 0))
	beta := april[f.beta]
	require.Equal(t, []int64{4700, 0, 4700}, []int64{beta.SubtotalMinor, beta.TaxMinor, beta.TotalMinor})
	var lines []string
	for _, l := range beta.Lines {
		lines = append(lines, fmt.Sprintf("%s %s %d %d %s", l.Kind, l.Unit, l.Quantity, l.AmountMinor, l.ForPeriod))
	}
	require.Equal(t, []string{"base_fee  1 4900 ", "included requests 0 0 ", "included tokens 0 0 ",
		"adjustment requests -400000 -200 2025-03-01"}, lines)
	acme := april[f.acme]
	require.Equal(t, []int64{4900, 931, 5831}, []int64{acme.SubtotalMinor, acme.TaxMinor, acme.TotalMinor})
	require.Zero(t, b.errors.Load(), "nothing logged an error")
}

// Bad input is a 4xx with a code, never a 500, and writes nothing.
func TestAmendmentsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{bare: true, invoices: true})
	f := b.amendFixture(t)
	open := b.usageEvent(t, closedMonth.AddDate(0, 1, 0), 1, f.acme)
	r := b.call(t, "POST", fmt.Sprintf("/v1/admin/invoices/%d/void", f.invoices[f.beta].ID), adminToken,
		map[string]any{"reason": "billed in error"})
	require.Equal(t, http.StatusOK, r.Status, r.Raw)
	written := func() int64 {
		return b.count(t, `SELECT (SELECT count(*) FROM amendments) + (SELECT count(*) FROM amendment_events)
			+ (SELECT count(*) FROM credit_notes)`)
	}
	before := written()

	body := func(kv ...any) map[string]any {
		m := map[string]any{"event_ids": []string{f.wrong}, "action": "void", "reason": "x", "settle": "next_invoice"}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return m
	}
	filter := func(kv ...any) map[string]any {
		return body(append([]any{"event_ids", nil, "org", f.acme, "period", "2025-03"}, kv...)...)
	}
	setUnits := func(units any, kv ...any) map[string]any {
		return body(append([]any{"action", "set_units", "units", units}, kv...)...)
	}
	many := make([]string, invoice.MaxAmendEvents+1)
	for i := range many {
		many[i] = fmt.Sprintf("e%d", i)
	}
	for _, tt := range []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"unknown event", body("event_ids", []string{"no-such-event"}), 404, "unknown_event"},
		{"one of two unknown", body("event_ids", []string{f.wrong, "no-such-event"}), 404, "unknown_event"},
		{"filter matching nothing", filter("period", "2025-02"), 404, "unknown_event"},
		{"account matching nothing", filter("account", f.team), 404, "unknown_event"},
		{"the first month there is", filter("period", "0000-01"), 404, "unknown_event"},
		{"the last month there is", filter("period", "9999-12"), 404, "unknown_event"},
		{"open period", body("event_ids", []string{open}), 409, "period_open"},
		{"open period by filter", filter("period", "2025-04"), 409, "period_open"},
		{"an increase by credit note", setUnits(map[string]any{"requests": 500_000}, "settle", "credit_note"), 409, "not_a_credit"},
		{"a credit note of a void invoice", body("event_ids", []string{f.own}, "settle", "credit_note"), 409, "no_live_invoice"},
		{"events of two orgs", body("event_ids", []string{f.wrong, f.own}), 400, "invalid_amendment"},
		{"event_ids and a filter", body("org", f.acme, "period", "2025-03"), 400, "invalid_amendment"},
		{"event_ids and an account", body("account", f.acme), 400, "invalid_amendment"},
		{"neither", body("event_ids", nil), 400, "invalid_amendment"},
		{"a filter without a period", filter("period", nil), 400, "invalid_amendment"},
		{"a filter without an org", filter("org", nil), 400, "invalid_amendment"},
		{"no event ids", body("event_ids", []string{}), 400, "invalid_amendment"},
		{"too many event ids", body("event_ids", many), 400, "invalid_amendment"},
		{"an event id too long", body("event_ids", []string{strings.Repeat("e", invoice.MaxEventID+1)}), 400, "invalid_event_id"},
		{"an empty event id", body("event_ids", []string{""}), 400, "invalid_event_id"},
		{"an event id with a space", body("event_ids", []string{"ev 1"}), 400, "invalid_event_id"},
		{"units out of range", setUnits(map[string]any{"requests": invoice.MaxUnits + 1}), 400, "invalid_units"},
		{"units negative", setUnits(map[string]any{"tokens": -1}), 400, "invalid_units"},
		{"units a fraction", `{"event_ids":["` + f.wrong + `"],"action":"set_units","units":{"requests":1.0},"reason":"x","settle":"next_invoice"}`,
			400, "invalid_units"},
		{"unknown unit", setUnits(map[string]any{"gpus": 1}), 400, "unknown_unit"},
		{"set_units without units", body("action", "set_units"), 400, "invalid_amendment"},
		{"set_units with no unit", setUnits(map[string]any{}), 400, "invalid_amendment"},
		{"a void with units", setUnits(map[string]any{"requests": 1}, "action", "void"), 400, "invalid_amendment"},
		{"a void with no unit", setUnits(map[string]any{}, "action", "void"), 400, "invalid_amendment"},
		{"unknown action", body("action", "delete"), 400, "invalid_amendment"},
		{"no action", body("action", nil), 400, "invalid_amendment"},
		{"unknown settle", body("settle", "invoice"), 400, "invalid_amendment"},
		{"no settle", body("settle", nil), 400, "invalid_amendment"},
		{"no reason", body("reason", nil), 400, "invalid_reason"},
		{"blank reason", body("reason", " \n"), 400, "invalid_reason"},
		{"period not a month", filter("period", "2025-13"), 400, "invalid_period"},
		{"period a day", filter("period", "2025-03-01"), 400, "invalid_period"},
		{"bad org", filter("org", "-acme"), 400, "invalid_org"},
		{"bad account", filter("account", "a b"), 400, "invalid_account"},
		{"unknown field", body("by", "me"), 400, "unknown_field"},
		{"duplicate key", `{"event_ids":["a"],"event_ids":["b"],"action":"void","reason":"x","settle":"next_invoice"}`, 400, "duplicate_key"},
		{"not JSON", `event_ids=a`, 400, "invalid_json"},
	} {
		r := b.amend(t, tt.body)
		require.Equal(t, tt.status, r.Status, "%s: %s", tt.name, r.Raw)
		require.Equal(t, tt.code, errCode(r), "%s: %s", tt.name, r.Raw)
	}
	require.Equal(t, before, written(), "bad input writes nothing")

	// The most event ids an amendment takes, each as long as it may be: the body is read
	// (about 2 MB), and the events are looked up.
	most := make([]string, invoice.MaxAmendEvents)
	for i := range most {
		most[i] = fmt.Sprintf("%0200d", i)
	}
	r = b.amend(t, body("event_ids", most))
	require.Equal(t, http.StatusNotFound, r.Status, "%.300s", r.Raw)
	require.Equal(t, "unknown_event", errCode(r))
	r = b.amend(t, `{"event_ids":["`+f.wrong+`"],"action":"void","reason":"`+strings.Repeat(" ", api.MaxAmendmentBodyBytes)+`x","settle":"next_invoice"}`)
	require.Equal(t, http.StatusBadRequest, r.Status, "%.300s", r.Raw)
	require.Equal(t, "body_too_large", errCode(r))

	// The admin token alone; no store, 503.
	valid := body()
	require.Equal(t, http.StatusUnauthorized, b.call(t, "POST", "/v1/admin/amendments", "", valid).Status)
	require.Equal(t, http.StatusForbidden, b.call(t, "POST", "/v1/admin/amendments", serviceToken, valid).Status)
	none := setup(t, setupOpts{bare: true})
	r = none.call(t, "POST", "/v1/admin/amendments", adminToken, valid)
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Equal(t, "unavailable", errCode(r))

	require.Equal(t, before, written(), "bad input writes nothing")
	require.Zero(t, b.errors.Load(), "no client input is a server error")
}
