package policy

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Channel is the PostgreSQL notification channel the policy tables' triggers notify (with
// the table's name as payload) on every change.
const Channel = "metergate_policy"

// DefaultReloadEvery is the period of the fallback full reload when NewCache is given none.
const DefaultReloadEvery = time.Minute

// Reconnection backoff of the LISTEN connection.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// Cache holds every account's effective policy in memory so admission never waits for
// PostgreSQL, and keeps it fresh through LISTEN/NOTIFY with a periodic full reload as a
// fallback. Each load builds a complete snapshot that replaces the previous one atomically:
// readers never lock and never see a half-loaded state. The values it returns share the
// snapshot's maps and slices and must not be modified.
type Cache struct {
	pool        *pgxpool.Pool
	log         *slog.Logger
	reloadEvery time.Duration

	snap     atomic.Pointer[snapshot]
	reloadMu sync.Mutex // one load at a time, so a slower older load never replaces a newer one

	listenerPID atomic.Uint32 // backend pid of the LISTEN connection, 0 when down (for tests)

	dirty chan struct{} // a load is wanted (notifications, WaitFresh)
}

// snapshot is one consistent load of every policy table.
type snapshot struct {
	// started is when the load began: the snapshot holds every write committed before.
	started  time.Time
	resolved map[string]Resolved
	keys     map[[sha256.Size]byte]APIKey
}

// NewCache returns an empty cache over pool; Run (or Reload) fills it. reloadEvery is the
// period of the fallback full reload; zero or less means DefaultReloadEvery.
func NewCache(pool *pgxpool.Pool, log *slog.Logger, reloadEvery time.Duration) *Cache {
	if reloadEvery <= 0 {
		reloadEvery = DefaultReloadEvery
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{pool: pool, log: log, reloadEvery: reloadEvery, dirty: make(chan struct{}, 1)}
}

// Loaded reports whether at least one load succeeded (readiness: admit cannot decide
// before).
func (c *Cache) Loaded() bool { return c.snap.Load() != nil }

// Len returns the number of accounts cached.
func (c *Cache) Len() int {
	if s := c.snap.Load(); s != nil {
		return len(s.resolved)
	}
	return 0
}

// Resolve returns the effective policy of an account, or ErrNotFound (also before the
// first load, and for an account whose ancestry is broken, which is logged at load).
func (c *Cache) Resolve(account string) (Resolved, error) {
	if s := c.snap.Load(); s != nil {
		if r, ok := s.resolved[account]; ok {
			return r, nil
		}
	}
	return Resolved{}, fmt.Errorf("account %q: %w", account, ErrNotFound)
}

// Authenticate finds the API key whose secret this is and the effective policy of its
// account. ErrNotFound for an unknown key (or one whose account cannot be resolved),
// ErrRevoked (with the key) for a revoked one. The lookup is by the secret's SHA-256, so
// its timing tells nothing useful about secrets that exist.
func (c *Cache) Authenticate(secret string) (APIKey, Resolved, error) {
	s := c.snap.Load()
	if s == nil {
		return APIKey{}, Resolved{}, fmt.Errorf("api key: %w", ErrNotFound)
	}
	key, ok := s.keys[sha256.Sum256([]byte(secret))]
	if !ok {
		return APIKey{}, Resolved{}, fmt.Errorf("api key: %w", ErrNotFound)
	}
	if key.RevokedAt != nil {
		return key, Resolved{}, fmt.Errorf("api key %s: %w", key.ID, ErrRevoked)
	}
	r, ok := s.resolved[key.Account]
	if !ok {
		return key, Resolved{}, fmt.Errorf("account %q of api key %s: %w", key.Account, key.ID, ErrNotFound)
	}
	return key, r, nil
}

// WaitFresh waits until the cache holds a snapshot whose load began after since, so that
// a write committed before since is visible: take since after the write's commit, not
// before it (a load that began between the two would not see it). It asks Run for a load,
// coalesced with the one the write's notification asked for, and returns the context's
// error if no such load is done first.
func (c *Cache) WaitFresh(ctx context.Context, since time.Time) error {
	select {
	case c.dirty <- struct{}{}:
	default: // a load is already wanted
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if s := c.snap.Load(); s != nil && s.started.After(since) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a policy load after %s: %w", since.Format(time.RFC3339Nano), ctx.Err())
		case <-t.C:
		}
	}
}

