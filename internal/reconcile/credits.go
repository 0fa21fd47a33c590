package reconcile

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/lua"
)

// Credits (docs/credits.md "Settlement"): a request that drew from credit grants and bills
// less than it drew gives the difference back, once, to the grants it drew from; a grant
// that Redis lost or holds above its ledger is restored from PostgreSQL, never above.

// CreditAdjustment is a balance given back to a grant (credit_adjustments).
type CreditAdjustment struct {
	ID      int64       `json:"id,omitempty"`
	Kind    string      `json:"kind"` // refund (the request bills nothing) or settle
	EventID string      `json:"event_id"`
	GrantID string      `json:"grant_id"`
	Org     string      `json:"org"`
	Account string      `json:"account"`
	Unit    policy.Unit `json:"unit"`
	Units   int64       `json:"units"`
}

//go:embed sql/credit_corrections.sql
var creditCorrectionsSQL string

// creditCorrections lists what requests of the open periods must give back.
func creditCorrections(ctx context.Context, o Options) ([]CreditAdjustment, error) {
	rows, err := o.Pool.Query(ctx, creditCorrectionsSQL, pgx.StrictNamedArgs{"since": since(o.now)})
	if err != nil {
		return nil, fmt.Errorf("compute credit corrections: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CreditAdjustment, error) {
		var a CreditAdjustment
		err := r.Scan(&a.EventID, &a.GrantID, &a.Org, &a.Account, &a.Unit, &a.Kind, &a.Units)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("compute credit corrections: %w", err)
	}
	return out, nil
}

//go:embed sql/insert_credit_adjustment.sql
var insertCreditAdjustmentSQL string

// recordCredits records corrections; one computed before is the row already there.
func recordCredits(ctx context.Context, o Options, adj []CreditAdjustment) error {
	return pgx.BeginFunc(ctx, o.Pool, func(tx pgx.Tx) error {
		for _, a := range adj {
			_, err := tx.Exec(ctx, insertCreditAdjustmentSQL, pgx.StrictNamedArgs{
				"kind": a.Kind, "grant_id": a.GrantID, "event_id": a.EventID, "units": a.Units, "reason": creditReason(a),
			})
			if err != nil {
				return fmt.Errorf("record credit adjustment: %w", err)
			}
		}
		return nil
	})
}

func creditReason(a CreditAdjustment) string {
	if a.Kind == "refund" {
		return "the request bills nothing (5xx or void): what it drew goes back"
	}
	return "the request bills fewer units than it drew: the difference goes back"
}

// The statements of applyCredits.
var (
	//go:embed sql/pending_credit_adjustments.sql
	pendingCreditAdjustmentsSQL string
	//go:embed sql/mark_credit_applied.sql
	markCreditAppliedSQL string
)

// applyCredits gives every recorded, unapplied correction back to its grant in Redis once
// (lua/adjust.lua's marker), and marks it applied. A voided grant gets nothing back in
// Redis (the void took what was left; its ledger counts the refund as voided). One Redis
// refuses (a balance that is not an integer) is a problem, left pending for the next run.
func applyCredits(ctx context.Context, o Options, s *Summary) error {
	rows, err := o.Pool.Query(ctx, pendingCreditAdjustmentsSQL)
	if err != nil {
		return fmt.Errorf("read pending credit adjustments: %w", err)
	}
	type pending struct {
		CreditAdjustment
		voided bool
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pending, error) {
		var p pending
		err := r.Scan(&p.ID, &p.Kind, &p.GrantID, &p.Org, &p.Account, &p.Unit, &p.Units, &p.voided)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("read pending credit adjustments: %w", err)
	}
	for _, p := range list {
		delta := p.Units
		if p.voided {
			delta = 0
		}
		key := o.Keys.Grants(p.Org, p.Account, p.Unit)
		got, err := lua.Adjust.Run(ctx, o.Redis, []string{o.Keys.CreditMarker(p.Org, p.ID), key},
			delta, o.MarkerTTL.Milliseconds(), p.GrantID).Int64Slice()
		if err != nil && perAccount(err) {
			// Left pending: the next run tries again.
			raw, _ := o.Redis.HGet(ctx, key, p.GrantID).Result() // for the report only
			s.problem(o, Problem{Kind: CreditFailed, Org: p.Org, Account: p.Account, Unit: p.Unit, Key: key,
				Value: rawValue(raw), GrantID: p.GrantID, Error: fmt.Sprintf("credit adjustment %d: %v", p.ID, err)})
			continue
		}
		if err != nil {
			return fmt.Errorf("apply credit adjustment %d: %w", p.ID, err)
		}
		if len(got) != 3 {
			return fmt.Errorf("apply credit adjustment %d: unexpected reply %v", p.ID, got)
		}
		if _, err := o.Pool.Exec(ctx, markCreditAppliedSQL,
			pgx.StrictNamedArgs{"id": p.ID, "redis_before": got[1], "redis_after": got[2]}); err != nil {
			return fmt.Errorf("mark credit adjustment %d: %w", p.ID, err)
		}
		s.CreditsApplied++
	}
	return nil
}

// The statements of restoreCredits.
var (
	//go:embed sql/credit_restore.sql
	creditRestoreSQL string
	//go:embed sql/insert_credit_restore.sql
	insertCreditRestoreSQL string
)

// restoreCredits brings every grant in Redis back to its ledger, never above it, and
// records each change as a restore row (informational: the ledger is not changed).
func restoreCredits(ctx context.Context, o Options, s *Summary) error {
	rows, err := o.Pool.Query(ctx, creditRestoreSQL)
	if err != nil {
		return fmt.Errorf("read credit ledger: %w", err)
	}
	type grant struct {
		id, org, account string
		unit             policy.Unit
		remaining        int64
		priority         int
		effective        time.Time
		expires          *time.Time
	}
	grants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (grant, error) {
		var g grant
		err := r.Scan(&g.id, &g.org, &g.account, &g.unit, &g.remaining, &g.priority, &g.effective, &g.expires)
		return g, err
	})
	if err != nil {
		return fmt.Errorf("read credit ledger: %w", err)
	}
	for _, g := range grants {
		terms := credit.Terms(g.priority, g.effective, g.expires)
		keys := []string{o.Keys.Grants(g.org, g.account, g.unit), o.Keys.GrantTerms(g.org, g.account, g.unit),
			o.Keys.GrantVoided(g.org, g.account, g.unit, g.id)}
		got, err := lua.CreditRestore.Run(ctx, o.Redis, keys, g.id, g.remaining, terms).Int64Slice()
		if err != nil && perAccount(err) {
			raw, _ := o.Redis.HGet(ctx, keys[0], g.id).Result() // for the report only
			s.problem(o, Problem{Kind: CreditFailed, Org: g.org, Account: g.account, Unit: g.unit, Key: keys[0],
				Value: rawValue(raw), GrantID: g.id, Error: fmt.Sprintf("restore: %v", err)})
			continue
		}
		if err != nil {
			return fmt.Errorf("restore grant %s: %w", g.id, err)
		}
		if len(got) != 2 || got[0] == got[1] {
			continue
		}
		s.CreditsRestored++
		before := any(got[0])
		if got[0] < 0 {
			before = nil
		}
		change := got[1] - max(got[0], 0)
		if _, err := o.Pool.Exec(ctx, insertCreditRestoreSQL, pgx.StrictNamedArgs{
			"grant_id": g.id, "units": change, "redis_before": before, "redis_after": got[1],
			"reason": "Redis held the grant above its ledger, or had lost it: set to the ledger's remaining units",
		}); err != nil {
			return fmt.Errorf("record restore of grant %s: %w", g.id, err)
		}
	}
	return nil
}

// credits runs the credit step: corrections recorded, applied, then the restore.
func credits(ctx context.Context, o Options, s *Summary) error {
	adj, err := creditCorrections(ctx, o)
	if err != nil {
		return err
	}
	s.CreditsPlanned = len(adj)
	if err := recordCredits(ctx, o, adj); err != nil {
		return err
	}
	if err := applyCredits(ctx, o, s); err != nil {
		return err
	}
	return restoreCredits(ctx, o, s)
}
