package console

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/staff"
	"github.com/metergate/metergate/internal/webhook"
)

var (
	//go:embed sql/reconcile_runs.sql
	reconcileRunsSQL string
	//go:embed sql/reconcile_run.sql
	reconcileRunSQL string
	//go:embed sql/run_adjustments.sql
	runAdjustmentsSQL string
	//go:embed sql/dead_letters.sql
	deadLettersSQL string
)

// The first page's cursors: before every run, every dead letter.
var (
	endOfTime = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	maxRunID  = uuid.Max
)

const (
	// adjustmentsPage is how many adjustments a run's page shows at once.
	adjustmentsPage = 100
	// deadLettersPage is how many dead letters a page shows at once.
	deadLettersPage = 100
	// valueHead is how much of a dead letter's key and value is read and shown.
	valueHead = 2048
	// binaryHead is how much of a value that is not text is shown, as a hex dump (about
	// four times as long).
	binaryHead = 512
)

// opsPages are the pages of reconcile runs, dead letters, webhooks and the audit log.
func (c *Console) opsPages() map[string]page {
	return map[string]page{
		"GET /console/runs":                                        c.runsPage,
		"GET /console/runs/{id}":                                   c.runPage,
		"GET /console/dead-letters":                                c.deadLettersPage,
		"GET /console/webhooks":                                    c.webhooksPage,
		"GET /console/webhooks/{id}":                               c.webhookPage,
		"GET /console/audit":                                       c.auditPage,
		"POST /console/webhooks/{id}/deliveries/{delivery}/replay": c.replayDelivery,
	}
}

// kv is one key of a JSON object, its value as compact JSON text.
type kv struct{ Key, Value string }

// runRow is a reconcile run.
type runRow struct {
	ID          string
	Started     time.Time
	Finished    *time.Time
	DryRun      bool
	Summary     []kv
	Adjustments int64
}

