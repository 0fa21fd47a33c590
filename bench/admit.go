package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/bench/internal/load"
	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/admission"
	"github.com/metergate/metergate/pkg/policy"
)

// The tree of the throughput runs: org → team → user → agent, each level with a requests
// and a tokens bucket, a monthly requests quota at the org, limits high enough that every
// decision is allowed (what is measured is the work of a decision, not refusals).
var benchTree = []map[string]any{
	{"id": "bench-org", "kind": "org", "plan": "enterprise", "limits": highLimits(true)},
	{"id": "bench-team", "kind": "team", "parent": "bench-org", "limits": highLimits(false)},
	{"id": "bench-user", "kind": "user", "parent": "bench-team", "limits": highLimits(false)},
	{"id": "bench-agent", "kind": "agent", "parent": "bench-user", "limits": highLimits(false)},
}

const benchAccount = "bench-agent"

func highLimits(quota bool) map[string]any {
	req := map[string]any{"rate_per_s": 10_000_000, "burst": 100_000_000}
	if quota {
		req["quota"] = 1_000_000_000_000
	}
	return map[string]any{"requests": req, "tokens": map[string]any{"rate_per_s": 10_000_000_000, "burst": 100_000_000_000}}
}

// decisionBody holds the units of every benchmarked decision over HTTP, decisionUnits the
// same for the decisions the bench takes in-process.
const decisionBody = `"units":{"requests":1,"tokens":500}`

var decisionUnits = map[policy.Unit]int64{policy.Requests: 1, policy.Tokens: 500}

// createTree creates tree through the admin API and returns an API key of the last
// account, once admit's policy cache has it.
func (s *stack) createTree(ctx context.Context, tree []map[string]any) (string, error) {
	a := sandbox.Admin{Base: s.admit.URL(), Token: adminToken, HTTP: s.http}
	for _, acc := range tree {
		if err := a.Do(ctx, http.MethodPost, "/v1/admin/accounts", acc, http.StatusCreated, nil); err != nil {
			return "", err
		}
	}
	last := tree[len(tree)-1]
	var key struct {
		APIKey string `json:"api_key"`
	}
	if err := a.Do(ctx, http.MethodPost, "/v1/admin/api-keys", map[string]any{"account": last["id"]}, http.StatusCreated, &key); err != nil {
		return "", err
	}
	if err := a.WaitLoaded(ctx, last["id"].(string), map[string]any{"limits": last["limits"]}); err != nil {
		return "", err
	}
	return key.APIKey, nil
}

// loadRun is a loadgen result with the CPU time loadgen itself used.
type loadRun struct {
	load.Result
	LoadgenCPUS float64 `json:"loadgen_cpu_s"`
}

