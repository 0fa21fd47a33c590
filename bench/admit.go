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

	"github.com/metergate/metergate/bench/internal/load"
	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/policy"
	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/lua"
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
// loadgen sent, warmup included (as the CPU times include it).
func (p *cpuProbe) split(ctx context.Context, r loadRun) (cpuSplit, error) {
	server, err1 := procCPU(p.pid)
	redis, err2 := p.s.redisCPU(ctx)
	if err := errors.Join(err1, err2); err != nil {
		return cpuSplit{}, err
	}
	n := float64(max(r.Sent, 1))
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / n }
	return cpuSplit{Loadgen: r.LoadgenCPUS * 1e6 / n, Server: us(server - p.server), Redis: us(redis - p.redis)}, nil
}

// peerSample is one closed-loop run against the redis_rate peer.
type peerSample struct {
	Load loadRun  `json:"load"`
	CPU  cpuSplit `json:"cpu_per_request"`
	// RedisUS is Redis's CPU per request: INFO cpu's delta over the run ÷ requests sent.
	RedisUS  float64            `json:"redis_us_per_request"`
	Commands map[string]cmdStat `json:"commandstats_per_request"`
}

func (s *stack) peerSample(ctx context.Context, p *peer, body string, clients int) (peerSample, error) {
	var ps peerSample
	cs0, err := s.commandStats(ctx)
	if err != nil {
		return ps, err
	}
	probe, err := s.probeCPU(ctx, p.cmd.Process.Pid)
	if err != nil {
		return ps, err
	}
	if ps.Load, err = s.loadgen(ctx, "http://"+p.addr+"/v1/admit", "", body, "-concurrency", strconv.Itoa(clients)); err != nil {
		return ps, fmt.Errorf("redis_rate peer: %w", err)
	}
	if ps.CPU, err = probe.split(ctx, ps.Load); err != nil {
		return ps, err
	}
	cs1, err := s.commandStats(ctx)
	if err != nil {
		return ps, err
	}
	ps.RedisUS, ps.Commands = ps.CPU.Redis, perUnit(cs0, cs1, float64(ps.Load.Sent))
	return ps, nil
}

// admitSample is one closed-loop run against an admit node, its Redis work counted until
// the node's relay has emptied the outbox again.
type admitSample struct {
	Load loadRun  `json:"load"`
	CPU  cpuSplit `json:"cpu_per_request"` // Redis: during the load only
	// Decisions is metergate_admit_decisions_total's delta; RedisUS is INFO cpu's delta
	// from before the load to the outbox emptied ÷ Decisions.
	Decisions float64 `json:"decisions"`
	RedisUS   float64 `json:"redis_us_per_decision"`
	// PerCall is the mean decisions per script call, from the node's
	// metergate_admit_script_batch_size histogram; ScriptCallsPerDecision the same from
	// INFO commandstats (server-wide: EVALSHA and kin).
	PerCall                float64            `json:"decisions_per_call"`
	ScriptCallsPerDecision float64            `json:"script_calls_per_decision"`
	DrainedS               float64            `json:"outbox_drained_after_load_s"`
	Commands               map[string]cmdStat `json:"commandstats_per_decision"`
}

