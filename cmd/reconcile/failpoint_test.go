package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// FailpointEnv names the failpoint of the test build of reconcile (go test -c, run as the
// command with testenv.ReexecEnv); the command itself has none. "<point>:<n>" (pkg/reconcile's
// AfterInsert, AfterRedis or AfterMark, e.g. after-redis:3) makes the process kill itself
// with SIGKILL the n-th time the run reaches point, as kill -9 would.
const FailpointEnv = "METERGATE_FAILPOINT"

func init() {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return
	}
	point, nth, ok := strings.Cut(v, ":")
	n, err := strconv.Atoi(nth)
	if !ok || err != nil || n < 1 {
		fmt.Fprintf(os.Stderr, "%s=%q: want <point>:<n>\n", FailpointEnv, v)
		os.Exit(2)
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
