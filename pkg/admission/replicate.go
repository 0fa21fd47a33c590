package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated says a script call ran on the primary but fewer replicas than
// Options.WaitReplicas acknowledged its writes within Options.WaitTimeout (or the WAIT
// failed). The writes may still be lost in a failover, so the decision is not told: the
// caller treats it as an outcome unknown (503, and the decision voided).
var ErrNotReplicated = errors.New("redis: writes not acknowledged by enough replicas")

// runScript runs s on the primary holding keys[0], as s.Run does. With
// Options.WaitReplicas set it sends WAIT in the same pipeline, on the same connection
// (WAIT counts the writes of the connection it is sent on), and fails with
// ErrNotReplicated unless that many replicas acknowledged what the script wrote: an answer
// then never leaves before a replica that a failover would promote holds its event.
func (a *Admitter) runScript(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if _, cluster := a.rdb.(*redis.ClusterClient); a.opts.WaitReplicas <= 0 && !cluster {
		return s.Run(ctx, a.rdb, keys, args...)
	}
	// On a Cluster the call goes to the master's own client, which does not retry (the
	// cluster client retries a command whose connection died after it was sent, even with
	// MaxRetries -1: a decision charged twice). A MOVED is then an error, and reloads the
	// slot map for the next call.
	c, cc, err := masterOf(ctx, a.rdb, keys[0])
	if err != nil {
		return redis.NewCmdResult(nil, err)
	}
	if a.opts.WaitReplicas <= 0 {
		cmd := s.Run(ctx, c, keys, args...)
		reloadIfMoved(ctx, cc, cmd.Err())
		return cmd
	}
	script, wait := a.runAndWait(ctx, c, s.EvalSha, keys, args)
	if redis.HasErrorPrefix(script.Err(), "NOSCRIPT") { // not cached there yet (a promoted replica, a restart)
		script, wait = a.runAndWait(ctx, c, s.Eval, keys, args)
	}
	if err := script.Err(); err != nil {
		reloadIfMoved(ctx, cc, err)
		return redis.NewCmdResult(nil, err)
	}
	if err := replicated(wait, a.opts.WaitReplicas, a.opts.WaitTimeout); err != nil {
		a.metrics.notReplicated.Inc()
		return redis.NewCmdResult(nil, err)
	}
	return script
}

// WaitReplicated returns once n replicas hold every write the primary holding key took
// before the call, waiting at most timeout: it writes a key of key's slot (key + ":fence")
// and sends WAIT in the same pipeline. Short of n it returns ErrNotReplicated. The relay
// calls it before it produces what it read, so that Kafka never receives an entry (a
// usage event, a void) that a failover could take back from Redis.
func WaitReplicated(ctx context.Context, rdb redis.UniversalClient, key string, n int, timeout time.Duration) error {
	c, cc, err := masterOf(ctx, rdb, key)
	if err != nil {
		return err
	}
	var fence *redis.StatusCmd
	var wait *redis.Cmd
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error { // each command's own error is read below
		fence = p.Set(ctx, key+":fence", "1", time.Hour)
		wait = p.Do(ctx, "WAIT", n, timeout.Milliseconds())
		return nil
	})
	if err := fence.Err(); err != nil {
		reloadIfMoved(ctx, cc, err)
		return err
	}
	return replicated(wait, n, timeout)
}

// replicated reads WAIT's reply: ErrNotReplicated unless n replicas acknowledged within
// timeout.
func replicated(wait *redis.Cmd, n int, timeout time.Duration) error {
	got, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotReplicated, err)
	}
	if got < int64(n) {
		return fmt.Errorf("%w: %d of %d within %s", ErrNotReplicated, got, n, timeout)
	}
	return nil
}

// reloadIfMoved reloads a Cluster's slot map (cc; nil off a Cluster) when err says the
// slot is no longer where the call went (a failover): the next call finds its new master.
func reloadIfMoved(ctx context.Context, cc *redis.ClusterClient, err error) {
	if cc != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "CLUSTERDOWN")) {
		cc.ReloadState(ctx)
	}
}

// masterOf returns what sends commands to the primary holding key: rdb itself, or on a
// Cluster the client of key's master (then also the cluster client, to reload its slots).
func masterOf(ctx context.Context, rdb redis.UniversalClient, key string) (redis.Cmdable, *redis.ClusterClient, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return rdb, nil, nil
	}
	node, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	return node, cc, nil
}

// runAndWait pipelines the script call (EVALSHA or EVAL) and WAIT on c.
func (a *Admitter) runAndWait(ctx context.Context, c redis.Cmdable,
	run func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd, keys []string, args []any,
) (script, wait *redis.Cmd) {
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error { // each command's own error is read below
		script = run(ctx, p, keys, args...)
		wait = p.Do(ctx, "WAIT", a.opts.WaitReplicas, a.opts.WaitTimeout.Milliseconds())
		return nil
	})
	return script, wait
}