// loadgen runs bin/loadgen and returns its result.
func (s *stack) loadgen(ctx context.Context, url, token, body string, args ...string) (loadRun, error) {
	f, err := os.CreateTemp("", "bench-body-*.json")
	if err != nil {
		return loadRun{}, err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(body); err != nil {
		return loadRun{}, err
	}
	f.Close()
	all := append([]string{"-url", url, "-token", token, "-body", "@" + f.Name(),
		"-warmup", s.cfg.Warmup.String(), "-duration", s.cfg.Duration.String()}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(s.cfg.BinDir, "loadgen"), all...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return loadRun{}, fmt.Errorf("loadgen %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	res := loadRun{LoadgenCPUS: (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()}
	if err := json.Unmarshal(stdout.Bytes(), &res.Result); err != nil {
		return res, fmt.Errorf("loadgen output: %w", err)
	}
	if ok := res.Status["200"]; ok == 0 || ok < res.Requests*99/100 {
		return res, fmt.Errorf("loadgen against %s: only %d of %d requests answered 200 (%v, errors %v)", url, ok, res.Requests, res.Status, res.ErrorSamples)
	}
	return res, nil
}

// peer is the redis_rate service (bench/redisrate).
type peer struct {
	cmd  *exec.Cmd
	addr string
}

func (s *stack) startPeer() (*peer, error) {
	cmd := exec.Command(filepath.Join(s.cfg.BinDir, "redisrate"), "-addr", "127.0.0.1:0",
		"-redis-url", s.cfg.RedisURL, "-rate", "100000000", "-key", s.cfg.KeyPrefix+":redisrate")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(s.cfg.LogDir, "redisrate.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		return nil, fmt.Errorf("redisrate: no address on stdout: %w", err)
	}
	go func() { _ = cmd.Wait(); logf.Close() }()
	return &peer{cmd: cmd, addr: strings.TrimSpace(line)}, nil
}

func (p *peer) stop() { _ = p.cmd.Process.Signal(os.Interrupt) }

// procCPU is the CPU time (user + system) a process has used so far.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may hold spaces, in parentheses): utime and
	// stime are the 12th and 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// cpuSplit is the CPU time each process used per request of a closed-loop run, in µs.
type cpuSplit struct {
	Loadgen float64 `json:"loadgen_us"`
	Server  float64 `json:"server_us"`
	Redis   float64 `json:"redis_us"`
}

func (c cpuSplit) String() string {
	return fmt.Sprintf("CPU per request: loadgen %.0f µs, server %.0f µs, Redis %.0f µs", c.Loadgen, c.Server, c.Redis)
}

// cpuProbe reads a server's and Redis's CPU time before and after a load run.
type cpuProbe struct {
	s             *stack
	pid           int
	server, redis time.Duration
}

func (s *stack) probeCPU(ctx context.Context, pid int) (*cpuProbe, error) {
	p := &cpuProbe{s: s, pid: pid}
	var err1, err2 error
	p.server, err1 = procCPU(pid)
	p.redis, err2 = s.redisCPU(ctx)
	return p, errors.Join(err1, err2)
}

// split divides what the server, Redis and loadgen used since the probe by the requests
// loadgen sent (warmup included, as the CPU times are).
func (p *cpuProbe) split(ctx context.Context, r loadRun) (cpuSplit, error) {
	server, err1 := procCPU(p.pid)
	redis, err2 := p.s.redisCPU(ctx)
	if err := errors.Join(err1, err2); err != nil {
		return cpuSplit{}, err
	}
	n := float64(r.Requests) * (r.DurationS + r.WarmupS) / r.DurationS // the warmup's requests, estimated at the same rate
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	return cpuSplit{Loadgen: r.LoadgenCPUS * 1e6 / n, Server: us(server - p.server), Redis: us(redis - p.redis)}, nil
}

// redisCPU is Redis's used CPU time (user + system) so far.
func (s *stack) redisCPU(ctx context.Context) (time.Duration, error) {
	info, err := s.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// metric sums the samples of a counter or gauge on the /metrics of the service at base.
func (s *stack) metric(ctx context.Context, base, name string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += f
		}
	}
	return sum, sc.Err()
}

// outboxEmpty polls until the relay has moved every event of the bench's outbox to Kafka.
func (s *stack) outboxEmpty(ctx context.Context, timeout time.Duration) error {
	k := admission.Keys{Prefix: s.cfg.KeyPrefix, Shards: shards}
	deadline := time.Now().Add(timeout)
	for {
		var n int64
		for i := range shards {
			l, err := s.rdb.XLen(ctx, k.Outbox(i)).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			n += l
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d events still in the outbox after %s", n, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// admitThroughput measures admit against the redis_rate peer (closed loop, same clients,
// same window), Redis CPU per decision against redis-benchmark's EVALSHA of the same
// script, and admit's latency at 50 % and 90 % of its maximum (open loop).
func (s *stack) admitThroughput(ctx context.Context, res *Results) error {
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	clients := strconv.Itoa(s.cfg.Clients)

	p, err := s.startPeer()
	if err != nil {
		return err
	}
	probe, err := s.probeCPU(ctx, p.cmd.Process.Pid)
	if err != nil {
		p.stop()
		return err
	}
	peerRes, err := s.loadgen(ctx, "http://"+p.addr+"/v1/admit", "", `{"units":{"requests":1}}`, "-concurrency", clients)
	var peerCPU cpuSplit
	if err == nil {
		peerCPU, err = probe.split(ctx, peerRes)
	}
	p.stop()
	if err != nil {
		return fmt.Errorf("redis_rate peer: %w", err)
	}

	// admit, closed loop, with the relay (a deployment of its own) stopped for the window,
	// so that Kafka, the meter and PostgreSQL do not take the shared cores meanwhile. Redis
	// CPU and decisions are counted until the restarted relay has emptied the outbox: the
	// relay's Redis work for these events is in the figure.
	if err := s.outboxEmpty(ctx, time.Minute); err != nil {
		return err
	}
	if err := s.stopRelay(); err != nil {
		return err
	}
	cpu0, err := s.redisCPU(ctx)
	if err != nil {
		return err
	}
	dec0, err := s.metric(ctx, s.admit.URL(), "metergate_admit_decisions_total")
	if err != nil {
		return err
	}
	probe, err = s.probeCPU(ctx, s.admit.Pid())
	if err != nil {
		return err
	}
	admitRes, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body, "-concurrency", clients)
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	admitSplit, err := probe.split(ctx, admitRes)
	if err != nil {
		return err
	}
	if err := s.startRelay(ctx); err != nil {
		return err
	}
	if err := s.outboxEmpty(ctx, 2*time.Minute); err != nil {
		return err
	}
	cpu1, err := s.redisCPU(ctx)
	if err != nil {
		return err
	}
	dec1, err := s.metric(ctx, s.admit.URL(), "metergate_admit_decisions_total")
	if err != nil {
		return err
	}
	admitCPU := float64(cpu1-cpu0) / (dec1 - dec0) // ns per decision

	// The same with the whole pipeline running on the same two cores.
	fullRes, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body, "-concurrency", clients)
	if err != nil {
		return fmt.Errorf("admit, relay running: %w", err)
	}

	ev, err := s.evalsha(ctx)
	if err != nil {
		return fmt.Errorf("redis-benchmark: %w", err)
	}

	res.Raw["redis_rate_peer"] = peerRes
	res.Raw["admit_closed_loop"] = admitRes
	res.Raw["cpu_per_request"] = map[string]cpuSplit{"redis_rate_peer": peerCPU, "admit": admitSplit}
	res.Raw["admit_closed_loop_relay_running"] = fullRes
	res.Raw["redis_cpu"] = map[string]any{
		"admit_decisions": dec1 - dec0, "admit_cpu_s": (cpu1 - cpu0).Seconds(), "admit_cpu_us_per_decision": admitCPU / 1e3,
		"evalsha_calls": ev.calls, "evalsha_cpu_s": ev.cpu.Seconds(), "evalsha_cpu_us_per_call": float64(ev.cpu) / float64(ev.calls) / 1e3,
		"evalsha_rps": ev.rps,
	}
	res.add("admit_vs_redis_rate", admitRes.Rate/peerRes.Rate, "×", "≥ 0.8",
		fmt.Sprintf("admit %.0f decisions/s (4 levels × requests+tokens buckets, monthly quota, outbox event; relay paused) ÷ redis_rate AllowN peer %.0f/s; %d clients, closed loop. admit's %s; the peer's %s", admitRes.Rate, peerRes.Rate, s.cfg.Clients, admitSplit, peerCPU))
	res.add("admit_vs_redis_rate_relay_running", fullRes.Rate/peerRes.Rate, "×", "",
		fmt.Sprintf("the same, with the relay, Kafka, the meter and PostgreSQL at work on the same 2 cores: admit %.0f/s", fullRes.Rate))
	res.add("admit_redis_efficiency", float64(ev.cpu)/float64(ev.calls)/admitCPU, "×", "≥ 1.0",
		fmt.Sprintf("Redis CPU per EVALSHA of redis-benchmark -c 50 (%.1f µs) ÷ per decision under admit's load, relay included (%.1f µs)", float64(ev.cpu)/float64(ev.calls)/1e3, admitCPU/1e3))
	res.add("admit_vs_evalsha", admitRes.Rate/ev.rps, "×", "",
		fmt.Sprintf("admit %.0f decisions/s ÷ redis-benchmark EVALSHA of the same script %.0f/s", admitRes.Rate, ev.rps))

	// Latency at 50 % and 90 % of the maximum measured under the same conditions (relay
	// running), open loop (from each request's due time).
	for _, frac := range []float64{0.5, 0.9} {
		rate := fullRes.Rate * frac
		r, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body,
			"-rate", strconv.FormatFloat(rate, 'f', 0, 64), "-concurrency", "512")
		if err != nil {
			return fmt.Errorf("admit at %.0f%%: %w", frac*100, err)
		}
		pct := fmt.Sprintf("%.0f", frac*100)
		res.Raw["admit_open_loop_"+pct] = r
		against := fmt.Sprintf("open loop at %.0f/s = %s %% of the maximum with the relay running (achieved %.0f/s, %d late > 1 ms, %d unsent)", rate, pct, r.Rate, r.Late, r.Unsent)
		res.add("admit_p50_ms_at_"+pct, r.Latency.P50, "ms", "", against)
		res.add("admit_p99_ms_at_"+pct, r.Latency.P99, "ms", "", against)
	}
	return nil
}

type evalshaResult struct {
	calls int
	rps   float64
	cpu   time.Duration
}

// evalsha runs redis-benchmark -c 50 (no pipelining) with EVALSHA of admit's script, the
// keys and arguments admit sends for one decision of benchAccount. The keys are under a
// prefix of their own that no relay reads, so Redis does the script's work only.
func (s *stack) evalsha(ctx context.Context) (evalshaResult, error) {
	pol, err := s.benchPolicy(ctx)
	if err != nil {
		return evalshaResult{}, err
	}
	prefix := s.cfg.KeyPrefix + "-evalsha"
	adm := admission.New(s.rdb, admission.Options{KeyPrefix: prefix, Shards: shards})
	defer func() { _, _ = sandbox.DeleteKeys(context.WithoutCancel(ctx), s.rdb, prefix) }()
	keys, args, err := adm.ScriptCall(admission.Request{EventID: adm.NewEventID(pol.Org), Policy: pol,
		Units: decisionUnits, Source: "bench"})
	if err != nil {
		return evalshaResult{}, err
	}
	if err := lua.Admit.Load(ctx, s.rdb).Err(); err != nil {
		return evalshaResult{}, err
	}
	opts := s.rdb.Options()
	host, port, _ := strings.Cut(opts.Addr, ":")
	cmdArgs := []string{"-h", host, "-p", port, "-c", "50", "-n", strconv.Itoa(s.cfg.EvalshaRequests), "--csv"}
	if opts.Password != "" {
		cmdArgs = append(cmdArgs, "-a", opts.Password)
		if opts.Username != "" {
			cmdArgs = append(cmdArgs, "--user", opts.Username)
		}
	}
	if opts.DB != 0 {
		cmdArgs = append(cmdArgs, "--dbnum", strconv.Itoa(opts.DB))
	}
	cmdArgs = append(cmdArgs, "EVALSHA", lua.Admit.Hash(), strconv.Itoa(len(keys)))
	cmdArgs = append(cmdArgs, keys...)
	for _, a := range args {
		cmdArgs = append(cmdArgs, fmt.Sprint(a))
	}
	cpu0, err := s.redisCPU(ctx)
	if err != nil {
		return evalshaResult{}, err
	}
	cmd := exec.CommandContext(ctx, "redis-benchmark", cmdArgs...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return evalshaResult{}, fmt.Errorf("%w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	cpu1, err := s.redisCPU(ctx)
	if err != nil {
		return evalshaResult{}, err
	}
	rps, err := benchmarkRPS(stdout.String())
	if err != nil {
		return evalshaResult{}, err
	}
	// The script must have decided, not failed: every call wrote its event.
	k := adm.Keys()
	n, err := s.rdb.XLen(ctx, k.Outbox(k.Shard(pol.Org))).Result()
	if err != nil {
		return evalshaResult{}, err
	}
	if n != int64(s.cfg.EvalshaRequests) {
		return evalshaResult{}, fmt.Errorf("redis-benchmark: %d events written for %d calls (the script failed?): %s", n, s.cfg.EvalshaRequests, strings.TrimSpace(stderr.String()))
	}
	return evalshaResult{calls: s.cfg.EvalshaRequests, rps: rps, cpu: cpu1 - cpu0}, nil
}

// benchmarkRPS reads requests/s from redis-benchmark --csv: a header line
// "test","rps",… (8 columns), then one line per test. The test's name is the command
// line, unescaped, so the figures are read from the end of the line.
func benchmarkRPS(out string) (float64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := strings.Split(lines[0], ",")
	if len(lines) < 2 || len(header) != 8 || header[1] != `"rps"` {
		return 0, fmt.Errorf("no requests/s in redis-benchmark's output %q", out)
	}
	f := strings.Split(lines[len(lines)-1], ",")
	if len(f) < 8 {
		return 0, fmt.Errorf("no requests/s in redis-benchmark's output %q", out)
	}
	return strconv.ParseFloat(strings.Trim(f[len(f)-7], `"`), 64)
}

// admitIdle is one client, closed loop: the latency of a decision with nothing else going
// on, beside the redis_rate peer's under the same client.
func (s *stack) admitIdle(ctx context.Context, res *Results) error {
	key, err := s.createTree(ctx, idleTree)
	if err != nil {
		return err
	}
	p, err := s.startPeer()
	if err != nil {
		return err
	}
	peerRes, err := s.loadgen(ctx, "http://"+p.addr+"/v1/admit", "", `{"units":{"requests":1}}`, "-concurrency", "1")
	p.stop()
	if err != nil {
		return fmt.Errorf("redis_rate peer: %w", err)
	}
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	r, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body, "-concurrency", "1")
	if err != nil {
		return err
	}
	res.Raw["admit_idle"] = r
	res.Raw["redis_rate_peer_idle"] = peerRes
	res.add("admit_p50_ms_idle", r.Latency.P50, "ms", "≤ 0.3",
		fmt.Sprintf("1 client, closed loop, HTTP from loadgen; 4 levels (org → team → user → agent, the deepest tree the model has) × requests+tokens buckets, quota, event; p99 %.3f ms. The redis_rate peer (1 bucket) under the same client: p50 %.3f ms, p99 %.3f ms",
			r.Latency.P99, peerRes.Latency.P50, peerRes.Latency.P99))
	res.add("admit_idle_vs_redis_rate", r.Latency.P50/peerRes.Latency.P50, "×", "",
		"admit's idle p50 ÷ the redis_rate peer's, 1 client each")
	return nil
}

// idleTree is benchTree's shape under another org (a cold shard and cold keys).
var idleTree = func() []map[string]any {
	t := make([]map[string]any, len(benchTree))
	for i, a := range benchTree {
		c := map[string]any{}
		for k, v := range a {
			c[k] = v
		}
		c["id"] = strings.Replace(a["id"].(string), "bench-", "idle-", 1)
		if p, ok := a["parent"].(string); ok {
			c["parent"] = strings.Replace(p, "bench-", "idle-", 1)
		}
		t[i] = c
	}
	return t
}()