// Reload reads every policy table in one consistent snapshot (a repeatable-read
// transaction), resolves every account and swaps the result in. On error the previous
// snapshot stays.
func (c *Cache) Reload(ctx context.Context) error {
	c.reloadMu.Lock()
	defer c.reloadMu.Unlock()
	start := time.Now()
	var s *snapshot
	err := pgx.BeginTxFunc(ctx, c.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		s, err = c.load(ctx, tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("load policies: %w", err)
	}
	s.started = start
	first := c.snap.Swap(s) == nil
	level := slog.LevelDebug // a load per change: only the first is news
	if first {
		level = slog.LevelInfo
	}
	c.log.Log(ctx, level, "policies loaded", "accounts", len(s.resolved), "api_keys", len(s.keys), "took", time.Since(start))
	return nil
}

// The statements of the cache's load (the plans': loadPlans).
var (
	//go:embed sql/load_accounts.sql
	loadAccountsSQL string
	//go:embed sql/load_account_limits.sql
	loadAccountLimitsSQL string
	//go:embed sql/load_credit_grants.sql
	loadCreditGrantsSQL string
	//go:embed sql/load_api_keys.sql
	loadAPIKeysSQL string
)

func (c *Cache) load(ctx context.Context, tx pgx.Tx) (*snapshot, error) {
	byID, err := loadPlans(ctx, tx)
	if err != nil {
		return nil, err
	}
	plans, err := newPlanSet(byID)
	if err != nil {
		return nil, err
	}

	var count int
	if err := tx.QueryRow(ctx, `select count(*) from accounts`).Scan(&count); err != nil {
		return nil, fmt.Errorf("count accounts: %w", err)
	}
	nodes := make([]node, 0, count)
	index := make(map[string]int, count)
	rows, err := tx.Query(ctx, loadAccountsSQL)
	if err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}
	for rows.Next() {
		var n node
		if err := rows.Scan(&n.id, &n.kind, &n.parent, &n.org, &n.plan, &n.concurrency, &n.priority, &n.shadow); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read accounts: %w", err)
		}
		index[n.id] = len(nodes)
		nodes = append(nodes, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read accounts: %w", err)
	}

	rows, err = tx.Query(ctx, loadAccountLimitsSQL)
	if err != nil {
		return nil, fmt.Errorf("read overrides: %w", err)
	}
	var (
		account string
		u       Unit
		l       limitRow
	)
	dest := append([]any{&account, &u}, l.dest()...)
	for rows.Next() {
		l = limitRow{}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read overrides: %w", err)
		}
		if i, ok := index[account]; ok { // always (foreign key)
			nodes[i].addOverride(u, l.toLimit())
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read overrides: %w", err)
	}

	// Accounts with a credit grant of a unit (spent, expired or voided ones too: an
	// account that has had credit is drawn from, and refused at zero), and the units of
	// its grants neither voided nor expired (BalancePercent's 100 %), in one read.
	rows, err = tx.Query(ctx, loadCreditGrantsSQL)
	if err != nil {
		return nil, fmt.Errorf("read credit grants: %w", err)
	}
	for rows.Next() {
		var granted int64
		if err := rows.Scan(&account, &u, &granted); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read credit grants: %w", err)
		}
		if i, ok := index[account]; ok { // always (foreign key)
			n := &nodes[i]
			n.credits = append(n.credits, u)
			if granted > 0 {
				if n.granted == nil {
					n.granted = map[Unit]int64{}
				}
				n.granted[u] = granted
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read credit grants: %w", err)
	}

	alerts, err := loadAlerts(ctx, tx)
	if err != nil {
		return nil, err
	}
	for id, a := range alerts.byPlan {
		if p, ok := byID[id]; ok {
			p.alerts = a
		}
	}
	for i := range nodes {
		n := &nodes[i]
		n.alerts = alerts.byAccount[n.id]
	}

	resolved, bad := resolveAll(nodes, plans)
	if len(bad) > 0 {
		logged := 0
		for id, err := range bad {
			if logged++; logged > 10 {
				break
			}
			c.log.Error("account left out of the policy cache: its requests are refused", "account", id, "err", err)
		}
		c.log.Error("accounts left out of the policy cache", "count", len(bad))
	}

	keys := make(map[[sha256.Size]byte]APIKey)
	rows, err = tx.Query(ctx, loadAPIKeysSQL)
	if err != nil {
		return nil, fmt.Errorf("read api keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			k    APIKey
			hash []byte
		)
		if err := rows.Scan(&k.ID, &k.Account, &hash, &k.CreatedAt, &k.RevokedAt); err != nil {
			return nil, fmt.Errorf("read api keys: %w", err)
		}
		var h [sha256.Size]byte
		if copy(h[:], hash) != len(h) {
			continue // cannot happen (check constraint)
		}
		keys[h] = k
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read api keys: %w", err)
	}
	return &snapshot{resolved: resolved, keys: keys}, nil
}

// Run keeps the cache fresh until ctx ends, then returns nil. It LISTENs on Channel on a
// connection of its own (outside the pool, which it would otherwise hold forever) and
// reloads on every notification; notifications that arrive during a load are coalesced
// into one more load. Every reloadEvery it reloads anyway, in case a notification was
// lost. When the connection drops it reconnects with backoff and reloads, since
// notifications sent meanwhile are gone. A failed load is logged and retried with backoff;
// the previous snapshot keeps serving.
func (c *Cache) Run(ctx context.Context) error {
	// Listen before the first load, so no change can fall between the two.
	conn, err := c.listen(ctx)
	if err != nil && ctx.Err() == nil {
		c.log.Warn("policy listener: cannot listen yet, retrying", "err", err)
	}
	dirty := c.dirty
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.listenLoop(ctx, conn, dirty)
	}()
	defer wg.Wait()

	ticker := time.NewTicker(c.reloadEvery)
	defer ticker.Stop()
	var retry <-chan time.Time // set while a failed load waits to be retried
	backoff := minBackoff
	for {
		if err := c.Reload(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.log.Error("policy reload failed; the previous policies stay in force", "err", err, "retry_in", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, maxBackoff)
		} else {
			retry, backoff = nil, minBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-dirty:
		case <-ticker.C:
		case <-retry:
		}
	}
}

