// Package sdk_test runs the SDKs' own test suites (sdk/python, sdk/typescript) against a
// real admit on the stack: the harness starts admit, makes an org for each suite with the
// admin API, and hands the suite its address, tokens and account in the environment.
package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
)

var bin string

func TestMain(m *testing.M) {
	os.Exit(testenv.RunWithBinaries(m, &bin, "../cmd/admit", "../cmd/meter"))
}

const (
	serviceToken = "test-service-token-0123456789"
	adminToken   = "test-admin-token-0123456789"
)

// services is an admit (and, for examples, a meter) on the stack with an org of its own
// (rate and quota ample for a suite).
type services struct {
	url, org string
	db       *pgxpool.Pool // the services' schema
}

// start starts admit, and a meter on the same schema and topic when metered, and makes the org.
func start(t *testing.T, metered bool) services {
	t.Helper()
	ctx := testenv.Context(t, 2*time.Minute)
	db, schema := testenv.EmptySchema(t)
	name := testenv.Name(t)
	common := []string{"DATABASE_URL=" + testenv.WithSearchPath(t, testenv.DatabaseURL(t), schema),
		"REDIS_URL=" + testenv.RedisURL(t), "REDIS_CLUSTER_ADDRS=", "REDIS_SENTINEL_ADDRS=", "REDIS_SENTINEL_MASTER=",
		"KAFKA_BROKERS=" + strings.Join(testenv.KafkaBrokers(t), ","), "KAFKA_TOPIC=" + testenv.Topic(t, 1),
		"LOG_LEVEL=warn", "METER_GROUP=g-" + name}
	if metered {
		addr := testenv.FreeAddr(t)
		testenv.Start(t, filepath.Join(bin, "meter"), append(common, "METER_ADDR="+addr), "-migrate")
		_, err := testenv.WaitHTTP(ctx, "http://"+addr+"/readyz", 200)
		require.NoError(t, err, "meter ready")
	}
	addr := testenv.FreeAddr(t)
	env := append(append(testenv.AdmitTokens(), common...), "ADMIT_ADDR="+addr, "ADMIT_NODE=sdk", "ADMIT_KEY_PREFIX=t:"+name+":mg")
	testenv.Start(t, filepath.Join(bin, "admit"), env, "-migrate")
	s := services{url: "http://" + addr, org: strings.ReplaceAll(name, "_", "-"), db: db}
	_, err := testenv.WaitHTTP(ctx, s.url+"/readyz", 200)
	require.NoError(t, err, "admit ready")
	status, reply := call(t, ctx, http.MethodPost, s.url+"/v1/admin/accounts", adminToken, map[string]any{"id": s.org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 1000, "burst": 1000}}})
	require.Equal(t, http.StatusCreated, status, "%s", reply)
	for { // the account reaches admit's policies (LISTEN/NOTIFY, < 1 s)
		if status, _ := call(t, ctx, http.MethodGet, s.url+"/v1/usage/"+s.org, serviceToken, nil); status == http.StatusOK {
			return s
		}
		select {
		case <-ctx.Done():
			t.Fatal("the org never reached admit")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// call sends body (JSON; nil for none) with token and returns the status and the reply.
func call(t *testing.T, ctx context.Context, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	reply, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, reply
}

// env is the environment of an SDK's suite against these services: admit's address, the
// tokens and the org.
func (s services) env() []string {
	return append(os.Environ(), "METERGATE_URL="+s.url, "METERGATE_SERVICE_TOKEN="+serviceToken,
		"METERGATE_ADMIN_TOKEN="+adminToken, "METERGATE_ACCOUNT="+s.org)
}

// python is the interpreter of the stack's virtualenv for the Python SDK
// (METERGATE_PYTHON, deploy/local/stack.sh).
func python(t *testing.T) string {
	p := os.Getenv("METERGATE_PYTHON")
	if p == "" {
		testenv.SkipOrFail(t, "METERGATE_PYTHON is not set: `make up` makes the Python SDK's virtualenv and names it in .run/env")
	}
	return p
}

// npm checks that the stack installed dir's packages (deploy/local/stack.sh, `npm ci`).
func npm(t *testing.T, dir string) {
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		testenv.SkipOrFail(t, dir+"/node_modules is missing: `make up` installs it")
	}
}

// run runs a suite's command in dir and fails on an error or on anything skipped: a real
// admit is given, so every test runs.
func run(t *testing.T, dir string, env []string, skipped string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	if skipped != "" {
		require.NotRegexp(t, skipped, string(out), "a real admit is given: nothing is skipped\n%s", out)
	}
	return string(out)
}

// TestPython runs sdk/python's pytest suite against a real admit.
func TestPython(t *testing.T) {
	t.Parallel()
	py := python(t)
	env := append(start(t, false).env(), "PYTHONPATH=src", "PYTHONDONTWRITEBYTECODE=1")
	out := run(t, "python", env, `\d+ skipped`, py, "-m", "pytest", "-q", "-p", "no:cacheprovider")
	require.Contains(t, out, "passed")
	run(t, "python", env, "", py, "-m", "mypy")
}

// TestTypeScript runs sdk/typescript's suite (node --test, after tsc --strict) against a
// real admit, and checks its types are what the document admit serves makes.
func TestTypeScript(t *testing.T) {
	t.Parallel()
	npm(t, "typescript")
	s := start(t, false)
	out := run(t, "typescript", s.env(), `(?m)^# skipped [1-9]`, "npm", "test")
	require.Regexp(t, `(?m)^# pass [1-9]`, out)
	require.Regexp(t, `(?m)^# fail 0$`, out)
	run(t, "typescript", s.env(), "", "npm", "run", "--silent", "generate:check", "--", s.url+"/openapi.yaml")
}

// TestPackages builds what each SDK publishes, a wheel and an npm tarball, and uses it as
// an installer would: the wheel's modules imported from the wheel alone, the tarball
// installed into a fresh project and loaded by require and import (scripts/pack-check.mjs).
func TestPackages(t *testing.T) {
	t.Parallel()
	t.Run("wheel", func(t *testing.T) {
		t.Parallel()
		py, dir := python(t), t.TempDir()
		run(t, "python", os.Environ(), "", py, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check", "-w", dir, ".")
		wheels, err := filepath.Glob(filepath.Join(dir, "metergate-*-py3-none-any.whl"))
		require.NoError(t, err)
		require.Len(t, wheels, 1)
		out := run(t, dir, append(os.Environ(), "PYTHONPATH="+wheels[0]), "", py, "-c",
			"import metergate, metergate.asgi, metergate.llm, metergate.models, metergate.webhooks, importlib.resources as r; "+
				"print(metergate.__file__); assert r.files('metergate').joinpath('py.typed').is_file()")
		require.Contains(t, out, wheels[0]+"/metergate/__init__.py", "imported from the wheel")
	})
	t.Run("npm", func(t *testing.T) {
		t.Parallel()
		npm(t, "typescript")
		run(t, "typescript", os.Environ(), "", "npm", "run", "--silent", "pack:check")
	})
}
