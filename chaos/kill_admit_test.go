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

	requests, kills := pick(2_000, 20_000), pick(1, 5)
	admit := s.admits[0]
	killed := 0
	var injectErr error
	res := s.load(loadSpec{Requests: requests, Workers: 32, Keys: keys, Deadline: 5 * time.Minute,
		Progress: func(done int) {
			// Runs in a caller's goroutine, under the load's progress lock: no require here.
			// Evenly through the load: kill, then start again at once (callers keep retrying).
			if injectErr == nil && killed < kills && done == (killed+1)*requests/(kills+1) {
				killed++
				if injectErr = admit.kill(); injectErr == nil {
					injectErr = admit.start()
				}
			}
		}})
	require.NoError(t, injectErr, "inject the kills")
	require.Equal(t, kills, killed, "every kill happened during the load")
	b := s.waitBooks(2*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("%d kills; final answers %v", killed, res.Status)
	require.Equal(t, requests, res.Status[200], "every request is admitted in the end")
	b.requireExact(t, requests)
}
