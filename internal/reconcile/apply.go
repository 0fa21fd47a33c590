package reconcile

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/lua"
)

// The statements that record, list and mark corrections.
var (
	//go:embed sql/insert_adjustments.sql
	insertAdjustmentsSQL string
	//go:embed sql/pending_adjustments.sql
	pendingAdjustmentsSQL string
	//go:embed sql/mark_applied.sql
	markAppliedSQL string
)

// insert records corrections in one transaction, so an event's corrections are all there
// or none; a correction computed before (a run that died) is the row already there.
func insert(ctx context.Context, o Options, runID uuid.UUID, adj []Adjustment) error {
	if len(adj) == 0 {
		return nil
	}
	err := pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		const chunk = 5000
		for start := 0; start < len(adj); start += chunk {
			part := adj[start:min(start+chunk, len(adj))]
			var kind, org, account, level, unit, window, periods, reason, source []string
			var amount []int64
			for _, a := range part {
				kind = append(kind, string(a.Kind))
				org = append(org, a.Org)
				account = append(account, a.Account)
				level = append(level, string(a.Level))
				unit = append(unit, string(a.Unit))
				start, err := period.Parse(a.Period)
				if err != nil {
					return fmt.Errorf("adjustment of %s: %w", a.Account, err)
				}
				window = append(window, string(policy.KindOf(a.Period)))
				periods = append(periods, start.Format(period.DayLayout))
				amount = append(amount, a.Amount)
				reason = append(reason, a.Reason)
				source = append(source, a.SourceEvent)
			}
			_, err := tx.Exec(ctx, insertAdjustmentsSQL, pgx.StrictNamedArgs{
				"run_id": runID, "kinds": kind, "orgs": org, "accounts": account, "levels": level, "units": unit,
				"quota_periods": window, "periods": periods, "amounts": amount, "reasons": reason, "source_events": source,
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("insert adjustments: %w", err)
	}
	return o.fail(AfterInsert)
}

// pendingRows lists the corrections not applied yet, oldest first.
func pendingRows(ctx context.Context, pool *pgxpool.Pool) ([]Adjustment, error) {
	rows, err := pool.Query(ctx, pendingAdjustmentsSQL)
	if err != nil {
		return nil, fmt.Errorf("read pending adjustments: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Adjustment, error) {
		var a Adjustment
		err := r.Scan(&a.ID, &a.Kind, &a.Org, &a.Account, &a.Level, &a.Unit, &a.QuotaPeriod, &a.Period, &a.Amount, &a.Reason, &a.SourceEvent)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("read pending adjustments: %w", err)
	}
	return out, nil
}

// apply applies every pending correction, oldest first, and returns how many it marked
// applied. The script's marker makes the Redis change happen once even when a run died
// after it and before the row was marked: the replay returns the values of the first
// application, which are recorded.
//
// A correction Redis refuses (its counter is not an integer, or would overflow) is a
// problem of its account: reported, left pending for the next run, and the others are
// applied.
func apply(ctx context.Context, o Options, s *Summary) (int, error) {
	pending, err := pendingRows(ctx, o.Pool)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, a := range pending {
		if s.failedAdjustment(a.ID) {
			continue // refused earlier in this run: the next run tries again
		}
		key := o.Keys.Quota(a.Org, a.Account, a.Unit, a.Period)
		got, err := lua.Adjust.Run(ctx, o.Redis, []string{o.Keys.Marker(a.Org, a.ID), key},
			a.Amount, o.MarkerTTL.Milliseconds(), "").Int64Slice()
		if err != nil && perAccount(err) {
			raw, _ := o.Redis.Get(ctx, key).Result() // for the report only
			s.problem(o, Problem{Kind: CorrectionFailed, Org: a.Org, Account: a.Account, Unit: a.Unit, Period: a.Period,
				Key: key, Value: rawValue(raw), AdjustmentID: a.ID, Error: err.Error()})
			continue
		}
		if err != nil {
			return n, fmt.Errorf("apply adjustment %d: %w", a.ID, err)
		}
		if len(got) != 3 {
			return n, fmt.Errorf("apply adjustment %d: unexpected reply %v", a.ID, got)
		}
		// A counter created by the correction (e.g. after Redis lost its keys) expires like
		// admission's; an existing one keeps its expiry (NX).
		end, err := period.End(a.Period)
		if err != nil {
			return n, fmt.Errorf("adjustment %d: %w", a.ID, err)
		}
		expire := end.Add(o.CounterRetention)
		if err := o.Redis.Do(ctx, "PEXPIREAT", key, expire.UnixMilli(), "NX").Err(); err != nil {
			return n, fmt.Errorf("expire counter %s: %w", key, err)
		}
		if err := o.fail(AfterRedis); err != nil {
			return n, err
		}
		tag, err := o.Pool.Exec(ctx, markAppliedSQL,
			pgx.StrictNamedArgs{"id": a.ID, "redis_before": got[1], "redis_after": got[2]})
		if err != nil {
			return n, fmt.Errorf("mark adjustment %d applied: %w", a.ID, err)
		}
		if tag.RowsAffected() == 1 {
			n++
			s.AdjustmentsApplied++
			s.ByKind[a.Kind]++
		}
		if err := o.fail(AfterMark); err != nil {
			return n, err
		}
	}
	return n, nil
}

// failedAdjustment tells whether Redis refused correction id earlier in this run.
func (s *Summary) failedAdjustment(id int64) bool {
	for _, p := range s.Problems {
		if p.Kind == CorrectionFailed && p.AdjustmentID == id {
			return true
		}
	}
	return false
}