// summaryOf lists a run's summary (a JSON object) key by key, each value cut at limit
// bytes; a summary that is not an object is one row.
func summaryOf(raw []byte, limit int) []kv {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return []kv{{Key: "summary", Value: truncate(string(raw), limit)}}
	}
	out := make([]kv, 0, len(m))
	for k, v := range m {
		var b bytes.Buffer
		if json.Compact(&b, v) != nil {
			b.Reset()
			b.Write(v)
		}
		out = append(out, kv{Key: k, Value: truncate(b.String(), limit)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// truncate cuts s to at most n bytes, on a character's boundary, marking the cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func scanRun(summaryLimit int) pgx.RowToFunc[runRow] {
	return func(r pgx.CollectableRow) (runRow, error) {
		var x runRow
		var summary []byte
		err := r.Scan(&x.ID, &x.Started, &x.Finished, &x.DryRun, &summary, &x.Adjustments)
		x.Summary = summaryOf(summary, summaryLimit)
		return x, err
	}
}

// runs reads the reconcile runs started before (beforeAt, beforeID), newest first.
func (c *Console) runs(ctx context.Context, beforeAt time.Time, beforeID uuid.UUID, limit int) ([]runRow, error) {
	rows, err := c.cfg.Pool.Query(ctx, reconcileRunsSQL, pgx.StrictNamedArgs{"before_at": beforeAt,
		"before_id": beforeID.String(), "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("reconcile runs: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanRun(200))
	if err != nil {
		return nil, fmt.Errorf("reconcile runs: %w", err)
	}
	return list, nil
}

// runsPage lists the reconcile runs, newest first, a page at a time: ?at=&id= is the run
// the previous page ended with.
func (c *Console) runsPage(w http.ResponseWriter, r *http.Request, v *view) {
	q := r.URL.Query()
	beforeAt, beforeID := endOfTime, maxRunID
	if q.Has("at") || q.Has("id") {
		at, err := time.Parse(time.RFC3339Nano, q.Get("at"))
		id, err2 := uuid.Parse(q.Get("id"))
		if err != nil || err2 != nil {
			c.fail(w, r, v, http.StatusBadRequest, "That is not a page of this list.")
			return
		}
		beforeAt, beforeID = at, id
	}
	list, err := c.runs(r.Context(), beforeAt, beforeID, pageSize+1)
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	var next string
	if len(list) > pageSize {
		list = list[:pageSize]
		last := list[pageSize-1]
		next = "/console/runs?" + url.Values{"at": {last.Started.UTC().Format(time.RFC3339Nano)}, "id": {last.ID}}.Encode()
	}
	v.Title, v.Nav = "Reconcile runs", "runs"
	c.render(w, r, v, http.StatusOK, "runs", struct {
		Runs []runRow
		Next string
	}{list, next})
}

// adjustment is a correction a reconcile run made to a quota counter.
type adjustment struct {
	ID                              int64
	Kind, Org, Account, Level, Unit string
	QuotaPeriod                     string
	Period                          time.Time
	Amount                          int64
	RedisBefore, RedisAfter         *int64
	Reason, SourceEvent             string
	Created                         time.Time
	Applied                         *time.Time
}

// runPage is a reconcile run with its adjustments, a page at a time (?after= the last id
// of the previous page).
func (c *Console) runPage(w http.ResponseWriter, r *http.Request, v *view) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		c.fail(w, r, v, http.StatusNotFound, "There is no such reconcile run.")
		return
	}
	var after int64
	if s := r.URL.Query().Get("after"); s != "" {
		if after, err = strconv.ParseInt(s, 10, 64); err != nil || after < 0 {
			c.fail(w, r, v, http.StatusBadRequest, "That is not a page of this list.")
			return
		}
	}
	ctx := r.Context()
	rows, err := c.cfg.Pool.Query(ctx, reconcileRunSQL, pgx.StrictNamedArgs{"run_id": id.String()})
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	run, err := pgx.CollectExactlyOneRow(rows, scanRun(valueHead))
	if errors.Is(err, pgx.ErrNoRows) {
		c.fail(w, r, v, http.StatusNotFound, "There is no such reconcile run.")
		return
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	rows, err = c.cfg.Pool.Query(ctx, runAdjustmentsSQL, pgx.StrictNamedArgs{"run_id": id.String(), "after": after,
		"limit": adjustmentsPage + 1})
	var adjs []adjustment
	if err == nil {
		adjs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (adjustment, error) {
			var a adjustment
			err := r.Scan(&a.ID, &a.Kind, &a.Org, &a.Account, &a.Level, &a.Unit, &a.QuotaPeriod, &a.Period, &a.Amount,
				&a.RedisBefore, &a.RedisAfter, &a.Reason, &a.SourceEvent, &a.Created, &a.Applied)
			return a, err
		})
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	var next int64
	if len(adjs) > adjustmentsPage {
		adjs = adjs[:adjustmentsPage]
		next = adjs[adjustmentsPage-1].ID
	}
	v.Title, v.Nav = "Reconcile run "+run.ID, "runs"
	c.render(w, r, v, http.StatusOK, "run", struct {
		Run         runRow
		Adjustments []adjustment
		After, Next int64
	}{run, adjs, after, next})
}

// deadLetter is a Kafka message the meter could not parse.
type deadLetter struct {
	ID         int64
	Topic      string
	Partition  int32
	Offset     int64
	Error      string
	ReceivedAt time.Time
	Bytes      int64
	Key        string
	Value      preview
}

// preview is the start of a message, for people: its text when it is UTF-8, else a hex
// dump of its first bytes.
type preview struct {
	Text   string
	Binary bool
	Cut    bool // only the start is shown
}

// previewOf shows head, the first bytes of a value of size bytes.
func previewOf(head []byte, size int64) preview {
	cut := int64(len(head)) < size
	text := head
	if cut {
		// The read may have cut a character in two.
		for i := 0; i < utf8.UTFMax-1 && len(text) > 0 && !utf8.Valid(text); i++ {
			text = text[:len(text)-1]
		}
	}
	if utf8.Valid(text) {
		return preview{Text: string(text), Cut: cut}
	}
	if len(head) > binaryHead {
		head, cut = head[:binaryHead], true
	}
	return preview{Text: hex.Dump(head), Binary: true, Cut: cut}
}

// keyText is a message's key: its text when it is UTF-8, else its hex.
func keyText(key []byte) string {
	if utf8.Valid(key) {
		return string(key)
	}
	return "0x" + hex.EncodeToString(key)
}

// deadLettersPage lists the dead letters, newest first, a page at a time (?before= the
// last id of the previous page).
func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request, v *view) {
	before := int64(math.MaxInt64)
	if s := r.URL.Query().Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			c.fail(w, r, v, http.StatusBadRequest, "That is not a page of this list.")
			return
		}
		before = n
	}
	rows, err := c.cfg.Pool.Query(r.Context(), deadLettersSQL, pgx.StrictNamedArgs{"before": before,
		"limit": deadLettersPage + 1, "head": valueHead})
	var list []deadLetter
	if err == nil {
		list, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) {
			var d deadLetter
			var key, value []byte
			err := r.Scan(&d.ID, &d.Topic, &d.Partition, &d.Offset, &d.Error, &d.ReceivedAt, &d.Bytes, &value, &key)
			d.Key, d.Value = keyText(key), previewOf(value, d.Bytes)
			return d, err
		})
	}
	if err != nil {
		c.unavailable(w, r, v, err)
		return
	}
	var next int64
	if len(list) > deadLettersPage {
		list = list[:deadLettersPage]
		next = list[deadLettersPage-1].ID
	}
	v.Title, v.Nav = "Dead letters", "dead-letters"
	c.render(w, r, v, http.StatusOK, "dead_letters", struct {
		DeadLetters []deadLetter
		Next        int64
	}{list, next})
}

