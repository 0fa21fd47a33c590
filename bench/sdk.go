package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sdkGoalMS is issue 34's goal: an SDK's client adds at most 0.1 ms to an admit's p50.
const sdkGoalMS = 0.1

// Each run of an SDK's script times sdkPairs pairs of calls of each client, after
// sdkWarmup untimed pairs; a run of each SDK is a round (Config.Rounds of them).
const (
	sdkPairs  = 500
	sdkWarmup = 100
)

// sdkTree is benchTree's shape under an org of its own: the SDKs admit its agent by
// account, with the service token, as an app's backend does.
var sdkTree = []map[string]any{
	{"id": "sdk-org", "kind": "org", "plan": "enterprise", "limits": highLimits(true)},
	{"id": "sdk-team", "kind": "team", "parent": "sdk-org", "limits": highLimits(false)},
	{"id": "sdk-user", "kind": "user", "parent": "sdk-team", "limits": highLimits(false)},
	{"id": "sdk-agent", "kind": "agent", "parent": "sdk-user", "limits": highLimits(false)},
}

// sdkScript is one SDK's benchmark: a program that prints one JSON line (sdkOutput).
type sdkScript struct {
	SDK  string
	Dir  string // its working directory
	Env  []string
	Argv []string
}

// sdkOutput is what a script prints: for each of its measures, the latency of every timed
// call of the subject and of the baseline, in ms, taken in pairs in a random order.
type sdkOutput struct {
	SDK      string       `json:"sdk"`
	Version  string       `json:"version"` // the runtime's
	Measures []sdkMeasure `json:"measures"`
}

// The kinds of measure: an SDK's client against a raw call of the same admit, or an app's
// route behind the SDK's middleware against the same app's route without it.
const (
	kindClient     = "client"
	kindMiddleware = "middleware"
)

type sdkMeasure struct {
	Name     string    `json:"name"`
	Kind     string    `json:"kind"` // kindClient when empty
	Subject  string    `json:"subject"`
	Baseline string    `json:"baseline"`
	SDKMS    []float64 `json:"sdk_ms"`
	RawMS    []float64 `json:"raw_ms"`
	// AdmitMS, of a middleware's measure, are a raw admit of the same kind timed in the
	// same rounds: what the middleware adds beyond it is its own.
	AdmitMS []float64 `json:"admit_ms,omitempty"`
}

// sdkOverhead is a measure's figures: the subject's and the baseline's p50 and p95, the
// p50 the subject adds and the ratio of the p50s; for a middleware, the raw admit's p50
// and what the middleware adds beyond it.
type sdkOverhead struct {
	N              int     `json:"n"`
	P50            float64 `json:"p50_ms"`
	P95            float64 `json:"p95_ms"`
	RawP50         float64 `json:"raw_p50_ms"`
	RawP95         float64 `json:"raw_p95_ms"`
	AddedP50       float64 `json:"added_p50_ms"`
	Ratio          float64 `json:"ratio"`
	AdmitP50       float64 `json:"admit_p50_ms,omitempty"`
	BeyondAdmitP50 float64 `json:"beyond_admit_p50_ms,omitempty"`
}

// overhead is m's figures; m must hold as many samples of each side, at least one, and a
// middleware's as many of the raw admit.
func (m sdkMeasure) overhead() (sdkOverhead, error) {
	if len(m.SDKMS) == 0 || len(m.SDKMS) != len(m.RawMS) {
		return sdkOverhead{}, fmt.Errorf("%s: %d samples of the subject, %d of the baseline: want as many, at least one", m.Name, len(m.SDKMS), len(m.RawMS))
	}
	sdk, raw := slices.Sorted(slices.Values(m.SDKMS)), slices.Sorted(slices.Values(m.RawMS))
	o := sdkOverhead{N: len(sdk), P50: nearestRank(sdk, 50), P95: nearestRank(sdk, 95), RawP50: nearestRank(raw, 50), RawP95: nearestRank(raw, 95)}
	o.AddedP50 = o.P50 - o.RawP50
	if o.RawP50 > 0 {
		o.Ratio = o.P50 / o.RawP50
	}
	switch m.Kind {
	case "", kindClient:
	case kindMiddleware:
		if len(m.AdmitMS) != len(m.SDKMS) {
			return o, fmt.Errorf("%s: %d samples of the raw admit, %d of the subject: want as many", m.Name, len(m.AdmitMS), len(m.SDKMS))
		}
		o.AdmitP50 = nearestRank(slices.Sorted(slices.Values(m.AdmitMS)), 50)
		o.BeyondAdmitP50 = o.AddedP50 - o.AdmitP50
	default:
		return o, fmt.Errorf("%s: unknown kind %q", m.Name, m.Kind)
	}
	return o, nil
}

