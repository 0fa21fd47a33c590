package demo

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/sandbox"
)

// prepaidOrg pays in advance: every call of its key carries prepaidUnit, drawn from its
// grants (docs/credits.md). It is granted enough for about the first quarter of the
// traffic, runs out (402 insufficient_balance), and is topped up mid-run.
const (
	prepaidOrg  = "prepaidco"
	prepaidUnit = "cost_micros"
)

// Idempotency keys of prepaidco's grants: the first is sent twice, as a client retry would.
const (
	grantKey = "demo-prepaid-order-1"
	topUpKey = "demo-prepaid-order-2"
)

// prepaidGrants are the amounts of prepaidco's first grant and of its top-up, for d of
// traffic. Its caller makes about 9 calls a second of 5,000 cost_micros on average: the
// first grant lasts about a fifth of the run, the top-up (four times as much) the rest.
func prepaidGrants(d time.Duration) (first, topUp int64) {
	first = max(10_000, int64(math.Round(d.Seconds()))*10_000)
	return first, 4 * first
}

// grantReply is a grant as admit answers it.
type grantReply struct {
	ID             string    `json:"id"`
	Amount         int64     `json:"amount"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
}

// grant gives account amount units of unit (POST /v1/admin/accounts/{id}/grants, a
// purchase) with an idempotency key; want is 201 for a new grant, 200 for a retry.
func grant(ctx context.Context, a sandbox.Admin, account, unit string, amount int64, key string, want int) (grantReply, error) {
	var g grantReply
	body := map[string]any{"unit": unit, "amount": amount, "source": "purchase", "idempotency_key": key}
	err := a.Do(ctx, http.MethodPost, "/v1/admin/accounts/"+account+"/grants", body, want, &g)
	return g, err
}

// grantPrepaid makes prepaidco's first grant, then retries it: the retry must be answered
// 200 with the same grant, and grant nothing more.
func grantPrepaid(ctx context.Context, a sandbox.Admin, c *Credits, amount int64) error {
	g, err := grant(ctx, a, c.Account, c.Unit, amount, grantKey, http.StatusCreated)
	if err != nil {
		return err
	}
	again, err := grant(ctx, a, c.Account, c.Unit, amount, grantKey, http.StatusOK)
	if err != nil {
		return fmt.Errorf("retry of the grant: %w", err)
	}
	c.Grants = append(c.Grants, GrantMade{ID: g.ID, Amount: g.Amount, Key: g.IdempotencyKey})
	c.RetryID = again.ID
	return nil
}

// readCredits reads prepaidco's ledger (finance_credit_balances, and the refunds under it)
// and its balance in Redis (GET /v1/balance/{account}, service token).
func readCredits(ctx context.Context, pool *pgxpool.Pool, svc sandbox.Admin, c *Credits) error {
	err := pool.QueryRow(ctx, `
		SELECT granted, consumed, refunded, voided, expired, balance
		FROM finance_credit_balances WHERE account = $1 AND unit = $2`, c.Account, c.Unit).
		Scan(&c.Ledger.Granted, &c.Ledger.Consumed, &c.Ledger.Refunded, &c.Ledger.Voided, &c.Ledger.Expired, &c.Ledger.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("finance_credit_balances: no row of %s %s", c.Account, c.Unit)
	}
	if err != nil {
		return fmt.Errorf("read finance_credit_balances: %w", err)
	}
	err = pool.QueryRow(ctx, `
		SELECT count(*), coalesce(sum(a.units), 0)::bigint, count(*) FILTER (WHERE a.applied_at IS NULL)
		FROM credit_adjustments a JOIN credit_grants g ON g.id = a.grant_id
		WHERE g.account = $1 AND g.unit = $2 AND a.kind = 'refund'`, c.Account, c.Unit).
		Scan(&c.Refunds, &c.RefundedUnits, &c.RefundsNotApplied)
	if err != nil {
		return fmt.Errorf("read credit_adjustments: %w", err)
	}
	var reply struct {
		Units map[string]struct {
			Balance int64 `json:"balance"`
		} `json:"units"`
	}
	if err := svc.Do(ctx, http.MethodGet, "/v1/balance/"+c.Account, nil, http.StatusOK, &reply); err != nil {
		return err
	}
	u, ok := reply.Units[c.Unit]
	if !ok {
		return fmt.Errorf("GET /v1/balance/%s: no %s balance", c.Account, c.Unit)
	}
	c.Redis = u.Balance
	c.Read = true
	return nil
}