// admitSample runs the closed loop against node. With pause, the relay apart (s.relay)
// is stopped for the load and started after it.
func (s *stack) admitSample(ctx context.Context, node *sandbox.Proc, pause bool, body string, clients int) (admitSample, error) {
	var as admitSample
	if err := s.outboxEmpty(ctx, node.URL(), 2*time.Minute); err != nil {
		return as, err
	}
	if pause {
		if err := s.stopRelay(); err != nil {
			return as, err
		}
	}
	cpu0, err := s.redisCPU(ctx)
	if err != nil {
		return as, err
	}
	cs0, err := s.commandStats(ctx)
	if err != nil {
		return as, err
	}
	m0, err := s.admitCounters(ctx, node)
	if err != nil {
		return as, err
	}
	probe, err := s.probeCPU(ctx, node.Pid())
	if err != nil {
		return as, err
	}
	if as.Load, err = s.loadgen(ctx, node.URL()+"/v1/admit", serviceToken, body, "-concurrency", strconv.Itoa(clients)); err != nil {
		return as, fmt.Errorf("admit: %w", err)
	}
	if as.CPU, err = probe.split(ctx, as.Load); err != nil {
		return as, err
	}
	drain := time.Now()
	if pause {
		if err := s.startRelay(ctx); err != nil {
			return as, err
		}
	}
	if err := s.outboxEmpty(ctx, node.URL(), 2*time.Minute); err != nil {
		return as, err
	}
	as.DrainedS = time.Since(drain).Seconds()
	cpu1, err := s.redisCPU(ctx)
	if err != nil {
		return as, err
	}
	cs1, err := s.commandStats(ctx)
	if err != nil {
		return as, err
	}
	m1, err := s.admitCounters(ctx, node)
	if err != nil {
		return as, err
	}
	as.Decisions = m1.decisions - m0.decisions
	if as.Decisions <= 0 {
		return as, fmt.Errorf("admit counted no decisions in metergate_admit_decisions_total (%v → %v)", m0, m1)
	}
	as.RedisUS = float64((cpu1 - cpu0).Nanoseconds()) / 1e3 / as.Decisions
	if calls := m1.calls - m0.calls; calls > 0 {
		as.PerCall = (m1.batched - m0.batched) / calls
	}
	sc0, _ := scriptCalls(cs0)
	sc1, _ := scriptCalls(cs1)
	as.ScriptCallsPerDecision = (sc1 - sc0) / as.Decisions
	as.Commands = perUnit(cs0, cs1, as.Decisions)
	return as, nil
}

// counters are an admit node's decisions and script calls so far.
type counters struct{ decisions, calls, batched float64 }

// admitCounters reads metergate_admit_decisions_total and the script batch histogram
// (internal/admission/metrics.go: its _count is script calls, its _sum decisions in them). A
// node that has decided nothing yet has no decisions series: 0, and admitSample fails
// when there are still none after the load.
func (s *stack) admitCounters(ctx context.Context, node *sandbox.Proc) (counters, error) {
	m, err := s.metrics(ctx, node.URL())
	if err != nil {
		return counters{}, err
	}
	return counters{decisions: m["metergate_admit_decisions_total"],
		calls: m["metergate_admit_script_batch_size_count"], batched: m["metergate_admit_script_batch_size_sum"]}, nil
}

// throughputRound is one round of the interleaved throughput samples.
type throughputRound struct {
	Peer  peerSample  `json:"redis_rate_peer"`
	Admit admitSample `json:"admit"`       // relay inside admit
	Apart admitSample `json:"admit_apart"` // relay apart, paused for the load
}