// parseSDKOutput reads a script's output: its last non-empty line.
func parseSDKOutput(stdout []byte) (sdkOutput, error) {
	var out sdkOutput
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
		return out, fmt.Errorf("output %q: %w", lines[len(lines)-1], err)
	}
	if len(out.Measures) == 0 {
		return out, errors.New("output without measures")
	}
	return out, nil
}

// run runs the script and reads its output.
func (sc sdkScript) run(ctx context.Context) (sdkOutput, error) {
	cmd := exec.CommandContext(ctx, sc.Argv[0], sc.Argv[1:]...)
	cmd.Dir, cmd.Env = sc.Dir, append(os.Environ(), sc.Env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return sdkOutput{}, fmt.Errorf("%s: %w: %s", strings.Join(sc.Argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return parseSDKOutput(stdout.Bytes())
}

// sdkBench is issue 34's proof of the SDKs' cost: each SDK's client against a raw HTTP
// call of the same admit (the same body, a fresh idempotency key each), interleaved in
// one process, in Config.Rounds rounds of each SDK in turn.
func (s *stack) sdkBench(ctx context.Context, res *Results) error {
	key, err := s.createTree(ctx, sdkTree)
	if err != nil {
		return fmt.Errorf("accounts: %w", err)
	}
	scripts, cleanup, err := s.sdkScripts(ctx, key)
	if err != nil {
		return err
	}
	defer cleanup()
	type series struct {
		SDK     string        `json:"sdk"`
		Runtime string        `json:"runtime"`
		Rounds  []sdkOverhead `json:"rounds"`
	}
	raw := map[string]*series{}
	var order []string // the measures' names, as first seen
	info := map[string]sdkMeasure{}
	for r := range s.cfg.Rounds {
		for i := range scripts {
			sc := scripts[(r+i)%len(scripts)] // who goes first turns each round
			out, err := sc.run(ctx)
			if err != nil {
				return fmt.Errorf("%s SDK: %w", sc.SDK, err)
			}
			for _, m := range out.Measures {
				o, err := m.overhead()
				if err != nil {
					return fmt.Errorf("%s SDK: %w", sc.SDK, err)
				}
				if _, seen := info[m.Name]; !seen {
					order = append(order, m.Name)
					raw[m.Name] = &series{SDK: out.SDK, Runtime: out.Version}
				}
				info[m.Name] = sdkMeasure{Name: m.Name, Kind: m.Kind, Subject: m.Subject, Baseline: m.Baseline}
				raw[m.Name].Rounds = append(raw[m.Name].Rounds, o)
				admit := ""
				if m.Kind == kindMiddleware {
					admit = fmt.Sprintf(", raw admit %.3f", o.AdmitP50)
				}
				fmt.Fprintf(s.out, "  round %d %-22s p50 %.3f ms (baseline %.3f%s), p95 %.3f (%.3f): %+.3f ms, %.3f×, n %d\n",
					r+1, m.Name, o.P50, o.RawP50, admit, o.P95, o.RawP95, o.AddedP50, o.Ratio, o.N)
			}
		}
	}
	res.Raw["sdk"] = raw
	for _, name := range order {
		m, all := info[name], raw[name].Rounds
		pick := func(f func(sdkOverhead) float64) spread {
			var v []float64
			for _, o := range all {
				v = append(v, f(o))
			}
			return spreadOf(v)
		}
		med := func(f func(sdkOverhead) float64) float64 { return pick(f).Median }
		p50, raw50 := med(func(o sdkOverhead) float64 { return o.P50 }), med(func(o sdkOverhead) float64 { return o.RawP50 })
		p95, raw95 := med(func(o sdkOverhead) float64 { return o.P95 }), med(func(o sdkOverhead) float64 { return o.RawP95 })
		added := pick(func(o sdkOverhead) float64 { return o.AddedP50 })
		if m.Kind == kindMiddleware {
			against := fmt.Sprintf("%s against %s, interleaved with a raw admit of the same kind (POST /v1/admit, the caller's API key, the same units) from the client's process, %d rounds after %d warm-ups, each round's order random; p50 %.3f ms (without %.3f), p95 %.3f (without %.3f), the raw admit's p50 %.3f (medians)",
				m.Subject, m.Baseline, sdkPairs, sdkWarmup, p50, raw50, p95, raw95, med(func(o sdkOverhead) float64 { return o.AdmitP50 }))
			res.addSpread("sdk_middleware_added_p50_ms_"+name, added, "ms", "", "each round's p50 − the same round's p50 without the middleware: "+against)
			res.addSpread("sdk_middleware_beyond_admit_p50_ms_"+name, pick(func(o sdkOverhead) float64 { return o.BeyondAdmitP50 }), "ms", "",
				"sdk_middleware_added_p50_ms_"+name+" − the same round's raw admit p50: the middleware's own work (its client, resolvers, the outcome in the background)")
			continue
		}
		against := fmt.Sprintf("%s against %s, the same admit (POST /v1/admit, the same body, a fresh idempotency key each, 4 levels × requests+tokens) in one process, %d pairs per round after %d warm-ups, each pair's order random; p50 %.3f ms (raw %.3f), p95 %.3f (raw %.3f) (medians)",
			m.Subject, m.Baseline, sdkPairs, sdkWarmup, p50, raw50, p95, raw95)
		res.addSpread("sdk_added_p50_ms_"+name, added, "ms",
			"≤ "+strconv.FormatFloat(sdkGoalMS, 'f', -1, 64), "each round's p50 − the same round's raw p50: "+against)
		res.addSpread("sdk_p50_vs_raw_"+name, pick(func(o sdkOverhead) float64 { return o.Ratio }), "×", "",
			"each round's p50 ÷ the same round's raw p50 (sdk_added_p50_ms_"+name+")")
	}
	return nil
}

// sdkScripts are the SDKs' scripts against the bench's admit: the clients' admit
// sdkTree's agent by account, the middlewares' callers send its API key. The TypeScript
// SDK's run from a build of their own (typescriptBuild); cleanup removes it.
func (s *stack) sdkScripts(ctx context.Context, apiKey string) (scripts []sdkScript, cleanup func(), err error) {
	py := os.Getenv("METERGATE_PYTHON")
	if py == "" {
		return nil, nil, errors.New("METERGATE_PYTHON is not set: `make up` makes the Python SDK's virtualenv and names it in .run/env")
	}
	ts, err := typescriptBuild(ctx, "sdk/typescript")
	if err != nil {
		return nil, nil, err
	}
	common := []string{"--url", s.admit.URL(), "--token", serviceToken, "--pairs", strconv.Itoa(sdkPairs), "--warmup", strconv.Itoa(sdkWarmup)}
	client := slices.Concat(common, []string{"--account", sdkTree[len(sdkTree)-1]["id"].(string)})
	middleware := slices.Concat(common, []string{"--api-key", apiKey})
	pyEnv := []string{"PYTHONPATH=src", "PYTHONDONTWRITEBYTECODE=1"}
	return []sdkScript{
		{SDK: "python", Dir: "sdk/python", Env: pyEnv, Argv: slices.Concat([]string{py, "bench/overhead.py"}, client)},
		{SDK: "python", Dir: "sdk/python", Env: pyEnv, Argv: slices.Concat([]string{py, "bench/middleware.py"}, middleware)},
		{SDK: "typescript", Dir: ts, Argv: slices.Concat([]string{"node", "bench/overhead.mjs"}, client)},
		{SDK: "typescript", Dir: ts, Argv: slices.Concat([]string{"node", "bench/middleware.mjs"}, middleware)},
	}, func() { _ = os.RemoveAll(ts) }, nil
}

// typescriptBuild copies the package in dir (its src, bench, scripts, package.json and
// tsconfig files) into a temporary directory beside a link to its node_modules, runs
// `npm run build` there, and returns the directory: the run measures the src of the
// moment, and nobody's build (whose first step empties dist) pulls dist from under it.
func typescriptBuild(ctx context.Context, dir string) (string, error) {
	modules, err := filepath.Abs(filepath.Join(dir, "node_modules"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(modules); err != nil {
		return "", fmt.Errorf("%s/node_modules is missing: `make up` installs it (npm ci)", dir)
	}
	tmp, err := os.MkdirTemp("", "metergate-bench-ts-")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("typescript SDK: %w", err)
	}
	for _, d := range []string{"src", "bench", "scripts"} {
		if err := os.CopyFS(filepath.Join(tmp, d), os.DirFS(filepath.Join(dir, d))); err != nil {
			return fail(err)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "tsconfig*.json"))
	if err != nil {
		return fail(err)
	}
	for _, f := range append(files, filepath.Join(dir, "package.json")) {
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(tmp, filepath.Base(f)), b, 0o644)
		}
		if err != nil {
			return fail(err)
		}
	}
	if err := os.Symlink(modules, filepath.Join(tmp, "node_modules")); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "run", "build")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("npm run build: %w: %s", err, bytes.TrimSpace(out)))
	}
	return tmp, nil
}
