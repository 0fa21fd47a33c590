package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A row's ingest_time (DEFAULT now()) is the start of the meter's transaction, not the
// moment the row became visible. PostgreSQL records no commit time unless
// track_commit_timestamp is on (a server setting the bench does not change), so the bench
// observes commits itself: commitClock reads the current snapshot every few milliseconds,
// and a transaction became visible (committed, as any reader sees it) at the first
// snapshot that no longer lists it as running. Each row's xmin names its transaction, so
// every row gets a commit time, late by at most one poll.

// snapshot is pg_current_snapshot() at a time: transactions below xmin are finished,
// those from xmax on had not started, those in xip were running.
type snapshot struct {
	at         time.Time
	xmin, xmax uint64
	xip        []uint64
}

// parseSnapshot reads pg_snapshot's text form "xmin:xmax:xip,xip,…".
func parseSnapshot(s string) (snapshot, error) {
	var sn snapshot
	f := strings.Split(s, ":")
	if len(f) != 3 {
		return sn, fmt.Errorf("snapshot %q", s)
	}
	var err1, err2 error
	sn.xmin, err1 = strconv.ParseUint(f[0], 10, 64)
	sn.xmax, err2 = strconv.ParseUint(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return sn, fmt.Errorf("snapshot %q: %w", s, err)
	}
	if f[2] != "" {
		for _, x := range strings.Split(f[2], ",") {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				return sn, fmt.Errorf("snapshot %q: %w", s, err)
			}
			sn.xip = append(sn.xip, v)
		}
	}
	return sn, nil
}

// done reports whether transaction xid (64-bit) had ended when the snapshot was taken.
func (sn snapshot) done(xid uint64) bool {
	return xid < sn.xmin || (xid < sn.xmax && !slices.Contains(sn.xip, xid))
}

// commitClock polls snapshots until stopped.
type commitClock struct {
	mu     sync.Mutex
	snaps  []snapshot
	cancel context.CancelFunc
	done   chan error
}

// commitPoll is the commit clock's period: the most a commit time is late by (plus the
// query's own time, reported with the figures).
const commitPoll = 5 * time.Millisecond

func startCommitClock(ctx context.Context, pool *pgxpool.Pool) (*commitClock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	c := &commitClock{cancel: cancel, done: make(chan error, 1)}
	poll := func() error {
		var at time.Time
		var text string
		if err := conn.QueryRow(ctx, `SELECT clock_timestamp(), pg_current_snapshot()::text`).Scan(&at, &text); err != nil {
			return err
		}
		sn, err := parseSnapshot(text)
		if err != nil {
			return err
		}
		sn.at = at
		c.mu.Lock()
		c.snaps = append(c.snaps, sn)
		c.mu.Unlock()
		return nil
	}
	if err := poll(); err != nil {
		cancel()
		conn.Release()
		return nil, fmt.Errorf("commit clock: %w", err)
	}
	go func() {
		defer conn.Release()
		t := time.NewTicker(commitPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				c.done <- nil
				return
			case <-t.C:
			}
			if err := poll(); err != nil && ctx.Err() == nil {
				c.done <- fmt.Errorf("commit clock: %w", err)
				return
			}
		}
	}()
	return c, nil
}

// stopAfter waits for a snapshot taken after t (so that whatever had committed by t is
// seen as done), then stops the clock.
func (c *commitClock) stopAfter(ctx context.Context, t time.Time) error {
	for {
		c.mu.Lock()
		last := c.snaps[len(c.snaps)-1].at
		c.mu.Unlock()
		if last.After(t) {
			break
		}
		select {
		case err := <-c.done:
			return err
		case <-ctx.Done():
			c.cancel()
			return ctx.Err()
		case <-time.After(commitPoll):
		}
	}
	c.cancel()
	return <-c.done
}

// commitTime is when transaction xid32 (a row's xmin) was first seen ended. ok is false
// when it had already ended at the first snapshot (before the clock started: its time is
// unknown) or was never seen ended.
func (c *commitClock) commitTime(xid32 uint32) (at time.Time, ok bool) {
	last := c.snaps[len(c.snaps)-1]
	xid := widenXID(xid32, last.xmax)
	i := sort.Search(len(c.snaps), func(i int) bool { return c.snaps[i].done(xid) })
	if i == 0 || i == len(c.snaps) {
		return time.Time{}, false
	}
	return c.snaps[i].at, true
}

// widenXID gives a 32-bit transaction id (a row's xmin) the epoch of ref, a 64-bit id
// taken later: the most recent 64-bit id whose low 32 bits are xid32.
func widenXID(xid32 uint32, ref uint64) uint64 {
	x := ref&^0xffffffff | uint64(xid32)
	if x > ref && x >= 1<<32 {
		x -= 1 << 32
	}
	return x
}

// period is the mean time between the clock's snapshots.
func (c *commitClock) period() time.Duration {
	if len(c.snaps) < 2 {
		return 0
	}
	return c.snaps[len(c.snaps)-1].at.Sub(c.snaps[0].at) / time.Duration(len(c.snaps)-1)
}
