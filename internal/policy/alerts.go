package policy

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// AlertKind is what an alert rule's thresholds measure.
type AlertKind string

// Alert kinds (docs/alerts.md).
const (
	// QuotaPercent: percentages (1-100) of the quota of a period ("month" or "day"). A
	// threshold fires when the counter reaches it; 100 % also fires with the first request
	// the quota refuses.
	QuotaPercent AlertKind = "quota_percent"
	// BalanceBelow: amounts; one fires when a draw takes the balance below it.
	BalanceBelow AlertKind = "balance_below"
	// BalancePercent: percentages (1-100) of the units granted (the grants neither voided nor
	// expired when the policies were loaded); one fires when a draw takes the balance below.
	BalancePercent AlertKind = "balance_percent"
)

// Valid reports whether k is a known kind.
func (k AlertKind) Valid() bool { return k == QuotaPercent || k == BalanceBelow || k == BalancePercent }

// Alert is the thresholds one rule watches for one unit of a level.
type Alert struct {
	Kind AlertKind `json:"kind"`
	Unit Unit      `json:"unit"`
	// Period is the quota a QuotaPercent rule watches: Month or Day. Balances: Month.
	Period     QuotaPeriod `json:"period"`
	Thresholds []int64     `json:"thresholds"`
}

// Spec names threshold t of the alert as events and markers do: "p80" (80 % of a quota),
// "b5000" (a balance below 5000), "bp20" (below 20 % of the units granted).
func (a Alert) Spec(t int64) string {
	prefix := map[AlertKind]string{QuotaPercent: "p", BalanceBelow: "b", BalancePercent: "bp"}[a.Kind]
	return prefix + strconv.FormatInt(t, 10)
}

