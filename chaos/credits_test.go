package chaos_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

// Scenario 11: a prepaid org with a balance of N credits, 2N requests of one credit each
// from 32 callers while admit is killed with SIGKILL (callers retry with the same
// idempotency key). Exactly N are admitted and N refused 402 insufficient_balance; the
// balance ends at 0 in Redis and in the ledger, which holds one draw per admitted request:
// nothing drawn twice, nothing lost.
func TestKillAdmitWithBalance(t *testing.T) {
	t.Parallel()
	sc := begin(t, "11 kill -9 admit, prepaid")
	s := newStack(t, options{})
	key := s.account("chaos-prepaid", "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})
	balance := pick(500, 3_000)
	ctx := testenv.Context(t, time.Minute)
	status, out, err := call(ctx, "POST", s.admits[0].URL()+"/v1/admin/accounts/chaos-prepaid/grants", adminToken,
		map[string]any{"unit": "credits", "amount": balance, "source": "purchase", "idempotency_key": "chaos-topup-1"})
	require.NoError(t, err)
	require.Equal(t, 201, status, "grant: %v", out)
	// Every node learns that the org has credits through LISTEN/NOTIFY (< 1 s): until then
	// its requests are not drawn. Each node's effective policy says when it has.
	for _, a := range s.admits {
		for {
			status, out, err := call(ctx, "GET", a.URL()+"/v1/admin/accounts/chaos-prepaid", adminToken, nil)
			require.NoError(t, err)
			require.Equal(t, 200, status, "%v", out)
			if fmt.Sprint(out["effective"]) != fmt.Sprint(nil) && fmt.Sprint(out["effective"].(map[string]any)["path"].([]any)[0].(map[string]any)["credits"]) == "[credits]" {
				break
			}
			require.NoError(t, ctx.Err(), "admit %s never learned of the grant: %v", a.addr, out)
			time.Sleep(10 * time.Millisecond)
		}
	}

	requests := 2 * balance
	k := &killer{node: s.admits[0], kills: pick(1, 4), requests: requests}
	res := s.load(loadSpec{Requests: requests, Workers: 32, Keys: []string{key}, Retry5xx: true, Deadline: 5 * time.Minute,
		Units: map[string]int64{"requests": 1, "credits": 1}, Progress: k.progress})
	k.require(t)
	b := s.waitBooks(2*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("%d kills; balance %d; final answers %v", k.killed, balance, res.Status)
	require.Equal(t, balance, res.Status[200], "exactly the balance admitted")
	require.Equal(t, balance, res.Status[402], "the rest refused")
	b.requireExact(t, balance)

	// One draw per admitted request, of one credit, in the ledger; the balance is spent.
	var draws, units int64
	var distinct int
	deadline := time.Now().Add(time.Minute)
	for {
		require.NoError(t, s.db.QueryRow(ctx, `select count(*), coalesce(sum(units), 0), count(distinct event_id)
			from credit_consumptions where account = 'chaos-prepaid'`).Scan(&draws, &units, &distinct))
		if draws >= int64(balance) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, int64(balance), draws)
	require.Equal(t, int64(balance), units)
	require.Equal(t, balance, distinct)
	var ledger int64
	require.NoError(t, s.db.QueryRow(ctx, `select balance from finance_credit_balances where account = 'chaos-prepaid' and unit = 'credits'`).Scan(&ledger))
	require.Zero(t, ledger, "the ledger's balance")
	status, out, err = call(ctx, "GET", s.admits[0].URL()+"/v1/balance/chaos-prepaid", serviceToken, nil)
	require.NoError(t, err)
	require.Equal(t, 200, status, "%v", out)
	units2, _ := out["units"].(map[string]any)
	cr, _ := units2["credits"].(map[string]any)
	require.EqualValues(t, 0, cr["balance"], "Redis's balance: %v", out)
}
