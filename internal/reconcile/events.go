package reconcile

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

//go:embed sql/event_corrections.sql
var eventCorrectionsSQL string

// eventCorrections computes the period moves, refunds and settlements of the events of the
// open periods that have not had them yet. Events admitted fail-open charged no counter
// and get none (drift_restore brings their usage into the counters).
//
// Admission charges a daily counter of the day of the event time (both come from Redis
// TIME), so daily counters need no moves; they are refunded and settled while their day is
// open. An event's corrections are computed together, once.
//
// A refund or settlement brings a counter from what the event charged to what it bills, as
// billable_events defines it (migrations/00009_billable.sql): the rule is PostgreSQL's, not
// repeated here. The cost follows the events of the open periods, not the log's whole
// history: each looks up its outcome and its corrections by key (sql/event_corrections.sql).
func eventCorrections(ctx context.Context, o Options, from time.Time) ([]Adjustment, int, error) {
	fromDay := sinceDay(o.now)
	rows, err := o.Pool.Query(ctx, eventCorrectionsSQL, pgx.StrictNamedArgs{"since": from})
	if err != nil {
		return nil, 0, fmt.Errorf("read events to correct: %w", err)
	}
	defer rows.Close()
	var (
		out     []Adjustment
		skipped int
	)
	for rows.Next() {
		var (
			id, org, account string
			charged, billing time.Time
			at               time.Time
			admitted, bills  []int64
			status           *int
			voided           *string // the void's reason
			refunded         bool    // bills nothing: a 5xx or a void
			moved, settled   bool
		)
		if err := rows.Scan(&id, &org, &account, &charged, &billing, &at, &admitted, &bills, &refunded, &status, &voided, &moved, &settled); err != nil {
			return nil, 0, fmt.Errorf("read events to correct: %w", err)
		}
		pol, err := o.Policies.Resolve(account)
		if err != nil {
			o.Log.Warn("event skipped: account does not resolve", "event_id", id, "account", account, "err", err)
			skipped++
			continue
		}
		cp, bp := period.MonthLabel(charged), period.MonthLabel(billing)
		add := func(k Kind, lv policy.Level, u policy.Unit, period string, amount int64, reason string) {
			if amount != 0 {
				out = append(out, Adjustment{Kind: k, Org: org, Account: lv.Account, Level: lv.Kind, Unit: u,
					QuotaPeriod: policy.KindOf(period), Period: period, Amount: amount, Reason: reason, SourceEvent: id})
			}
		}
		// settle brings the counter of period from what the event charged to what it bills
		// (billable_events): a refund when it bills nothing, a settlement otherwise.
		settle := func(lv policy.Level, u policy.Unit, period string) {
			n, b := admitted[unitIndex(u)], bills[unitIndex(u)]
			switch {
			case settled:
			case voided != nil: // whatever its outcome says: nobody was told 200
				add(RefundVoid, lv, u, period, b-n, "voided: "+*voided)
			case refunded && status != nil:
				add(Refund5xx, lv, u, period, b-n, fmt.Sprintf("outcome status %d", *status))
			default:
				add(SettleTokens, lv, u, period, b-n, fmt.Sprintf("estimated %d, actual %d", n, b))
			}
		}
		for _, lv := range pol.Path {
			for _, u := range quotas(lv, policy.Month) {
				n := admitted[unitIndex(u)]
				// Moves first: refunds and settlements then apply to the event time's month.
				if !moved && cp != bp && !charged.Before(from) {
					reason := fmt.Sprintf("event time in %s, charged to %s", bp, cp)
					add(PeriodMove, lv, u, cp, -n, reason)
					add(PeriodMove, lv, u, bp, n, reason)
				}
				settle(lv, u, bp)
			}
			if !at.Before(fromDay) {
				for _, u := range quotas(lv, policy.Day) {
					settle(lv, u, period.DayLabel(at))
				}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read events to correct: %w", err)
	}
	return out, skipped, nil
}
