package reconcile

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/period"
	"github.com/metergate/metergate/internal/policy"
)

//go:embed sql/plan_grants_due.sql
var planGrantsDueSQL string

// issuePlanGrants gives every account that names a plan with a recurring grant
// (plan_grants) its grant of the run's month, once: the grant's idempotency key names the
// plan, unit and month, so a second run, or a run that died after some, grants nothing
// twice. Each grant is usable from the month's start to its end. A grant refused for one
// account (an invalid amount, a balance Redis refuses) is a problem; the others are issued.
func issuePlanGrants(ctx context.Context, o Options, s *Summary) error {
	rows, err := o.Pool.Query(ctx, planGrantsDueSQL)
	if err != nil {
		return fmt.Errorf("read plan grants: %w", err)
	}
	type due struct {
		account, plan string
		unit          policy.Unit
		amount        int64
		priority      int
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (due, error) {
		var d due
		err := r.Scan(&d.account, &d.plan, &d.unit, &d.amount, &d.priority)
		return d, err
	})
	if err != nil {
		return fmt.Errorf("read plan grants: %w", err)
	}
	if len(list) == 0 {
		return nil
	}
	start := period.MonthStart(o.now)
	end := start.AddDate(0, 1, 0)
	label := period.MonthLabel(start)
	store := credit.NewStore(o.Pool, o.Redis, o.Keys, period.Fixed(o.now))
	for _, d := range list {
		_, created, err := store.Grant(ctx, credit.GrantRequest{
			Account: d.account, Unit: d.unit, Amount: d.amount, EffectiveAt: &start, ExpiresAt: &end,
			Priority: d.priority, Source: credit.Plan,
			IdempotencyKey: "plan:" + d.plan + ":" + string(d.unit) + ":" + label,
		})
		if err != nil && perAccount(err) {
			org := ""
			if pol, rerr := o.Policies.Resolve(d.account); rerr == nil {
				org = pol.Org
			}
			s.problem(o, Problem{Kind: PlanGrantFailed, Org: org, Account: d.account, Unit: d.unit, Period: label,
				Error: fmt.Sprintf("grant of plan %s: %v", d.plan, err)})
			continue
		}
		if err != nil {
			return fmt.Errorf("grant %s's %s of plan %s for %s: %w", d.account, d.unit, d.plan, label, err)
		}
		if created {
			s.PlanGrants++
		}
	}
	return nil
}
