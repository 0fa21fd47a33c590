// Package sdk_test runs the SDKs' own test suites (sdk/python, sdk/typescript) against a
// real admit on the stack: the harness starts admit, makes an org for each suite with the
// admin API, and hands the suite its address, tokens and account in the environment.
package sdk_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

var bin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithBinaries(m, &bin, "../cmd/admit"))
}

const (
	serviceToken = "test-service-token-0123456789"
	adminToken   = "test-admin-token-0123456789"
)

// admit starts admit on the stack with an org of its own (rate and quota ample for a
// suite) and returns its URL and the org.
func admit(t *testing.T) (url, org string) {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	_, schema := testenv.EmptySchema(t)
	name := testenv.Name(t)
	addr := testenv.FreeAddr(t)
	env := append(testenv.AdmitTokens(),
		"DATABASE_URL="+testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"REDIS_URL="+testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS="+strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC="+testenv.Topic(t, 1),
		"LOG_LEVEL=warn", "ADMIT_ADDR="+addr, "ADMIT_NODE=sdk", "ADMIT_KEY_PREFIX=t:"+name+":mg")
	testenv.Start(t, filepath.Join(bin, "admit"), env, "-migrate")
	url = "http://" + addr
	_, err := testenv.WaitHTTP(ctx, url+"/readyz", 200)
	require.NoError(t, err, "admit ready")
	org = strings.ReplaceAll(name, "_", "-")
	body, _ := json.Marshal(map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 1000, "burst": 1000}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/admin/accounts", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	r, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	require.Equal(t, http.StatusCreated, r.StatusCode)
	for { // the account reaches admit's policies (LISTEN/NOTIFY, < 1 s)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/usage/"+org, nil)
		req.Header.Set("Authorization", "Bearer "+serviceToken)
		r, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		r.Body.Close()
		if r.StatusCode == http.StatusOK {
			return url, org
		}
		select {
		case <-ctx.Done():
			t.Fatal("the org never reached admit")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestPython runs sdk/python's pytest suite against a real admit, in the virtualenv the
// stack made (METERGATE_PYTHON, deploy/local/stack.sh).
func TestPython(t *testing.T) {
	t.Parallel()
	python := os.Getenv("METERGATE_PYTHON")
	if python == "" {
		testenv.SkipOrFail(t, "METERGATE_PYTHON is not set: `make up` makes the Python SDK's virtualenv and names it in .run/env")
	}
	url, org := admit(t)
	cmd := exec.Command(python, "-m", "pytest", "-q", "-p", "no:cacheprovider")
	cmd.Dir = "python"
	cmd.Env = append(os.Environ(), "PYTHONPATH=src", "PYTHONDONTWRITEBYTECODE=1", "METERGATE_URL="+url, "METERGATE_SERVICE_TOKEN="+serviceToken,
		"METERGATE_ADMIN_TOKEN="+adminToken, "METERGATE_ACCOUNT="+org)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "pytest:\n%s", out)
	require.Contains(t, string(out), "passed")
	require.NotContains(t, string(out), "skipped", "a real admit is given: nothing is skipped")
}
