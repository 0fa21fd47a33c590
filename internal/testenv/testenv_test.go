package testenv_test

import (
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("TESTENV_PROBE") != "1" {
		// TestProbeServices is a helper that runs only in the child of TestMissingServices.
		_ = flag.Set("test.skip", "^TestProbeServices$")
	}
	os.Exit(testenv.Run(m))
}

func TestNamesAreUniqueAndSafe(t *testing.T) {
	a, b := testenv.Name(t), testenv.Name(t)
	require.NotEqual(t, a, b)
	require.Regexp(t, regexp.MustCompile(`^[a-z0-9_]+$`), a)
	require.True(t, strings.HasPrefix(testenv.Prefix(t), "t:testnamesareuniqueandsafe_"))
}

// TestProbeServices runs only in the child process of TestMissingServices.
func TestProbeServices(t *testing.T) { testenv.Redis(t) }

// Without services a test skips with a message naming `make up`, except under
// METERGATE_REQUIRE_SERVICES=1, where it fails.
func TestMissingServices(t *testing.T) {
	run := func(require string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProbeServices$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_PROBE=1", "REDIS_URL=", "METERGATE_NO_DOCKER=1",
			"METERGATE_REQUIRE_SERVICES="+require)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("")
	require.NoError(t, err, out)
	require.Contains(t, out, "--- SKIP: TestProbeServices")
	require.Contains(t, out, "make up")

	out, err = run("1")
	require.Error(t, err, out)
	require.Contains(t, out, "--- FAIL: TestProbeServices")
	require.Contains(t, out, "METERGATE_REQUIRE_SERVICES=1")
}
