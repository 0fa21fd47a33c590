package chaos_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Scenario 1: admit (relay inside) killed with SIGKILL five times (one in the short form)
// during a load; each time it comes back on the same address. Callers retry a refused
// connection with the same idempotency key. Every event id a caller got a 200 for is in
// PostgreSQL exactly once, and holds what its caller sent (the keys belong to an org, a
// team, a user and an agent, and each request has units and a tool of its own): the
// outbox entry was written in the same script as the decision, and the restarted relay
// sends what the killed one had not acknowledged.
func TestKillAdmit(t *testing.T) {
	t.Parallel()
	sc := begin(t, "1 kill -9 admit")
	s := newStack(t, options{})
	keys := []string{s.account("chaos-org", "org", "", "enterprise", map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}})}
	parent := "chaos-org"
	for _, kind := range []string{"team", "user", "agent"} {
		keys = append(keys, s.account("chaos-"+kind, kind, parent, "", map[string]any{}))
		parent = "chaos-" + kind
	}

	requests := pick(2_000, 20_000)
	k := &killer{node: s.admits[0], kills: pick(1, 5), requests: requests}
	res := s.load(loadSpec{Requests: requests, Workers: 32, Keys: keys, Deadline: 5 * time.Minute, Progress: k.progress})
	k.require(t)
	b := s.waitBooks(2*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("%d kills; final answers %v", k.killed, res.Status)
	require.Equal(t, requests, res.Status[200], "every request is admitted in the end")
	b.requireExact(t, requests)
}

// killer kills a node with SIGKILL kills times, evenly through a load of requests, and
// starts it again at once each time (callers keep retrying): its progress is the load's
// Progress.
type killer struct {
	node            *node
	kills, requests int
	killed          int
	err             error
}

// progress runs in a caller's goroutine, under the load's progress lock: no require here.
func (k *killer) progress(done int) {
	if k.err == nil && k.killed < k.kills && done == (k.killed+1)*k.requests/(k.kills+1) {
		k.killed++
		if k.err = k.node.kill(); k.err == nil {
			k.err = k.node.start()
		}
	}
}

// require fails unless every kill happened during the load.
func (k *killer) require(t *testing.T) {
	t.Helper()
	require.NoError(t, k.err, "inject the kills")
	require.Equal(t, k.kills, k.killed, "every kill happened during the load")
}
