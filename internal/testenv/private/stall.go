package private

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// busy keeps Redis busy for ARGV[1] ms: a slow command, as a long script or a KEYS on a big
// keyspace is in production. Redis runs nothing else meanwhile (it writes nothing, so it
// could be killed with SCRIPT KILL after busy-reply-threshold).
var busy = redis.NewScript(`
local t = redis.call('TIME')
local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1]) * 1000
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop
return 1`)

// StallRedis makes the Redis server at addr busy for d, and returns once the stall has
// begun (a PING no longer answers); errc then receives the stall's end. It opens its own
// connections, so the client under test is not the one stalled.
func StallRedis(ctx context.Context, opts *redis.Options, d time.Duration) (errc <-chan error, err error) {
	stall := redis.NewClient(opts)
	po := *opts
	po.ReadTimeout, po.MaxRetries = 20*time.Millisecond, -1
	probe := redis.NewClient(&po)
	done := make(chan error, 1)
	go func() {
		defer func() { _ = stall.Close() }()
		done <- busy.Eval(context.WithoutCancel(ctx), stall, nil, d.Milliseconds()).Err()
	}()
	defer func() { _ = probe.Close() }()
	for {
		perr := probe.Ping(ctx).Err()
		switch {
		case isTimeout(perr):
			return done, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("stall redis: %w", ctx.Err())
		}
		select {
		case err := <-done:
			return nil, fmt.Errorf("stall redis: over before it was seen: %w", exitOf(err))
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// exitOf is the busy script's end as an error (nil when it ended well).
func exitOf(err error) error {
	if err == nil {
		return errors.New("the script returned")
	}
	return err
}
