package admission

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/keyspace"
)

// runScript runs s on the primary holding keys[0], as s.Run does. With
// Options.WaitReplicas set it sends WAIT in the same pipeline, on the same connection
// (WAIT counts the writes of the connection it is sent on), and fails with
// keyspace.ErrNotReplicated unless that many replicas acknowledged what the script wrote: an answer
// then never leaves before a replica that a failover would promote holds its event.
func (a *Admitter) runScript(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if _, cluster := a.rdb.(*redis.ClusterClient); a.opts.WaitReplicas <= 0 && !cluster {
		return s.Run(ctx, a.rdb, keys, args...)
	}
	// On a Cluster the call goes to the master's own client, which does not retry (the
	// cluster client retries a command whose connection died after it was sent, even with
	// MaxRetries -1: a decision charged twice). A MOVED is then an error, and reloads the
	// slot map for the next call.
	c, cc, err := keyspace.MasterFor(ctx, a.rdb, keys[0])
	if err != nil {
		return redis.NewCmdResult(nil, err)
	}
	if a.opts.WaitReplicas <= 0 {
		cmd := s.Run(ctx, c, keys, args...)
		keyspace.ReloadIfMoved(ctx, cc, cmd.Err())
		return cmd
	}
	script, wait := a.runAndWait(ctx, c, s.EvalSha, keys, args)
	if redis.HasErrorPrefix(script.Err(), "NOSCRIPT") { // not cached there yet (a promoted replica, a restart)
		script, wait = a.runAndWait(ctx, c, s.Eval, keys, args)
	}
	if err := script.Err(); err != nil {
		keyspace.ReloadIfMoved(ctx, cc, err)
		return redis.NewCmdResult(nil, err)
	}
	if err := keyspace.Replicated(wait, a.opts.WaitReplicas, a.opts.WaitTimeout); err != nil {
		a.metrics.notReplicated.Inc()
		return redis.NewCmdResult(nil, err)
	}
	return script
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
