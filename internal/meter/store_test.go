package meter

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/testenv"
)

// A batch's admissions go by COPY straight into usage_events, and back through staging and
// ON CONFLICT DO NOTHING when one of them is a row already: either way each event is one
// row, from its first delivery, and an event of a closed period is late.
func TestStoreWritesEachEventOnce(t *testing.T) {
	t.Parallel()
	ctx, pool := testenv.Context(t, time.Minute), testenv.Postgres(t)
	name := strings.ReplaceAll(testenv.Name(t), "_", "-")
	s := newStore(pool, "t."+name)
	// A month no other test of the package writes or closes.
	closed := period.MonthStart(time.Now().AddDate(-3, -5, 0))
	_, err := pool.Exec(ctx, `insert into periods (period, closed_at, closed_by) values ($1, now(), 'test')`, closed)
	require.NoError(t, err)
	now := time.Now().UTC()
	org := name + "-org"
	type delivery struct {
		id        string
		at        time.Time
		partition int
		offset    int64
	}
	write := func(ds ...delivery) written {
		t.Helper()
		b := &batch{}
		for _, d := range ds {
			msg := message(t, org, admittedEvent(t, name+"-"+d.id, d.at, orgPath(org), map[string]int64{"requests": 1}))
			msg.Partition, msg.Offset = d.partition, d.offset
			b.msgs = append(b.msgs, msg)
		}
		b.parse()
		w, err := s.write(ctx, b.items)
		require.NoError(t, err)
		return w
	}
	type row struct {
		Partition int
		Offset    int64
		Late      bool
	}
	rowOf := func(id string) row {
		t.Helper()
		var r row
		require.NoError(t, pool.QueryRow(ctx, `select kafka_partition, kafka_offset, late from usage_events where event_id = $1`,
			name+"-"+id).Scan(&r.Partition, &r.Offset, &r.Late))
		return r
	}

	// Delivered three times in one batch: one row, at its first position (partition, then offset).
	w := write(delivery{"a", now, 0, 5}, delivery{"b", now, 0, 6}, delivery{"a", now, 1, 2}, delivery{"a", now, 0, 3},
		delivery{"late-copied", closed.Add(time.Hour), 0, 7})
	require.Equal(t, counts{staged: 5, inserted: 3}, w.usage)
	require.Equal(t, row{Partition: 0, Offset: 3}, rowOf("a"))
	require.Equal(t, row{Partition: 0, Offset: 6}, rowOf("b"))
	require.Equal(t, row{Partition: 0, Offset: 7, Late: true}, rowOf("late-copied"))

	// A batch with an event written before (a redelivery): the others are written, the
	// row already there stays as it was; one delivered twice in it is written from its
	// first position, through staging too.
	w = write(delivery{"b", now, 2, 9}, delivery{"c", now, 2, 10}, delivery{"late-staged", closed.Add(2 * time.Hour), 2, 11},
		delivery{"d", now, 3, 20}, delivery{"d", now, 3, 12})
	require.Equal(t, counts{staged: 5, inserted: 3}, w.usage)
	require.Equal(t, row{Partition: 0, Offset: 6}, rowOf("b"))
	require.Equal(t, row{Partition: 2, Offset: 10}, rowOf("c"))
	require.Equal(t, row{Partition: 3, Offset: 12}, rowOf("d"))
	require.Equal(t, row{Partition: 2, Offset: 11, Late: true}, rowOf("late-staged"))

	// Times at the ends of the years parse accepts come back as they went in.
	first, last := time.Date(minYear, 1, 1, 0, 0, 0, 1000, time.UTC), time.Date(maxYear, 12, 31, 23, 59, 59, 999999000, time.UTC)
	w = write(delivery{"first", first, 1, 1}, delivery{"last", last, 1, 2})
	require.Equal(t, counts{staged: 2, inserted: 2}, w.usage)
	for id, at := range map[string]time.Time{"first": first, "last": last} {
		var eventTime, billing, charged time.Time
		require.NoError(t, pool.QueryRow(ctx, `select event_time, billing_period, charged_period from usage_events where event_id = $1`,
			name+"-"+id).Scan(&eventTime, &billing, &charged))
		require.Equal(t, at, eventTime.UTC(), id)
		require.Equal(t, period.MonthStart(at), billing.UTC(), id)
		require.Equal(t, period.MonthStart(at), charged.UTC(), id)
	}

	// The same batch written by several writers at once (a rebalance hands a partition over
	// while its last batch is still being written): each event once.
	var ds []delivery
	for i := range 300 {
		ds = append(ds, delivery{fmt.Sprintf("r%d", i), now, i % 3, int64(100 + i)})
	}
	var wg sync.WaitGroup
	inserted := make([]int64, 3)
	for i := range inserted {
		wg.Go(func() { inserted[i] = write(ds...).usage.inserted })
	}
	wg.Wait()
	require.EqualValues(t, len(ds), inserted[0]+inserted[1]+inserted[2])
	require.EqualValues(t, len(ds), count(t, ctx, pool, `select count(*) from usage_events where event_id like $1`, name+"-r%"))
	require.EqualValues(t, 3+3+2+len(ds), count(t, ctx, pool, `select count(*) from usage_events where org = $1`, org))
}
