package policy_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// A plan's rules apply to the accounts on the plan, but for the kinds, units and periods an
// account has a rule of its own; rules reach the cache, and so do the units granted.
func TestAlertRulesResolve(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	_, err := b.store.CreatePlan(b.ctx, teamPlan(), nil)
	require.NoError(t, err)
	b.create(t, policy.Account{ID: b.id("org"), Kind: policy.Org, Plan: "team"})
	b.create(t, policy.Account{ID: b.id("other"), Kind: policy.Org, Plan: "team"})

	plan80, err := b.store.CreateAlert(b.ctx, policy.AlertRule{Plan: "team", Alert: policy.Alert{
		Kind: policy.QuotaPercent, Unit: policy.Requests, Thresholds: []int64{100, 80, 80}}})
	require.NoError(t, err)
	require.Equal(t, policy.Month, plan80.Period, "month by default")
	require.Equal(t, []int64{80, 100}, plan80.Thresholds, "sorted, once each")
	_, err = b.store.CreateAlert(b.ctx, policy.AlertRule{Plan: "team", Alert: policy.Alert{
		Kind: policy.BalanceBelow, Unit: policy.Credits, Thresholds: []int64{500}}})
	require.NoError(t, err)
	own, err := b.store.CreateAlert(b.ctx, policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{
		Kind: policy.QuotaPercent, Unit: policy.Requests, Period: policy.Month, Thresholds: []int64{50}}})
	require.NoError(t, err)
	_, err = b.store.CreateAlert(b.ctx, policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{
		Kind: policy.QuotaPercent, Unit: policy.Requests, Thresholds: []int64{60}}})
	require.True(t, errors.Is(err, policy.ErrAlertExists), "%v", err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO credit_grants (id, org, account, unit, amount, effective_at, source)
		VALUES ('gr_00000000000000000000000000000001', $1, $1, 'credits', 700, now(), 'purchase'),
		       ('gr_00000000000000000000000000000002', $1, $1, 'credits', 300, now(), 'purchase'),
		       ('gr_00000000000000000000000000000003', $1, $1, 'tokens', 50, now(), 'purchase')`, b.id("org"))
	require.NoError(t, err)
	// Neither a voided grant nor an expired one counts as granted.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO credit_grants (id, org, account, unit, amount, effective_at, expires_at, source, voided_at, voided_units)
		VALUES ('gr_00000000000000000000000000000004', $1, $1, 'credits', 5000, now(), NULL, 'purchase', now(), 5000),
		       ('gr_00000000000000000000000000000005', $1, $1, 'credits', 7000, now() - interval '2 days', now() - interval '1 day', 'purchase', NULL, NULL)`, b.id("org"))
	require.NoError(t, err)

	b.reload(t)
	lv := b.resolve(t, b.id("org")).Path[0]
	require.ElementsMatch(t, []policy.Alert{own.Alert,
		{Kind: policy.BalanceBelow, Unit: policy.Credits, Period: policy.Month, Thresholds: []int64{500}}}, lv.Alerts)
	require.Equal(t, map[policy.Unit]int64{policy.Credits: 1000, policy.Tokens: 50}, lv.Granted)
	require.Equal(t, []policy.Unit{policy.Credits, policy.Tokens}, lv.Credits, "units of any grant, voided and expired ones too")
	require.ElementsMatch(t, []policy.Alert{plan80.Alert,
		{Kind: policy.BalanceBelow, Unit: policy.Credits, Period: policy.Month, Thresholds: []int64{500}}},
		b.resolve(t, b.id("other")).Path[0].Alerts)

	require.NoError(t, b.store.DeleteAlert(b.ctx, own.ID))
	b.reload(t)
	require.Contains(t, b.resolve(t, b.id("org")).Path[0].Alerts, plan80.Alert, "the plan's again")
}

func TestAlertRulesInvalid(t *testing.T) {
	t.Parallel()
	b := planBundle(t)
	b.create(t, policy.Account{ID: b.id("org"), Kind: policy.Org})
	ok := policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens, Thresholds: []int64{80}}
	for _, c := range []struct {
		rule  policy.AlertRule
		field string
	}{
		{policy.AlertRule{Alert: ok}, "owner"},
		{policy.AlertRule{Account: b.id("org"), Plan: "team", Alert: ok}, "owner"},
		{policy.AlertRule{Account: b.id("nobody"), Alert: ok}, "owner"},
		{policy.AlertRule{Account: "bad id", Alert: ok}, "account"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: "x", Unit: policy.Tokens, Thresholds: []int64{1}}}, "kind"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.QuotaPercent, Unit: "x", Thresholds: []int64{1}}}, "unit"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens, Period: "week", Thresholds: []int64{1}}}, "period"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.BalanceBelow, Unit: policy.Tokens, Period: policy.Day, Thresholds: []int64{1}}}, "period"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens}}, "thresholds"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.QuotaPercent, Unit: policy.Tokens, Thresholds: []int64{101}}}, "thresholds"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.BalancePercent, Unit: policy.Tokens, Thresholds: []int64{0}}}, "thresholds"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.BalanceBelow, Unit: policy.Tokens, Thresholds: []int64{-5}}}, "thresholds"},
		{policy.AlertRule{Account: b.id("org"), Alert: policy.Alert{Kind: policy.BalanceBelow, Unit: policy.Tokens, Thresholds: make([]int64, 11)}}, "thresholds"},
	} {
		_, err := b.store.CreateAlert(b.ctx, c.rule)
		requireInvalid(t, err, c.field)
	}
	rules, err := b.store.Alerts(b.ctx, "", "")
	require.NoError(t, err)
	require.Empty(t, rules, "nothing written")
}
