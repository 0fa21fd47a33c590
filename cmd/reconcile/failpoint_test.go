package main

import (
	"os"
	"syscall"

	"github.com/metergate/metergate/internal/testenv"
)

// FailpointEnv names the failpoint of the test build of reconcile (go test -c, run as the
// command with testenv.ReexecEnv); the command itself has none. "<point>:<n>" (internal/reconcile's
// AfterInsert, AfterRedis or AfterMark, e.g. after-redis:3) makes the process kill itself
// with SIGKILL the n-th time the run reaches point, as kill -9 would.
const FailpointEnv = testenv.FailpointEnv

func init() {
	point, n, set := testenv.Failpoint()
	if !set {
		return
	}
	hits := 0
	failpoint = func(p string) error {
		if p != point {
			return nil
		}
		if hits++; hits == n {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
		return nil
	}
}
