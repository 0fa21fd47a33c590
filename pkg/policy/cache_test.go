package policy_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/pkg/policy"
)

// The bound the design promises: an upgrade is enforced by every admit node within 1 s.
const notifyWithin = time.Second

func TestCacheFollowsNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.False(t, b.cache.Loaded())
	require.Zero(t, b.cache.Len())
	_, err := b.cache.Resolve("anyone")
	require.ErrorIs(t, err, policy.ErrNotFound, "nothing resolves before the first load")
	_, _, err = b.cache.Authenticate("mgk_x")
	require.ErrorIs(t, err, policy.ErrNotFound)

	b.run(t)
	require.True(t, b.cache.Loaded())
	before := b.cache.Len()

	// Through the store, and never calling Reload.
	org, team := b.id("org"), b.id("team")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "free"})
	eventually(t, notifyWithin, "a new account is visible", func() bool {
		_, err := b.cache.Resolve(org)
		return err == nil
	})
	require.GreaterOrEqual(t, b.cache.Len(), before+1)
	_, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: org, Plan: "pro"})
	require.NoError(t, err)
	eventually(t, notifyWithin, "an upgrade is visible", func() bool { return b.resolve(t, org).Plan == "pro" })

	// Through raw SQL: the triggers notify, not the store.
	_, err = b.pool.Exec(b.ctx, `UPDATE accounts SET plan = 'enterprise' WHERE id = $1`, org)
	require.NoError(t, err)
	eventually(t, notifyWithin, "a plan set by SQL is visible", func() bool { return b.resolve(t, org).Plan == "enterprise" })
	_, err = b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'team', $2, $2)`, team, org)
	require.NoError(t, err)
	_, err = b.pool.Exec(b.ctx, `INSERT INTO account_limits (account, unit, "limit", window_s, burst, rate_per_s) VALUES ($1, 'tokens', 60, 60, 60, 1)`, team)
	require.NoError(t, err)
	eventually(t, notifyWithin, "an override set by SQL is visible", func() bool {
		r, err := b.cache.Resolve(team)
		return err == nil && r.Path[1].Limits[policy.Tokens].Burst == 60
	})
}

// When the LISTEN connection drops, the cache reconnects and reloads, so a change made
// while nobody listened is not lost.
func TestCacheReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	org := b.id("org")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "free"})
	b.run(t)
	require.Equal(t, "free", b.resolve(t, org).Plan)

	for round, plan := range []string{"pro", "enterprise"} {
		pid := b.cache.ListenerPID()
		require.NotZero(t, pid, "round %d", round)
		var ok bool
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&ok))
		require.True(t, ok)
		// Changed while the listener is (most likely) down: only the reload after the
		// reconnection can bring it.
		_, err := b.pool.Exec(b.ctx, `UPDATE accounts SET plan = $2 WHERE id = $1`, org, plan)
		require.NoError(t, err)
		eventually(t, 10*time.Second, "the listener reconnects", func() bool {
			p := b.cache.ListenerPID()
			return p != 0 && p != pid
		})
		eventually(t, notifyWithin, "the change made meanwhile is visible", func() bool { return b.resolve(t, org).Plan == plan })
	}

	// And notifications flow again.
	_, err := b.store.UpdateAccount(b.ctx, policy.Account{ID: org, Plan: "free"})
	require.NoError(t, err)
	eventually(t, notifyWithin, "a change after the reconnection is visible", func() bool { return b.resolve(t, org).Plan == "free" })
}

// Without a database, Run keeps trying (the previous policies, here none, stay) and still
// returns when its context ends.
func TestCacheWithoutDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c := policy.NewCache(pool, quietLog(), time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	require.NoError(t, c.Run(ctx))
	require.Less(t, time.Since(start), 5*time.Second, "Run returns soon after its context ends")
	require.False(t, c.Loaded())
	require.Error(t, c.Reload(context.Background()))
}
