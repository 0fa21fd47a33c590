package main

import (
	"fmt"
	"os"
	"sync/atomic"

	"github.com/metergate/metergate/internal/testenv"
)

// Failpoints of the test build of the meter (go test -c, run as the command with
// testenv.ReexecEnv); the command itself has none.
//
// FailpointEnv "<point>:<n>" (internal/meter's BeforeWrite or AfterWrite, e.g. after-write:2)
// stops the meter the n-th time it reaches point: it prints "failpoint <point>:<n> reached"
// and holds there until the process is killed, so that a test can kill it with SIGKILL at
// that very point. With FailpointArmEnv set to a path, the count starts once a file exists
// there: the test arms the failpoint when it wants the kill, and the meter runs as usual
// until then.
const (
	FailpointEnv    = testenv.FailpointEnv
	FailpointArmEnv = "METERGATE_FAILPOINT_ARM"
)

func init() {
	point, n, set := testenv.Failpoint()
	if !set {
		return
	}
	arm := os.Getenv(FailpointArmEnv)
	var hits atomic.Int64
	failpoint = func(p string) error {
		if p != point {
			return nil
		}
		if arm != "" {
			if _, err := os.Stat(arm); err != nil {
				return nil // not armed yet
			}
		}
		if hits.Add(1) == int64(n) {
			fmt.Fprintf(os.Stderr, "failpoint %s:%d reached: holding until killed\n", point, n)
			select {} // the caller (a writer or the committer of the meter) never goes on
		}
		return nil
	}
}
