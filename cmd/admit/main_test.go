package main

import (
	"os"
	"testing"

	"github.com/metergate/metergate/pkg/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.MainOrTests(m, main)) }

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	testenv.CheckConfigErrors(t, "ADMIT_ADDR")
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	testenv.CheckServiceLifecycle(t, "ADMIT_ADDR", "redis", "postgres")
}
