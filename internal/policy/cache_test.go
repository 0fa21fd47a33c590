package policy_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/policy"
)

// The bound the design promises: an upgrade is enforced by every admit node within 1 s.
const notifyWithin = time.Second

// noFallback is the fallback full reload of the caches that stand for admit nodes here: far
// longer than a test, so only a notification can bring a change within notifyWithin.
const noFallback = time.Hour

// nodes starts n caches, each on a pool of its own (as n admit processes would be), with
// no fallback reload within the test, and waits for their first load.
func (b *testBundle) nodes(t *testing.T, n int) []*policy.Cache {
	t.Helper()
	caches := make([]*policy.Cache, n)
	for i := range caches {
		pool, err := pgxpool.NewWithConfig(b.ctx, b.pool.Config().Copy())
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		c := policy.NewCache(pool, quietLog(), noFallback)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done, "Run returns nil when its context ends")
		})
		caches[i] = c
	}
	for i, c := range caches {
		eventually(t, 5*time.Second, fmt.Sprintf("cache %d loads", i), c.Loaded)
	}
	return caches
}

// enforcedWithin polls every cache in caches at once until decides holds for it, and fails
// unless each did within notifyWithin of start (taken before the change's COMMIT). It keeps
// polling a late cache up to 10 s, so that a failure says how late it was. caches[0] is node
// number first.
func enforcedWithin(t *testing.T, start time.Time, what string, first int, caches []*policy.Cache, decides func(c *policy.Cache) bool) {
	t.Helper()
	took := make([]time.Duration, len(caches))
	var wg sync.WaitGroup
	for i, c := range caches {
		wg.Go(func() {
			for !decides(c) {
				if time.Since(start) > 10*time.Second {
					took[i] = -1
					return
				}
				time.Sleep(time.Millisecond) // polling interval, not synchronisation
			}
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	t.Logf("%s: enforced after %v (-1ns: not within 10 s)", what, took)
	for i, d := range took {
		require.True(t, d >= 0, "%s: node %d did not enforce it within 10 s", what, first+i)
		require.Less(t, d, notifyWithin, "%s: node %d enforced it too late", what, first+i)
	}
}

// Three caches stand for three admit nodes, each reloading on its own (fallback reload far
// beyond the test). A change made through one node (the store's write, then that node's
// WaitFresh, as admit's PUT does) and changes made straight in PostgreSQL are enforced by
// every cache within 1 s of the COMMIT: the clock starts before the write commits, not
// after the writing node has reloaded.
func TestCacheFollowsNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.False(t, b.cache.Loaded())
	require.Zero(t, b.cache.Len())
	_, err := b.cache.Resolve("anyone")
	require.ErrorIs(t, err, policy.ErrNotFound, "nothing resolves before the first load")
	_, _, err = b.cache.Authenticate("mgk_x")
	require.ErrorIs(t, err, policy.ErrNotFound)

	// An account and its key made before the nodes start: their first load has them, so
	// the setup does not depend on notifications.
	org, team := b.id("org"), b.id("team")
	b.create(t, policy.Account{ID: org, Kind: policy.Org, Plan: "free"})
	key, secret, err := b.store.CreateAPIKey(b.ctx, org)
	require.NoError(t, err)
	nodes := b.nodes(t, 3)
	for i, c := range nodes {
		_, r, err := c.Authenticate(secret)
		require.NoError(t, err, "cache %d", i)
		require.Equal(t, "free", r.Plan)
	}

	// Through node 0: the store's write, then node 0 waits for its own reload (admit's PUT).
	// The clock starts before the write; the others must not need node 0's reload.
	start := time.Now()
	_, err = b.store.UpdateAccount(b.ctx, policy.Account{ID: org, Plan: "pro", Limits: map[policy.Unit]policy.Limit{
		policy.Requests: {Quota: ptr[int64](0), QuotaPeriod: policy.Month}}})
	require.NoError(t, err)
	require.NoError(t, nodes[0].WaitFresh(b.ctx, time.Now()))
	refuses := func(c *policy.Cache) bool {
		_, r, err := c.Authenticate(secret)
		if err != nil || r.Plan != "pro" {
			return false
		}
		q := r.Path[0].Limits[policy.Requests].Quota
		return q != nil && *q == 0
	}
	require.True(t, refuses(nodes[0]), "node 0 reloaded before its PUT returned")
	enforcedWithin(t, start, "an upgrade to pro with a requests quota of 0, through node 0", 1, nodes[1:], refuses)

	// Straight in PostgreSQL, in a transaction: the clock starts just before its COMMIT.
	tx, err := b.pool.Begin(b.ctx)
	require.NoError(t, err)
	_, err = tx.Exec(b.ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, key.ID)
	require.NoError(t, err)
	start = time.Now()
	require.NoError(t, tx.Commit(b.ctx))
	enforcedWithin(t, start, "a key revoked by SQL", 0, nodes, func(c *policy.Cache) bool {
		_, _, err := c.Authenticate(secret)
		return errors.Is(err, policy.ErrRevoked)
	})

	// Every policy table's trigger notifies (each statement commits on its own).
	start = time.Now()
	_, err = b.pool.Exec(b.ctx, `UPDATE accounts SET plan = 'enterprise' WHERE id = $1`, org)
	require.NoError(t, err)
	enforcedWithin(t, start, "a plan set by SQL", 0, nodes, func(c *policy.Cache) bool {
		r, err := c.Resolve(org)
		return err == nil && r.Plan == "enterprise"
	})
	start = time.Now()
	_, err = b.pool.Exec(b.ctx, `INSERT INTO accounts (id, kind, parent, org) VALUES ($1, 'team', $2, $2)`, team, org)
	require.NoError(t, err)
	enforcedWithin(t, start, "an account inserted by SQL", 0, nodes, func(c *policy.Cache) bool {
		_, err := c.Resolve(team)
		return err == nil
	})
	start = time.Now()
	_, err = b.pool.Exec(b.ctx, `INSERT INTO account_limits (account, unit, "limit", window_s, burst, rate_per_s) VALUES ($1, 'tokens', 60, 60, 60, 1)`, team)
	require.NoError(t, err)
	enforcedWithin(t, start, "an override set by SQL", 0, nodes, func(c *policy.Cache) bool {
		r, err := c.Resolve(team)
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
