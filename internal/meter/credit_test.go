package meter

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// creditEvent is an admission of one request of path's account at at that drew cs.
func creditEvent(t testing.TB, id string, at time.Time, path []event.PathNode, cs ...event.CreditDraw) event.CloudEvent {
	t.Helper()
	ev, err := event.New(id, "node-1", event.TypeAdmitted, event.Subject(path), at, event.Admitted{
		Org: path[0].Account, Account: path[len(path)-1].Account, Path: path,
		Units: map[string]int64{"requests": 1, "tokens": 1200, "cost_micros": 1500}, Period: period.MonthLabel(at), Plan: "pro", Credits: cs,
	})
	require.NoError(t, err)
	return ev
}

// The credit draws of an admission are in credit_consumptions as sent, one row per draw
// however often the admission is delivered (twice to one group, then again to a second
// group); an admission with a malformed draw is a dead letter and draws nothing; and
// finance_credit_grants counts the draws of a grant as consumed.
func TestCreditDrawsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	org := b.name
	path := orgPath(org)
	team := path[1].Account
	now := time.Now().UTC().Truncate(time.Microsecond)
	month := period.MonthStart(now)
	id := func(n string) string { return b.name + "." + n }
	// Unique to the test: grant ids are keys of the package's shared schema.
	g1, g2, g3, g4 := "gr_"+testenv.Random(16), "gr_"+testenv.Random(16), "gr_"+testenv.Random(16), "gr_"+testenv.Random(16)

	e1 := creditEvent(t, id("e1"), now, path,
		event.CreditDraw{Account: org, Unit: "tokens", Grant: g1, Units: 1000},
		event.CreditDraw{Account: org, Unit: "tokens", Grant: g2, Units: 200},
		event.CreditDraw{Account: team, Unit: "cost_micros", Grant: g3, Units: 1500})
	e2 := creditEvent(t, id("e2"), now.Add(time.Millisecond), path,
		event.CreditDraw{Account: org, Unit: "tokens", Grant: g1, Units: 50})
	bad := creditEvent(t, id("e3"), now, path,
		event.CreditDraw{Account: org, Unit: "tokens", Grant: g4, Units: 7},
		event.CreditDraw{Account: org + "-other", Unit: "tokens", Grant: g1, Units: 1})
	msgs := []kafka.Message{
		message(t, org, e1), message(t, org, e2), message(t, org, e1), message(t, org, bad),
		message(t, org, creditEvent(t, id("e4"), now, path)),
	}
	b.produce(t, msgs...)

	type row struct {
		EventID, Grant               string
		BillingPeriod, ChargedPeriod time.Time
		EventTime                    time.Time
		Org, Account, Unit           string
		Units                        int64
	}
	want := []row{
		{id("e1"), g1, month, month, now, org, org, "tokens", 1000},
		{id("e1"), g2, month, month, now, org, org, "tokens", 200},
		{id("e1"), g3, month, month, now, org, team, "cost_micros", 1500},
		{id("e2"), g1, month, month, now.Add(time.Millisecond), org, org, "tokens", 50},
	}
	rows := func() []row {
		rs, err := b.pool.Query(b.ctx, `select event_id, grant_id, billing_period, charged_period, event_time, org, account, unit, units
			from credit_consumptions where org = $1 order by event_id, account, unit, units desc`, org)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rs, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		for i := range got {
			got[i].BillingPeriod, got[i].ChargedPeriod = got[i].BillingPeriod.UTC(), got[i].ChargedPeriod.UTC()
			got[i].EventTime = got[i].EventTime.UTC()
		}
		return got
	}

	m := start(t, b.pool, b.options("a"))
	waitFor(t, b.ctx, "the first group", func() bool { return m.messages() == int64(len(msgs)) })
	require.Equal(t, want, rows())
	require.EqualValues(t, 4, m.inserted("credit_consumptions"))
	require.EqualValues(t, 3, m.duplicates("credit_consumptions"), "the second delivery of e1")
	require.EqualValues(t, 1, m.inserted("dead_letters"), "e3")
	require.Zero(t, count(t, b.ctx, b.pool, `select count(*) from credit_consumptions where grant_id = $1`, g4),
		"nothing of an admission with a malformed draw")
	require.Zero(t, count(t, b.ctx, b.pool, `select count(*) from usage_events where event_id = $1`, id("e3")))
	require.NoError(t, m.stop())

	again := start(t, b.pool, b.options("b"))
	waitFor(t, b.ctx, "the second group", func() bool { return again.messages() == int64(len(msgs)) })
	require.Equal(t, want, rows())
	require.EqualValues(t, 0, again.inserted("credit_consumptions"))
	require.EqualValues(t, 7, again.duplicates("credit_consumptions"))

	// The ledger of a grant that exists counts what was drawn from it.
	_, err := b.pool.Exec(b.ctx, `insert into accounts (id, kind, org, plan) values ($1, 'org', $1, 'pro')`, org)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `insert into credit_grants (id, org, account, unit, amount, effective_at, source)
		values ($1, $2, $2, 'tokens', 5000, $3, 'purchase')`, g1, org, now.Add(-time.Hour))
	require.NoError(t, err)
	var consumed, remaining int64
	require.NoError(t, b.pool.QueryRow(b.ctx, `select consumed, remaining from finance_credit_grants where grant_id = $1`, g1).
		Scan(&consumed, &remaining))
	require.EqualValues(t, 1050, consumed)
	require.EqualValues(t, 5000-1050, remaining)
}
