package meter

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/pkg/event"
)

// An admission that shadow mode let pass is a row like any other, with the refusal it
// would have had; an unknown refusal is a dead letter.
func TestShadowRefusalIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	org := b.name
	path := orgPath(org)
	now := time.Now().UTC().Truncate(time.Microsecond)
	ev := func(id, refusal string) event.CloudEvent {
		e, err := event.New(b.name+"."+id, "node-1", event.TypeAdmitted, event.Subject(path), now, event.Admitted{
			Org: org, Account: path[2].Account, Path: path, Units: map[string]int64{"requests": 1},
			Period: period.MonthLabel(now), Plan: "pro", ShadowRefusal: refusal})
		require.NoError(t, err)
		return e
	}
	msgs := []kafka.Message{message(t, org, ev("a", "rate_limited")), message(t, org, ev("b", "")),
		message(t, org, ev("c", "quota_exceeded")), message(t, org, ev("d", "maybe"))}
	b.produce(t, msgs...)
	m := start(t, b.pool, b.options("a"))
	waitFor(t, b.ctx, "the batch", func() bool { return m.messages() == int64(len(msgs)) })
	require.EqualValues(t, 1, m.inserted("dead_letters"), "an unknown refusal")
	rows, err := b.pool.Query(b.ctx, `select event_id, coalesce(shadow_refusal, '') from usage_events where org = $1 order by event_id`, org)
	require.NoError(t, err)
	got := map[string]string{}
	for rows.Next() {
		var id, r string
		require.NoError(t, rows.Scan(&id, &r))
		got[id] = r
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]string{b.name + ".a": "rate_limited", b.name + ".b": "", b.name + ".c": "quota_exceeded"}, got)
}
