package meter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/event"
)

func voidedEvent(t testing.TB, eventID, attempt, reason string, at time.Time) event.CloudEvent {
	t.Helper()
	ev, err := event.New(eventID+event.VoidSuffix, "node-3", event.TypeVoided, "acme", at,
		event.Voided{EventID: eventID, Attempt: attempt, Reason: reason})
	require.NoError(t, err)
	return ev
}

func TestParseVoid(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 10, 47, 46, 851154000, time.UTC)
	p := parse(encode(t, voidedEvent(t, "e1.2.acme", "e9.2.acme", event.VoidCallerGone, at)), 3, 4)
	require.NoError(t, p.err)
	require.Equal(t, &voidRow{EventID: "e1.2.acme", Attempt: "e9.2.acme", Reason: event.VoidCallerGone, VoidTime: at,
		Source: "node-3", Partition: 3, Offset: 4}, p.void)

	for name, ev := range map[string]event.CloudEvent{
		"id not the event's": func() event.CloudEvent {
			ev := voidedEvent(t, "e1.2.acme", "e1.2.acme", event.VoidUnavailable, at)
			ev.ID = "e2.2.acme/void"
			return ev
		}(),
		"unknown reason":  voidedEvent(t, "e1.2.acme", "e1.2.acme", "bored", at),
		"no attempt":      voidedEvent(t, "e1.2.acme", "", event.VoidUnavailable, at),
		"attempt with sp": voidedEvent(t, "e1.2.acme", "e 1", event.VoidUnavailable, at),
	} {
		require.Error(t, parse(encode(t, ev), 0, 0).err, name)
	}
}

// A void reaches usage_voids once however often it is delivered (admit may write it both to
// the outbox and straight to Kafka), and is found by the admission it voids.
func TestVoidsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	now := time.Now().UTC()
	admitted := admittedEvent(t, "v1.0.acme", now, orgPath("acme"), map[string]int64{"requests": 1})
	void := voidedEvent(t, "v1.0.acme", "v1.0.acme", event.VoidUnavailable, now)
	b.produce(t, message(t, "acme", admitted), message(t, "acme", void), message(t, "acme", void),
		message(t, "acme", voidedEvent(t, "v2.0.acme", "v2.0.acme", event.VoidCallerGone, now)))
	m := start(t, b.pool, b.options("g"))
	waitFor(t, b.ctx, "the batch", func() bool { return m.messages() == 4 })
	require.EqualValues(t, 2, m.inserted("usage_voids"))
	require.EqualValues(t, 1, m.duplicates("usage_voids"))
	var reason string
	require.NoError(t, b.pool.QueryRow(b.ctx, `select v.reason from usage_events e join usage_voids v using (event_id)
		where e.event_id = 'v1.0.acme'`).Scan(&reason))
	require.Equal(t, event.VoidUnavailable, reason)
}