// webhooksPage lists the webhook endpoints.
func (c *Console) webhooksPage(w http.ResponseWriter, r *http.Request, v *view) {
	var list struct {
		Webhooks []webhook.Endpoint `json:"webhooks"`
	}
	if err := v.call(r.Context(), http.MethodGet, "/v1/admin/webhooks", nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	v.Title, v.Nav = "Webhooks", "webhooks"
	c.render(w, r, v, http.StatusOK, "webhooks", list.Webhooks)
}

// deliveryStatuses are the statuses a delivery list filters by ("": every one).
var deliveryStatuses = []string{"", webhook.StatusPending, webhook.StatusDelivered, webhook.StatusFailed}

// deliveryLimits are the list's sizes offered, the first the default.
var deliveryLimits = []int{100, webhook.MaxList}

// webhookPage is a webhook endpoint and its deliveries, newest first, filtered by
// ?status= and as many as ?limit= (what the admin API offers).
func (c *Console) webhookPage(w http.ResponseWriter, r *http.Request, v *view) {
	id := r.PathValue("id")
	q := r.URL.Query()
	status, limit := q.Get("status"), deliveryLimits[0]
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			c.fail(w, r, v, http.StatusBadRequest, "The number of deliveries to show is a whole number.")
			return
		}
		limit = n
	}
	ctx := r.Context()
	var ep webhook.Endpoint
	if err := v.call(ctx, http.MethodGet, "/v1/admin/webhooks/"+url.PathEscape(id), nil, &ep); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	var list struct {
		Deliveries []webhook.Delivery `json:"deliveries"`
	}
	query := url.Values{"limit": {strconv.Itoa(limit)}}
	if status != "" {
		query.Set("status", status)
	}
	if err := v.call(ctx, http.MethodGet, "/v1/admin/webhooks/"+url.PathEscape(id)+"/deliveries?"+query.Encode(), nil, &list); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	if d, err := strconv.ParseInt(q.Get("replayed"), 10, 64); err == nil {
		v.Flash = fmt.Sprintf("Delivery %d is queued again, due now.", d)
	}
	v.Title, v.Nav = "Webhook "+ep.ID, "webhooks"
	c.render(w, r, v, http.StatusOK, "webhook", struct {
		Endpoint   webhook.Endpoint
		Deliveries []webhook.Delivery
		Status     string
		Limit      int
		Statuses   []string
		Limits     []int
	}{ep, list.Deliveries, status, limit, deliveryStatuses, deliveryLimits})
}

// replayDelivery queues a delivery again through the admin API and goes back to its
// endpoint's page.
func (c *Console) replayDelivery(w http.ResponseWriter, r *http.Request, v *view) {
	id, delivery := r.PathValue("id"), r.PathValue("delivery")
	if err := v.call(r.Context(), http.MethodPost, "/v1/admin/webhooks/"+url.PathEscape(id)+"/deliveries/"+
		url.PathEscape(delivery)+"/replay", nil, nil); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	seeOther(w, r, "/console/webhooks/"+url.PathEscape(id)+"?"+url.Values{"replayed": {delivery}}.Encode())
}

// auditRow is an entry of the audit log, its before and after pretty-printed.
type auditRow struct {
	staff.Entry
	Name          string // the actor's name, when it is a staff member
	Before, After string
}

// pretty indents a JSON document, its strings as they were written (not the \u003c of
// Go's encoder: the page escapes them); one that is not JSON is shown as it is.
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var doc any
	if d.Decode(&doc) != nil {
		return string(raw)
	}
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	e.SetIndent("", "  ")
	if e.Encode(doc) != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// auditPage is the audit log, newest first, through the admin API: filtered by ?actor=, a
// page at a time (?before= the id the previous page ended with).
func (c *Console) auditPage(w http.ResponseWriter, r *http.Request, v *view) {
	q := r.URL.Query()
	actor, before := strings.TrimSpace(q.Get("actor")), q.Get("before")
	query := url.Values{"limit": {strconv.Itoa(pageSize)}}
	if actor != "" {
		query.Set("actor", actor)
	}
	if before != "" {
		query.Set("before", before)
	}
	ctx := r.Context()
	var log struct {
		Entries    []staff.Entry `json:"entries"`
		NextBefore *int64        `json:"next_before"`
	}
	if err := v.call(ctx, http.MethodGet, "/v1/admin/audit?"+query.Encode(), nil, &log); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	var members struct {
		Staff []staff.Member `json:"staff"`
	}
	if err := v.call(ctx, http.MethodGet, "/v1/admin/staff", nil, &members); err != nil {
		c.apiFailed(w, r, v, err)
		return
	}
	names := map[string]string{staff.AdminToken: "the admin token"}
	for _, m := range members.Staff {
		names[m.ID] = m.Name
	}
	list := make([]auditRow, 0, len(log.Entries))
	for _, e := range log.Entries {
		list = append(list, auditRow{Entry: e, Name: names[e.Actor], Before: pretty(e.Before), After: pretty(e.After)})
	}
	var next string
	if log.NextBefore != nil {
		nq := url.Values{"before": {strconv.FormatInt(*log.NextBefore, 10)}}
		if actor != "" {
			nq.Set("actor", actor)
		}
		next = "/console/audit?" + nq.Encode()
	}
	v.Title, v.Nav = "Audit log", "audit"
	c.render(w, r, v, http.StatusOK, "audit", struct {
		Actor   string
		Entries []auditRow
		Next    string
	}{actor, list, next})
}