// admitThroughput measures admit against the redis_rate peer under the same closed loop
// in Rounds interleaved rounds (peer, admit with its relay inside, admit with the relay
// apart and paused): throughput and Redis CPU per decision, each ratio from the samples
// of the same round. Then Redis CPU per call of redis-benchmark's EVALSHA of the same
// script, and admit's latency at 50 % and 90 % of its maximum (open loop).
func (s *stack) admitThroughput(ctx context.Context, res *Results) error {
	key, err := s.benchKey(ctx)
	if err != nil {
		return err
	}
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	p, err := s.startPeer()
	if err != nil {
		return err
	}
	defer p.stop()
	var rounds []throughputRound
	col := map[string][]float64{}
	for range s.cfg.Rounds {
		var r throughputRound
		if r.Peer, err = s.peerSample(ctx, p, `{"units":{"requests":1}}`, s.cfg.Clients); err != nil {
			return err
		}
		if r.Admit, err = s.admitSample(ctx, s.admit, false, body, s.cfg.Clients); err != nil {
			return err
		}
		if r.Apart, err = s.admitSample(ctx, s.apart, true, body, s.cfg.Clients); err != nil {
			return fmt.Errorf("relay apart: %w", err)
		}
		rounds = append(rounds, r)
		for k, v := range map[string]float64{
			"rate": r.Admit.Load.Rate / r.Peer.Load.Rate, "rate_apart": r.Apart.Load.Rate / r.Peer.Load.Rate,
			"cost": r.Admit.RedisUS / r.Peer.RedisUS, "peer_us": r.Peer.RedisUS, "admit_us": r.Admit.RedisUS,
			"apart_us": r.Apart.RedisUS, "per_call": r.Admit.PerCall, "admit_rps": r.Admit.Load.Rate, "peer_rps": r.Peer.Load.Rate,
		} {
			col[k] = append(col[k], v)
		}
	}
	res.Raw["throughput_rounds"] = rounds
	last := rounds[len(rounds)-1]
	admitRPS, admitUS := spreadOf(col["admit_rps"]).Median, spreadOf(col["admit_us"]).Median
	res.addSpread("admit_vs_redis_rate", spreadOf(col["rate"]), "×", "≥ 0.8",
		fmt.Sprintf("admit's decisions/s (the default deployment: its relay inside; 4 levels × requests+tokens buckets, monthly quota, outbox event; median %.0f/s) ÷ the redis_rate AllowN peer's requests/s (median %.0f/s), each round's admit ÷ the same round's peer; %d clients, closed loop, %s after a %s warmup. Last round, admit's %s; the peer's %s",
			admitRPS, spreadOf(col["peer_rps"]).Median, s.cfg.Clients, s.cfg.Duration, s.cfg.Warmup, last.Admit.CPU, last.Peer.CPU))
	res.addSpread("admit_vs_redis_rate_relay_apart", spreadOf(col["rate_apart"]), "×", "",
		"the same against a node with ADMIT_RELAY=false whose relay (admit relay, a process apart) is paused during the load and drains right after: what admit does without Kafka, the meter and PostgreSQL at work on the same cores")
	res.addSpread("admit_redis_us_per_decision", spreadOf(col["admit_us"]), "µs", "",
		fmt.Sprintf("Redis CPU (INFO cpu used_cpu_user+sys delta) from before the load until admit's own relay has emptied the outbox (its reads, acknowledgements and deletes included) ÷ admit's decisions (metergate_admit_decisions_total); server-wide, so other clients of the same Redis count too. Relay apart, paused: median %.1f µs", spreadOf(col["apart_us"]).Median))
	res.addSpread("redis_rate_redis_us_per_request", spreadOf(col["peer_us"]), "µs", "",
		"Redis CPU (INFO cpu delta over the run) ÷ the peer's requests, warmup included; the same clients and window as admit's")
	res.addSpread("admit_redis_cost_vs_redis_rate", spreadOf(col["cost"]), "×", "≤ 1.0",
		"admit_redis_us_per_decision ÷ redis_rate_redis_us_per_request, each round's admit ÷ the same round's peer")
	res.addSpread("admit_decisions_per_call", spreadOf(col["per_call"]), "", "",
		fmt.Sprintf("mean decisions per script call during admit's load (metergate_admit_script_batch_size _sum ÷ _count); INFO commandstats (EVALSHA and kin, server-wide): %.3f script calls per decision in the last round",
			last.Admit.ScriptCallsPerDecision))

	// Latency at 50 % and 90 % of the median maximum, open loop (from each request's due
	// time), the relay inside admit.
	for _, frac := range []float64{0.5, 0.9} {
		rate := admitRPS * frac
		r, err := s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body,
			"-rate", strconv.FormatFloat(rate, 'f', 0, 64), "-concurrency", "512")
		if err != nil {
			return fmt.Errorf("admit at %.0f%%: %w", frac*100, err)
		}
		pct := fmt.Sprintf("%.0f", frac*100)
		res.Raw["admit_open_loop_"+pct] = r
		against := fmt.Sprintf("open loop at %.0f/s = %s %% of the median maximum, the relay inside admit (achieved %.0f/s, %d late > 1 ms, %d unsent)", rate, pct, r.Rate, r.Late, r.Unsent)
		res.add("admit_p50_ms_at_"+pct, r.Latency.P50, "ms", "", against)
		res.add("admit_p99_ms_at_"+pct, r.Latency.P99, "ms", "", against)
	}

	ev, err := s.evalsha(ctx)
	if err != nil {
		return fmt.Errorf("redis-benchmark: %w", err)
	}
	evUS := float64(ev.cpu) / float64(ev.calls) / 1e3
	res.Raw["evalsha"] = map[string]any{"calls": ev.calls, "cpu_s": ev.cpu.Seconds(), "cpu_us_per_call": evUS, "rps": ev.rps}
	res.add("admit_redis_efficiency", evUS/admitUS, "×", "≥ 1.0",
		fmt.Sprintf("Redis CPU per EVALSHA of redis-benchmark -c 50 with the keys and arguments of one decision (%.1f µs) ÷ admit_redis_us_per_decision (%.1f µs)", evUS, admitUS))
	res.add("admit_vs_evalsha", admitRPS/ev.rps, "×", "",
		fmt.Sprintf("admit %.0f decisions/s (median) ÷ redis-benchmark EVALSHA of the same script %.0f/s", admitRPS, ev.rps))
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
	// One decision through the Admitter writes the program into the mirror: the calls
	// then send its version, as a node does once it has sent the program.
	if _, err := adm.Decide(ctx, admission.Request{EventID: adm.NewEventID(pol.Org), Policy: pol,
		Units: decisionUnits, Source: "bench"}); err != nil {
		return evalshaResult{}, err
	}
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
	cs0, err := s.commandStats(ctx)
	if err != nil {
		return evalshaResult{}, err
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
	// The script must have run, not failed: every call counted in commandstats, (almost)
	// none failed. The counters are server-wide: other clients' scripts add calls, and a
	// few failures of theirs may land in the window; a broken call fails every time.
	cs1, err := s.commandStats(ctx)
	if err != nil {
		return evalshaResult{}, err
	}
	c0, f0 := scriptCalls(cs0)
	c1, f1 := scriptCalls(cs1)
	if c1-c0 < float64(s.cfg.EvalshaRequests) || f1-f0 > float64(s.cfg.EvalshaRequests)/100 {
		return evalshaResult{}, fmt.Errorf("redis-benchmark: %.0f script calls, %.0f failed, for %d requests (the script failed?): %s",
			c1-c0, f1-f0, s.cfg.EvalshaRequests, strings.TrimSpace(stderr.String()))
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
// on, beside the redis_rate peer's under the same client, in interleaved rounds (peer,
// admit, peer, admit…). admit is the default deployment, its relay inside.
func (s *stack) admitIdle(ctx context.Context, res *Results) error {
	key, err := s.createTree(ctx, idleTree)
	if err != nil {
		return err
	}
	p, err := s.startPeer()
	if err != nil {
		return err
	}
	defer p.stop()
	body := `{"api_key":"` + key + `",` + decisionBody + `}`
	type round struct {
		Peer  loadRun `json:"redis_rate_peer"`
		Admit loadRun `json:"admit"`
	}
	var rounds []round
	var p50, p99, peer50, peer99, ratio []float64
	for range s.cfg.Rounds {
		var r round
		if r.Peer, err = s.loadgen(ctx, "http://"+p.addr+"/v1/admit", "", `{"units":{"requests":1}}`, "-concurrency", "1"); err != nil {
			return fmt.Errorf("redis_rate peer: %w", err)
		}
		if r.Admit, err = s.loadgen(ctx, s.admit.URL()+"/v1/admit", serviceToken, body, "-concurrency", "1"); err != nil {
			return err
		}
		rounds = append(rounds, r)
		p50, p99 = append(p50, r.Admit.Latency.P50), append(p99, r.Admit.Latency.P99)
		peer50, peer99 = append(peer50, r.Peer.Latency.P50), append(peer99, r.Peer.Latency.P99)
		ratio = append(ratio, r.Admit.Latency.P50/r.Peer.Latency.P50)
	}
	res.Raw["idle_rounds"] = rounds
	res.addSpread("admit_p50_ms_idle", spreadOf(p50), "ms", "≤ 0.3",
		fmt.Sprintf("1 client, closed loop, HTTP from loadgen, the relay inside admit; 4 levels (org → team → user → agent, the deepest tree the model has) × requests+tokens buckets, quota, event; p99 %.3f ms (median). The redis_rate peer (1 bucket) under the same client in the same rounds: p50 %.3f ms, p99 %.3f ms (medians)",
			spreadOf(p99).Median, spreadOf(peer50).Median, spreadOf(peer99).Median))
	res.addSpread("redis_rate_p50_ms_idle", spreadOf(peer50), "ms", "", "the peer's idle p50, 1 client, in the same rounds as admit_p50_ms_idle")
	res.addSpread("admit_idle_vs_redis_rate", spreadOf(ratio), "×", "≤ 1.3",
		"admit's idle p50 ÷ the redis_rate peer's, 1 client each, each round's admit ÷ the same round's peer")
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
