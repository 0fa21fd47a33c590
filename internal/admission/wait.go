package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/metergate/metergate/lua"
)

// Waiting for capacity (Request.MaxWait; docs/admission.md "Waiting for capacity").
//
// The queues live in Redis, one per limit (lua/admit.lua "Queues"): the script refuses a
// request that stands behind a live waiter, and a refused request that may wait takes a
// place in the refusing limit's queue. The admit node holding a waiter asks again only
// when it may be its turn:
//   - the head of a queue, at the retry time its last refusal gave;
//   - the node's first waiter of a queue, when the script tells the queue channel that a
//     waiter left that queue (admitted, out of time, hung up: the next may go), and once
//     per pollEvery in case a notification was lost (a reconnection, a node that died
//     holding the head).
//
// So Redis sees script calls per queue and node, never per waiting request.

// pollEvery is how often a node asks again for its first waiter of each queue without
// being told to.
const pollEvery = time.Second

// waiting is a request's standing while it waits.
type waiting struct {
	ticket   string
	deadline time.Time // this node's clock
	priority int
	seq      int64  // its order within its priority, from its member
	member   string // its place: "" before it has one
	queue    string
	wake     chan struct{} // buffered: a wake-up never blocks
}

// left is the wait left, ms, at least 1.
func (w *waiting) left() int64 { return max(1, time.Until(w.deadline).Milliseconds()) }

// place is where a refused request that may wait stands (the script's "queued" reply).
type place struct {
	queue, member string
	head          bool
}

func parsePlace(s string) (place, error) {
	f := strings.Fields(s)
	if len(f) != 3 || (f[2] != "0" && f[2] != "1") {
		return place{}, fmt.Errorf("admission script: bad queue place %q", s)
	}
	return place{queue: f[0], member: f[1], head: f[2] == "1"}, nil
}

// waiters are the node's waiting requests by queue.
type waiters struct {
	mu      sync.Mutex
	byQueue map[string]map[*waiting]struct{}
	once    sync.Once
	stop    chan struct{}
}

func (ws *waiters) add(w *waiting) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.byQueue == nil {
		ws.byQueue = make(map[string]map[*waiting]struct{})
	}
	m := ws.byQueue[w.queue]
	if m == nil {
		m = make(map[*waiting]struct{})
		ws.byQueue[w.queue] = m
	}
	m[w] = struct{}{}
}

func (ws *waiters) remove(w *waiting) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if m := ws.byQueue[w.queue]; m != nil {
		delete(m, w)
		if len(m) == 0 {
			delete(ws.byQueue, w.queue)
		}
	}
}

// wakeFirst wakes the node's first waiter of queue: the highest priority, then the
// earliest.
func (ws *waiters) wakeFirst(queue string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var first *waiting
	for w := range ws.byQueue[queue] {
		if first == nil || w.priority > first.priority || w.priority == first.priority && w.seq < first.seq {
			first = w
		}
	}
	if first != nil {
		select {
		case first.wake <- struct{}{}:
		default:
		}
	}
}

func (ws *waiters) queues() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	out := make([]string, 0, len(ws.byQueue))
	for q := range ws.byQueue {
		out = append(out, q)
	}
	return out
}

// listen starts, once per Admitter, the subscription to the queue channel and the poll.
func (a *Admitter) listen() {
	a.waiters.once.Do(func() {
		a.waiters.stop = make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		sub := a.rdb.Subscribe(ctx, a.keys.QueueChannel())
		go func() {
			<-a.waiters.stop
			cancel()
			_ = sub.Close()
		}()
		go func() {
			for msg := range sub.Channel() {
				a.waiters.wakeFirst(msg.Payload)
			}
		}()
		go func() {
			t := time.NewTicker(pollEvery)
			defer t.Stop()
			for {
				select {
				case <-a.waiters.stop:
					return
				case <-t.C:
					for _, q := range a.waiters.queues() {
						a.waiters.wakeFirst(q)
					}
				}
			}
		}()
	})
}

// Close stops what waiting requests started (the queue channel's subscription).
func (a *Admitter) Close() {
	a.waiters.once.Do(func() {}) // nothing started: nothing will
	if a.waiters.stop != nil {
		select {
		case <-a.waiters.stop:
		default:
			close(a.waiters.stop)
		}
	}
}

// decideWaiting takes r's decision, waiting up to r.MaxWait for capacity: it returns the
// admission, or the refusal the last attempt got when the wait runs out, or ctx's error
// when the caller goes (the request leaves its queue either way).
func (a *Admitter) decideWaiting(ctx context.Context, r Request) (Decision, error) {
	a.listen()
	a.metrics.waiting.Inc()
	defer a.metrics.waiting.Dec()
	w := &waiting{ticket: r.EventID, deadline: time.Now().Add(r.MaxWait), priority: r.Policy.Priority,
		wake: make(chan struct{}, 1)}
	out := time.NewTimer(r.MaxWait)
	defer out.Stop()
	logged := false
	for {
		c := a.submit(r, w, logged)
		var res result
		select {
		case res = <-c.done:
		case <-ctx.Done():
			// The call may still take a place: leave it once the reply is in.
			go func() {
				if res := <-c.done; res.err == nil && res.d.place.queue != "" {
					a.leave(res.d.place)
				}
			}()
			return Decision{}, fmt.Errorf("decide: %w", ctx.Err())
		}
		if errors.Is(res.err, errCheckLog) && !logged {
			d, decided, err := a.fromLog(ctx, r)
			if decided {
				return d, err
			}
			logged = true
			continue
		}
		if res.err != nil || res.d.place.queue == "" {
			return res.d, res.err // decided: the script took it out of any queue
		}
		p := res.d.place
		w.member, w.queue = p.member, p.queue
		if seq, _, ok := strings.Cut(p.member, ":"); ok {
			w.seq, _ = strconv.ParseInt(seq, 10, 64)
		}
		turn := time.NewTimer(res.d.RetryAfter)
		if !p.head {
			turn.Stop() // not its turn before it is told
		}
		a.waiters.add(w)
		var err error
		select {
		case <-w.wake:
		case <-turn.C:
		case <-out.C:
			err = errOutOfTime
		case <-ctx.Done():
			err = fmt.Errorf("decide: %w", ctx.Err())
		}
		turn.Stop()
		a.waiters.remove(w)
		switch {
		case errors.Is(err, errOutOfTime):
			a.leave(p)
			return res.d, nil // the refusal it would have had
		case err != nil:
			a.leave(p)
			return Decision{}, err
		}
	}
}

var errOutOfTime = errors.New("out of time")

// leave takes a place out of its queue, telling the next waiter. It runs when the caller
// is gone or out of time, so it has its own deadline.
func (a *Admitter) leave(p place) {
	ctx, cancel := context.WithTimeout(context.Background(), a.opts.CallTimeout)
	defer cancel()
	err := lua.QueueLeave.Run(ctx, a.rdb, []string{p.queue}, p.member, a.keys.QueueChannel()).Err()
	if err != nil && !errors.Is(err, context.Canceled) {
		// The place stays until its deadline, when the next script to meet it drops it.
		a.metrics.leaveFailed()
	}
}