// listen opens the dedicated connection and LISTENs on Channel. Channels are database-wide,
// so the pool's search_path does not matter here.
func (c *Cache) listen(ctx context.Context) (*pgx.Conn, error) {
	cfg := c.pool.Config().ConnConfig
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = make(map[string]string)
	}
	cfg.RuntimeParams["application_name"] = "metergate-policy-listener"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{Channel}.Sanitize()); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("listen %s: %w", Channel, err)
	}
	c.listenerPID.Store(conn.PgConn().PID())
	return conn, nil
}

// listenLoop marks dirty on every notification, and reconnects with backoff when the
// connection is lost (or was never made), marking dirty once listening again.
func (c *Cache) listenLoop(ctx context.Context, conn *pgx.Conn, dirty chan<- struct{}) {
	mark := func() {
		select {
		case dirty <- struct{}{}:
		default: // a load is pending already: it will see this change too
		}
	}
	backoff := minBackoff
	for {
		if conn == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			var err error
			if conn, err = c.listen(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				backoff = min(2*backoff, maxBackoff)
				c.log.Warn("policy listener: reconnect failed", "err", err, "retry_in", backoff)
				continue
			}
			c.log.Info("policy listener: listening again")
			backoff = minBackoff
			mark() // changes made while disconnected were notified to nobody
		}
		_, err := conn.WaitForNotification(ctx)
		if err == nil {
			mark()
			continue
		}
		c.listenerPID.Store(0)
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		conn = nil
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("policy listener: connection lost, reconnecting", "err", err, "retry_in", backoff)
	}
}
