package meter

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/pkg/event"
)

// alertMessage renders an alert entry as the admission script writes it (lua/admit.lua,
// "Alerts") through the relay's renderer: the meter reads what the relay sends.
func alertMessage(t *testing.T, entry string) kafka.Message {
	t.Helper()
	key, value, err := wire.OutboxMessage(map[string]any{"a": entry})
	require.NoError(t, err)
	return kafka.Message{Key: []byte(key), Value: value}
}

// Thresholds are in usage_alerts as the relay rendered them, one row per threshold however
// often delivered; one that contradicts itself is a dead letter.
func TestThresholdsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	org := b.name
	team := org + "-team"
	now := time.Now().UTC().Truncate(time.Microsecond)
	label := period.MonthLabel(now)
	grant := "gr_0123456789abcdef0123456789abcdef"
	// The compact usage event of the crossing request, up to its period (13 fields).
	head := func(id string) string {
		return "1|" + id + "|node-1|||llm_call|tokens=10|" + org + "|pro|" + org + ":org/" + team + ":team|" +
			itoa(now.Unix()) + "|" + itoa(int64(now.Nanosecond()/1000)) + "|" + label
	}
	quota := alertMessage(t, head(org+".e1")+"|"+org+":tokens|p80|800|805|"+label+"|1")
	balance := alertMessage(t, head(org+".e2")+"|"+team+":credits|b30|30|23|"+grant+"|1")
	refused := alertMessage(t, head(org+".e3")+"|"+org+":tokens|p100|1000|995|"+label+"|0")
	var bad event.CloudEvent
	require.NoError(t, json.Unmarshal(balance.Value, &bad))
	bad.ID = "alert/other"
	bad.Data = []byte(`{"org":"` + org + `","account":"` + org + `","path":[{"account":"` + org + `","kind":"org"}],"unit":"tokens",` +
		`"kind":"quota_percent","threshold":80,"at":8,"value":8,"period":"` + label + `","grant":"` + grant + `","event_id":"x","admitted":true}`)
	msgs := []kafka.Message{quota, balance, quota, refused, message(t, org, bad)}
	b.produce(t, msgs...)

	m := start(t, b.pool, b.options("a"))
	waitFor(t, b.ctx, "the batch", func() bool { return m.messages() == int64(len(msgs)) })
	require.EqualValues(t, 3, m.inserted("usage_alerts"))
	require.EqualValues(t, 1, m.duplicates("usage_alerts"))
	require.EqualValues(t, 1, m.inserted("dead_letters"), "a quota's threshold naming a grant")

	type row struct {
		ID, Org, Account, Path, Unit, Kind string
		Threshold, At, Value               int64
		Period, Grant, TriggeredBy         string
		Admitted                           bool
		EventTime                          time.Time
	}
	rs, err := b.pool.Query(b.ctx, `select id, org, account, array_to_string(path, '/'), unit, kind, threshold, at_units, value,
		period, coalesce(arming_grant, ''), triggered_by, admitted, event_time from usage_alerts where org = $1 order by triggered_by`, org)
	require.NoError(t, err)
	var got []row
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.ID, &r.Org, &r.Account, &r.Path, &r.Unit, &r.Kind, &r.Threshold, &r.At, &r.Value,
			&r.Period, &r.Grant, &r.TriggeredBy, &r.Admitted, &r.EventTime))
		r.EventTime = r.EventTime.UTC()
		got = append(got, r)
	}
	require.NoError(t, rs.Err())
	require.Equal(t, []row{
		{event.ThresholdID(org, "tokens", "p80", label), org, org, org, "tokens", "quota_percent", 80, 800, 805, label, "", org + ".e1", true, now},
		{event.ThresholdID(team, "credits", "b30", grant), org, team, org + "/" + team, "credits", "balance_below", 30, 30, 23, label, grant, org + ".e2", true, now},
		{event.ThresholdID(org, "tokens", "p100", label), org, org, org, "tokens", "quota_percent", 100, 1000, 995, label, "", org + ".e3", false, now},
	}, got)
	var payload []byte
	require.NoError(t, b.pool.QueryRow(b.ctx, `select payload::text from usage_alerts where triggered_by = $1`, org+".e2").Scan(&payload))
	require.JSONEq(t, string(balance.Value), string(payload), "the CloudEvent as sent")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
