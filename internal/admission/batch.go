package admission

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/lua"
)

// drain sends the shard's waiting decisions in batches until none waits. Once own is
// decided, the rest is left to a new goroutine, so that a caller's latency is its own
// batch's, not the whole backlog's.
func (a *Admitter) drain(shard int, own *call) {
	q := &a.queues[shard]
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		if own != nil && own.sent.Load() {
			q.mu.Unlock()
			go a.drain(shard, nil)
			return
		}
		n := min(len(q.pending), a.opts.MaxBatch)
		batch := make([]*call, n)
		copy(batch, q.pending)
		q.pending = append(q.pending[:0], q.pending[n:]...)
		q.mu.Unlock()
		a.run(shard, batch)
	}
}

func deliver(c *call, d Decision, err error) {
	c.sent.Store(true)
	c.done <- result{d, err}
}

// run takes a batch of one shard's decisions in one script call. A decision whose program
// the mirror does not hold (a new policy, a wiped or failed-over Redis) is sent again at
// once with its program inline.
func (a *Admitter) run(shard int, batch []*call) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.CallTimeout)
	defer cancel()
	now := a.opts.Clock.Now()
	for attempt := 0; ; attempt++ {
		enc := a.encode(shard, batch, now)
		start := time.Now()
		raw, err := a.runScript(ctx, lua.Admit, enc.keys, enc.args...).Slice()
		a.metrics.observe(len(batch), time.Since(start))
		if err != nil {
			if notSent(err) {
				err = fmt.Errorf("%w: %w", ErrNotSent, err)
			}
			for _, c := range batch {
				deliver(c, Decision{}, fmt.Errorf("admission script: %w", err))
			}
			return
		}
		ok, redisNow, err := replyHeader(raw)
		if err == nil && !ok && attempt == 0 {
			now = redisNow // this node's clock is off: take the bounds from Redis TIME
			continue
		}
		if err == nil && !ok {
			err = fmt.Errorf("redis time %s outside the period bounds given twice", redisNow)
		}
		if err == nil && len(raw) != replyHeaderLen+len(batch) {
			err = fmt.Errorf("admission script: %d replies for %d decisions", len(raw)-replyHeaderLen, len(batch))
		}
		var missed []*call
		for i, c := range batch {
			if err != nil {
				deliver(c, Decision{}, err)
				continue
			}
			d, derr := enc.plans[i].decision(raw[replyHeaderLen+i], redisNow)
			if errors.Is(derr, errMirrorMiss) && !c.inline && !c.noInline {
				c.inline = true
				missed = append(missed, c)
				continue
			}
			deliver(c, d, derr)
		}
		if len(missed) == 0 {
			return
		}
		a.metrics.mirrorMisses.Add(float64(len(missed)))
		batch = missed
	}
}

// notSent reports an error that leaves the command unsent: a refused or failed dial, no
// free connection in the pool, a closed client.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrClosed)
}
