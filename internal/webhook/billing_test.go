package webhook_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/webhook"
)

// billingEvent inserts a billing_events row as the invoice code does (id, type, org,
// occurred_at, and the whole CloudEvent as payload) and returns its payload as stored.
func (b *bundle) billingEvent(t *testing.T, id, typ, org, subject string, at time.Time) string {
	t.Helper()
	require.NoError(t, b.insertBillingEvent(id, typ, org, subject, at))
	var stored string
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT payload::text FROM billing_events WHERE id = $1`, id).Scan(&stored))
	return stored
}

func (b *bundle) insertBillingEvent(id, typ, org, subject string, at time.Time) error {
	payload := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"metergate-invoices","type":"io.metergate.%s",`+
		`"subject":%q,"time":%q,"datacontenttype":"application/json","data":{"org":%q,"total_minor":12345}}`,
		id, typ, subject, at.Format(time.RFC3339Nano), org)
	_, err := b.pool.Exec(b.ctx, `INSERT INTO billing_events (id, type, org, occurred_at, payload) VALUES ($1, $2, $3, $4, $5)`,
		id, typ, org, at, payload)
	return err
}

// deliveriesOf counts the deliveries queued for event (to endpoint, or to any when empty).
func (b *bundle) deliveriesOf(t *testing.T, event, endpoint string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_deliveries WHERE event = $1 AND ($2 = '' OR endpoint = $2)`,
		event, endpoint).Scan(&n))
	return n
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// billingTypes are the billing events' types.
var billingTypes = []string{webhook.EventInvoiceIssued, webhook.EventInvoiceStatusChanged, webhook.EventCreditNoteIssued}

// A billing event inserted as the invoice code does reaches every enabled endpoint that
// takes its type and whose account filter is none or its org, once, signed, with its id as
// webhook-id and its payload as body; an endpoint of alerts only, or filtered to another
// account, gets nothing; the same id again is refused, and queues nothing more.
func TestBillingEventsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, ok)
	all, secret := b.endpointOf(t, rc.srv.URL+"/billing", "", billingTypes...)
	rc.setSecret(secret)
	issued := newReceiver(t, ok)
	issuedOnly, issuedSecret := b.endpointOf(t, issued.srv.URL, "acme", webhook.EventInvoiceIssued)
	issued.setSecret(issuedSecret)
	silent := newReceiver(t, ok)
	alertsOnly, _ := b.endpointOf(t, silent.srv.URL+"/alerts", "", webhook.EventThreshold)
	otherOrg, _ := b.endpointOf(t, silent.srv.URL+"/globex", "globex", billingTypes...)
	team, _ := b.endpointOf(t, silent.srv.URL+"/team", "team-a", billingTypes...) // a billing event's path is its org alone
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond})

	at := time.Now()
	events := []struct{ id, typ, subject string }{
		{"invoice.issued/MG-2026-000001", webhook.EventInvoiceIssued, "invoice/MG-2026-000001"},
		{"invoice.status_changed/MG-2026-000001/void", webhook.EventInvoiceStatusChanged, "invoice/MG-2026-000001"},
		{"credit_note.issued/MG-CN-2026-000001", webhook.EventCreditNoteIssued, "credit_note/MG-CN-2026-000001"},
	}
	payloads := map[string]string{}
	for _, ev := range events {
		payloads[ev.id] = b.billingEvent(t, ev.id, ev.typ, "acme", ev.subject, at)
	}
	want := map[string]int{}
	for _, ev := range events {
		b.waitStatus(t, all.ID, ev.id, webhook.StatusDelivered)
		want[ev.id] = 1
	}
	require.Equal(t, want, rc.accepted(), "each billing event once")
	for _, r := range rc.requests() {
		id := r.header.Get(webhook.HeaderID)
		require.Contains(t, payloads, id, "webhook-id is the billing event's id")
		require.Equal(t, payloads[id], string(r.body), "the payload as stored")
		require.NoError(t, webhook.Verify(secret, r.body, r.header))
	}
	ds, err := b.store.Deliveries(b.ctx, all.ID, "", 10)
	require.NoError(t, err)
	require.Len(t, ds, 3)
	for _, d := range ds {
		require.Contains(t, payloads, d.Event)
	}

	b.waitStatus(t, issuedOnly.ID, events[0].id, webhook.StatusDelivered)
	require.Equal(t, map[string]int{events[0].id: 1}, issued.accepted(), "only the type it takes")
	for _, e := range []string{alertsOnly.ID, otherOrg.ID, team.ID} {
		for _, ev := range events {
			require.Zero(t, b.deliveriesOf(t, ev.id, e), "%s queued for endpoint %s", ev.id, e)
		}
	}
	require.Empty(t, silent.requests())

	// Fires once: the same id again is refused by the primary key, and queues nothing.
	err = b.insertBillingEvent(events[0].id, events[0].typ, "acme", events[0].subject, at)
	require.Equal(t, "23505", sqlState(err), "a second insert of %s: %v", events[0].id, err)
	require.Equal(t, 2, b.deliveriesOf(t, events[0].id, ""))
	// A billing event's id never reads as an alert's: webhook-ids stay unique per endpoint.
	err = b.insertBillingEvent("alert/acme/requests/p80/2026-11", webhook.EventInvoiceIssued, "acme", "invoice/X", at)
	require.Equal(t, "23514", sqlState(err), "an id of the alerts' form: %v", err)
	// And an alert is none of a billing endpoint's business.
	alert, _ := b.alert(t, []string{"acme"}, at)
	require.Equal(t, 1, b.deliveriesOf(t, alert, ""))
	require.Equal(t, 1, b.deliveriesOf(t, alert, alertsOnly.ID))
}

// A billing event whose receiver fails is retried until it accepts, with the same
// webhook-id and body; a replay sends it again with the same webhook-id; a range replay
// queues the billing events of that time the endpoint takes, one from before the endpoint
// included, and not another org's.
func TestBillingEventRetriedAndReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rc := newReceiver(t, func(n int, _ *http.Request) int {
		if n == 0 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	t0 := time.Date(2026, 12, 1, 0, 5, 0, 0, time.UTC)
	before := "invoice.issued/MG-2026-000007"
	b.billingEvent(t, before, webhook.EventInvoiceIssued, "acme", "invoice/MG-2026-000007", t0.Add(-time.Hour))
	e, secret := b.endpointOf(t, rc.srv.URL, "acme", billingTypes...)
	rc.setSecret(secret)
	other := "invoice.issued/MG-2026-000008"
	b.billingEvent(t, other, webhook.EventInvoiceIssued, "globex", "invoice/MG-2026-000008", t0.Add(-time.Hour))
	require.Zero(t, b.deliveriesOf(t, before, ""), "no endpoint took it when it fired")
	b.run(t, webhook.DelivererOptions{AllowPrivate: true, Poll: 10 * time.Millisecond,
		BackoffBase: 10 * time.Millisecond, BackoffCap: 40 * time.Millisecond})

	id := "invoice.status_changed/MG-2026-000009/paid"
	payload := b.billingEvent(t, id, webhook.EventInvoiceStatusChanged, "acme", "invoice/MG-2026-000009", t0)
	d := b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	require.Equal(t, 2, d.Attempts)
	require.Equal(t, http.StatusServiceUnavailable, *d.Log[0].Status)
	require.Equal(t, map[string]int{id: 1}, rc.accepted())
	for _, r := range rc.requests() {
		require.Equal(t, id, r.header.Get(webhook.HeaderID))
		require.Equal(t, payload, string(r.body))
		require.NoError(t, webhook.Verify(secret, r.body, r.header))
	}

	_, err := b.store.Replay(b.ctx, e.ID, d.ID)
	require.NoError(t, err)
	eventually(t, b.ctx, func() bool { return rc.accepted()[id] == 2 }, "the replay never arrived")
	d = b.waitStatus(t, e.ID, id, webhook.StatusDelivered)
	require.Equal(t, 3, d.Attempts)
	require.Equal(t, id, d.Event)

	n, err := b.store.ReplayRange(b.ctx, e.ID, t0.Add(-2*time.Hour), t0.Add(time.Second))
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the billing event from before the endpoint and the one delivered")
	b.waitStatus(t, e.ID, before, webhook.StatusDelivered)
	eventually(t, b.ctx, func() bool { return rc.accepted()[id] == 3 }, "the range's replay never arrived")
	require.Equal(t, 1, rc.accepted()[before])
	require.Zero(t, b.deliveriesOf(t, other, ""), "another org's billing event")
	for _, r := range rc.requests() {
		require.Contains(t, []string{id, before}, r.header.Get(webhook.HeaderID))
	}
}

// The store takes every type of webhook.EventTypes, and the database's check takes them
// too (they are written in two places, Go and migration 00023); an unknown type is refused
// before the database.
func TestEndpointEventTypes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, typ := range webhook.EventTypes {
		e, _ := b.endpointOf(t, "https://example.com/"+typ, "", typ)
		require.Equal(t, []string{typ}, e.EventTypes)
	}
	e, _ := b.endpointOf(t, "https://example.com/every", "", webhook.EventTypes...)
	require.Equal(t, webhook.EventTypes, e.EventTypes)
	_, _, err := b.store.CreateEndpoint(b.ctx, webhook.EndpointRequest{URL: "https://example.com/", EventTypes: []string{"invoice.paid.v1"}})
	var inv *webhook.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Equal(t, "event_types", inv.Field)
	require.Contains(t, inv.Message, webhook.EventCreditNoteIssued, "the message names the known types")
}