// AlertRule is an alert rule as stored: an Alert of an account, or a plan default for the
// accounts on the plan with no rule of the same kind, unit and period.
type AlertRule struct {
	ID      string `json:"id"`
	Account string `json:"account,omitempty"`
	Plan    string `json:"plan,omitempty"`
	Alert
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// maxThresholds bounds a rule's thresholds, as the table does.
const maxThresholds = 10

// check validates a rule's own fields and normalizes them: Period defaults to Month and the
// thresholds are sorted.
func (r *AlertRule) check() error {
	if (r.Account == "") == (r.Plan == "") {
		return invalid("owner", "name exactly one of account and plan")
	}
	if r.Account != "" && !ValidID(r.Account) {
		return invalid("account", "not a valid account id")
	}
	if r.Plan != "" && !ValidID(r.Plan) {
		return invalid("plan", "not a valid plan id")
	}
	if !r.Kind.Valid() {
		return invalid("kind", "want %s, %s or %s", QuotaPercent, BalanceBelow, BalancePercent)
	}
	if !r.Unit.Valid() {
		return invalid("unit", "unknown unit %q", r.Unit)
	}
	switch r.Period {
	case "":
		r.Period = Month
	case Month:
	case Day:
		if r.Kind != QuotaPercent {
			return invalid("period", "only a quota_percent rule watches a daily quota")
		}
	default:
		return invalid("period", "want month or day")
	}
	if len(r.Thresholds) == 0 || len(r.Thresholds) > maxThresholds {
		return invalid("thresholds", "want 1 to %d thresholds", maxThresholds)
	}
	r.Thresholds = slices.Clone(r.Thresholds)
	slices.Sort(r.Thresholds)
	r.Thresholds = slices.Compact(r.Thresholds)
	for _, t := range r.Thresholds {
		if t <= 0 || (r.Kind != BalanceBelow && t > 100) || t > MaxAmount {
			if r.Kind == BalanceBelow {
				return invalid("thresholds", "amounts must be from 1 to %d", int64(MaxAmount))
			}
			return invalid("thresholds", "percentages must be from 1 to 100")
		}
	}
	return nil
}

// ErrAlertExists is returned when the owner has a rule of that kind, unit and period already.
var ErrAlertExists = errors.New("alert rule exists for that owner, kind, unit and period")

// The statements of the alert rules. Each selects or returns a rule's columns in
// scanAlert's order.
var (
	//go:embed sql/insert_alert.sql
	insertAlertSQL string
	//go:embed sql/update_alert.sql
	updateAlertSQL string
	//go:embed sql/read_alert.sql
	readAlertSQL string
	//go:embed sql/list_alerts.sql
	listAlertsSQL string
	//go:embed sql/list_account_alerts.sql
	listAccountAlertsSQL string
	//go:embed sql/list_plan_alerts.sql
	listPlanAlertsSQL string
	//go:embed sql/load_alerts.sql
	loadAlertsSQL string
)

// scanAlert reads a rule from its columns in this order: id, account (” for none), plan
// (” for none), kind, unit, period, thresholds, created_at, updated_at.
func scanAlert(row pgx.Row) (AlertRule, error) {
	var r AlertRule
	err := row.Scan(&r.ID, &r.Account, &r.Plan, &r.Kind, &r.Unit, &r.Period, &r.Thresholds, &r.CreatedAt, &r.UpdatedAt)
	return r, err
}

// CreateAlert stores a new rule and returns it with its id. The account or plan must exist
// (*InvalidError otherwise); ErrAlertExists if the owner has a rule of that kind, unit and
// period.
func (s *Store) CreateAlert(ctx context.Context, r AlertRule) (AlertRule, error) {
	if err := r.check(); err != nil {
		return AlertRule{}, err
	}
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	r.ID = "al_" + hex.EncodeToString(raw[:])
	out, err := scanAlert(s.pool.QueryRow(ctx, insertAlertSQL, pgx.StrictNamedArgs{
		"id": r.ID, "account": nullString(r.Account), "plan": nullString(r.Plan),
		"kind": r.Kind, "unit": r.Unit, "period": r.Period, "thresholds": r.Thresholds,
	}))
	if err != nil {
		return AlertRule{}, alertDBError(err)
	}
	return out, nil
}

// UpdateAlert replaces a rule's kind, unit, period and thresholds (its owner stays).
// ErrNotFound if there is no such rule.
func (s *Store) UpdateAlert(ctx context.Context, r AlertRule) (AlertRule, error) {
	old, err := s.GetAlert(ctx, r.ID)
	if err != nil {
		return AlertRule{}, err
	}
	r.Account, r.Plan = old.Account, old.Plan
	if err := r.check(); err != nil {
		return AlertRule{}, err
	}
	out, err := scanAlert(s.pool.QueryRow(ctx, updateAlertSQL, pgx.StrictNamedArgs{
		"id": r.ID, "kind": r.Kind, "unit": r.Unit, "period": r.Period, "thresholds": r.Thresholds,
	}))
	if errors.Is(err, pgx.ErrNoRows) {
		return AlertRule{}, fmt.Errorf("alert rule %q: %w", r.ID, ErrNotFound)
	}
	if err != nil {
		return AlertRule{}, alertDBError(err)
	}
	return out, nil
}

// GetAlert returns one rule; ErrNotFound if there is none.
func (s *Store) GetAlert(ctx context.Context, id string) (AlertRule, error) {
	if !ValidID(id) {
		return AlertRule{}, fmt.Errorf("alert rule %q: %w", id, ErrNotFound)
	}
	r, err := scanAlert(s.pool.QueryRow(ctx, readAlertSQL, pgx.StrictNamedArgs{"id": id}))
	if errors.Is(err, pgx.ErrNoRows) {
		return AlertRule{}, fmt.Errorf("alert rule %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return AlertRule{}, fmt.Errorf("read alert rule: %w", err)
	}
	return r, nil
}

// Alerts lists the rules of an account or a plan (both empty: every rule), oldest first.
func (s *Store) Alerts(ctx context.Context, account, plan string) ([]AlertRule, error) {
	var (
		query string
		args  pgx.StrictNamedArgs
	)
	switch {
	case account != "" && plan != "":
		return []AlertRule{}, nil // a rule has one owner (alert_rules_owner): none has both
	case account != "":
		query, args = listAccountAlertsSQL, pgx.StrictNamedArgs{"account": account}
	case plan != "":
		query, args = listPlanAlertsSQL, pgx.StrictNamedArgs{"plan": plan}
	default:
		query = listAlertsSQL
	}
	rows, err := s.pool.Query(ctx, query, args)
	if err != nil {
		return nil, fmt.Errorf("read alert rules: %w", err)
	}
	defer rows.Close()
	out := []AlertRule{}
	for rows.Next() {
		r, err := scanAlert(rows)
		if err != nil {
			return nil, fmt.Errorf("read alert rules: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read alert rules: %w", err)
	}
	return out, nil
}

// DeleteAlert removes a rule; ErrNotFound if there is none. Alerts it fired stay recorded.
func (s *Store) DeleteAlert(ctx context.Context, id string) error {
	if !ValidID(id) {
		return fmt.Errorf("alert rule %q: %w", id, ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, `delete from alert_rules where id = @id`, pgx.StrictNamedArgs{"id": id})
	if err != nil {
		return fmt.Errorf("delete alert rule: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("alert rule %q: %w", id, ErrNotFound)
	}
	return nil
}

func alertDBError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505":
			return fmt.Errorf("%w (%w)", ErrAlertExists, err)
		case "23503":
			return fmt.Errorf("%w (%w)", invalid("owner", "no such account or plan"), err)
		}
	}
	return dbError(err)
}

// alertSet is the rules of the accounts and plans, as the cache loads them.
type alertSet struct {
	byAccount, byPlan map[string][]Alert
}

func loadAlerts(ctx context.Context, tx pgx.Tx) (alertSet, error) {
	set := alertSet{byAccount: map[string][]Alert{}, byPlan: map[string][]Alert{}}
	rows, err := tx.Query(ctx, loadAlertsSQL)
	if err != nil {
		return set, fmt.Errorf("read alert rules: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		r, err := scanAlert(rows)
		if err != nil {
			return set, fmt.Errorf("read alert rules: %w", err)
		}
		if r.Account != "" {
			set.byAccount[r.Account] = append(set.byAccount[r.Account], r.Alert)
		} else {
			set.byPlan[r.Plan] = append(set.byPlan[r.Plan], r.Alert)
		}
	}
	return set, rows.Err()
}
