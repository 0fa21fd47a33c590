package meter

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/pkg/event"
)

// borrowingEvent is an admission of one request of path's account at at that borrowed bs.
func borrowingEvent(t testing.TB, id string, at time.Time, path []event.PathNode, bs ...event.Borrowing) event.CloudEvent {
	t.Helper()
	ev, err := event.New(id, "node-1", event.TypeAdmitted, event.Subject(path), at, event.Admitted{
		Org: path[0].Account, Account: path[len(path)-1].Account, Path: path,
		Units: map[string]int64{"requests": 1, "tokens": 400}, Period: period.MonthLabel(at), Plan: "pro", Borrowed: bs,
	})
	require.NoError(t, err)
	return ev
}

// The borrowings of an admission are in usage_borrowings as sent, once however often the
// admission is delivered (twice to one group, then again to a second group), and
// finance_borrowing sums them per borrower, lender, unit and period, leaving out a voided
// request.
func TestBorrowingsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	org := b.name
	path := orgPath(org)
	team, agent := path[1].Account, path[2].Account
	now := time.Now().UTC().Truncate(time.Microsecond)
	month := period.MonthStart(now)
	id := func(n string) string { return b.name + "." + n }

	e1 := borrowingEvent(t, id("e1"), now, path,
		event.Borrowing{Account: team, From: org, Unit: "tokens", Units: 300},
		event.Borrowing{Account: agent, From: team, Unit: "requests", Units: 1})
	e2 := borrowingEvent(t, id("e2"), now.Add(time.Millisecond), path,
		event.Borrowing{Account: team, From: org, Unit: "tokens", Units: 50})
	voided := borrowingEvent(t, id("e3"), now, path,
		event.Borrowing{Account: team, From: org, Unit: "tokens", Units: 1000})
	msgs := []kafka.Message{
		message(t, org, e1), message(t, org, e2), message(t, org, e1), message(t, org, voided),
		message(t, org, voidedEvent(t, id("e3"), id("e3"), event.VoidUnavailable, now)),
		message(t, org, borrowingEvent(t, id("e4"), now, path)),
	}
	b.produce(t, msgs...)

	type row struct {
		EventID                      string
		BillingPeriod, ChargedPeriod time.Time
		EventTime                    time.Time
		Org, Account, Lender, Unit   string
		Units                        int64
	}
	want := []row{
		{id("e1"), month, month, now, org, agent, team, "requests", 1},
		{id("e1"), month, month, now, org, team, org, "tokens", 300},
		{id("e2"), month, month, now.Add(time.Millisecond), org, team, org, "tokens", 50},
		{id("e3"), month, month, now, org, team, org, "tokens", 1000},
	}
	rows := func() []row {
		rs, err := b.pool.Query(b.ctx, `select event_id, billing_period, charged_period, event_time, org, account, lender, unit, units
			from usage_borrowings where org = $1 order by event_id, account, unit`, org)
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
	require.EqualValues(t, 4, m.inserted("usage_borrowings"))
	require.EqualValues(t, 2, m.duplicates("usage_borrowings"), "the second delivery of e1")
	require.NoError(t, m.stop())

	again := start(t, b.pool, b.options("b"))
	waitFor(t, b.ctx, "the second group", func() bool { return again.messages() == int64(len(msgs)) })
	require.Equal(t, want, rows())
	require.EqualValues(t, 0, again.inserted("usage_borrowings"))
	require.EqualValues(t, 6, again.duplicates("usage_borrowings"))

	type chargeback struct {
		Account, Lender, Unit, Period string
		Events, Units                 int64
	}
	rs, err := b.pool.Query(b.ctx, `select account, lender, unit, period, events, units
		from finance_borrowing where org = $1 order by account, unit`, org)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rs, pgx.RowToStructByPos[chargeback])
	require.NoError(t, err)
	label := period.MonthLabel(now)
	require.Equal(t, []chargeback{
		{agent, team, "requests", label, 1, 1},
		{team, org, "tokens", label, 2, 350}, // e3 (1000) was voided
	}, got)
}
