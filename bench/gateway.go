package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/metergate/metergate/internal/sandbox"
)

// gatewayPath is one front door onto admit's decision: call takes one decision through it
// (allowed, or an error). Adding a door (the forward-auth check) is adding one of these.
type gatewayPath struct {
	name string
	call func(ctx context.Context) error
}

// gatewaySample is one closed-loop run through a path.
type gatewaySample struct {
	Clients   int     `json:"clients"`
	Decisions int64   `json:"decisions"`
	PerS      float64 `json:"decisions_per_s"`
	// CPUUS is admit's CPU (user + system, its relay inside) per decision, µs.
	CPUUS float64 `json:"admit_cpu_us_per_decision"`
	P50MS float64 `json:"p50_ms"`
}

// gateway measures Envoy's rate-limit service (gRPC) and the forward-auth check (GET
// /v1/check) against the HTTP JSON API (issue 20: "decisions/s and admit CPU per decision
// through gRPC and through /v1/check against the HTTP JSON API in the same run, goal:
// neither costs more than 10 % above it; idle p50 added by each path"). One admit node with
// ADMIT_GRPC_ADDR, its relay inside, under a key prefix of its own; the same decision
// (benchTree's shape, requests 1 + tokens 500) through each path, from clients in the bench
// process (the same client cost for each), in interleaved rounds: cfg.Clients clients for
// the throughput and CPU, one for the idle p50.
func (s *stack) gateway(ctx context.Context, res *Results) error {
	node, grpcAddr, err := s.startGatewayNode(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = node.Stop(30 * time.Second) }()
	defer func() { _, _ = sandbox.DeleteKeys(context.WithoutCancel(ctx), s.rdb, s.cfg.KeyPrefix+"-gateway") }()
	key, err := s.createTree(ctx, renamedTree("gw-"))
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	httpPath := s.httpDecision(node.URL(), key)
	paths := []gatewayPath{httpPath, grpcDecision(conn, key), s.checkDecision(node.URL(), key)}
	for _, p := range paths { // the node's cache learns the key through LISTEN/NOTIFY
		if err := retryUntil(ctx, 30*time.Second, p.call); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}

	samples, rounds, err := s.pathRounds(ctx, paths, func(string) int { return node.Pid() })
	if err != nil {
		return err
	}
	res.Raw["gateway_rounds"] = rounds
	base := samples[httpPath.name]
	for _, p := range paths[1:] {
		v := samples[p.name]
		var cpu, perS, added []float64
		for i := range v.cpu {
			cpu = append(cpu, v.cpu[i]/base.cpu[i])
			perS = append(perS, v.perS[i]/base.perS[i])
			added = append(added, v.p50[i]-base.p50[i])
		}
		what := fmt.Sprintf("the same decision (4 levels, requests+tokens, quota, event) through %s and through POST /v1/admit (HTTP JSON) of one admit node, %d clients in the bench process, each round's pair",
			p.name, s.cfg.Clients)
		res.addSpread("gateway_"+p.name+"_cpu_ratio", spreadOf(cpu), "×", "≤ 1.1",
			fmt.Sprintf("admit CPU per decision, %s ÷ HTTP: %s; %.0f µs against %.0f µs (medians)", p.name, what,
				spreadOf(v.cpu).Median, spreadOf(base.cpu).Median))
		res.addSpread("gateway_"+p.name+"_throughput_ratio", spreadOf(perS), "×", "",
			fmt.Sprintf("decisions/s, %s ÷ HTTP: %s; %.0f/s against %.0f/s (medians)", p.name, what,
				spreadOf(v.perS).Median, spreadOf(base.perS).Median))
		res.addSpread("gateway_"+p.name+"_p50_ms_idle_added", spreadOf(added), "ms", "",
			fmt.Sprintf("idle p50 (1 client, closed loop) through %s less POST /v1/admit's, each round's pair; %.3f ms against %.3f ms (medians)",
				p.name, spreadOf(v.p50).Median, spreadOf(base.p50).Median))
	}
	return nil
}

// pathRound is one round's samples of a path: under load, and idle.
type pathRound struct{ Load, Idle gatewaySample }

// pathSeries are a path's samples over the rounds: decisions/s and CPU per decision under
// load, and the idle p50.
type pathSeries struct{ perS, cpu, p50 []float64 }

// pathRounds takes cfg.Rounds interleaved rounds of every path: cfg.Clients closed loops
// for the throughput and CPU, then one client for the idle p50. pid names the process
// whose CPU a path's decisions cost.
func (s *stack) pathRounds(ctx context.Context, paths []gatewayPath, pid func(path string) int) (map[string]pathSeries, []map[string]pathRound, error) {
	var rounds []map[string]pathRound
	samples := map[string]pathSeries{}
	for range s.cfg.Rounds {
		r := map[string]pathRound{}
		for _, p := range paths {
			load, err := s.gatewaySample(ctx, pid(p.name), p, s.cfg.Clients)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", p.name, err)
			}
			idle, err := s.gatewaySample(ctx, pid(p.name), p, 1)
			if err != nil {
				return nil, nil, fmt.Errorf("%s idle: %w", p.name, err)
			}
			r[p.name] = pathRound{load, idle}
			v := samples[p.name]
			v.perS, v.cpu, v.p50 = append(v.perS, load.PerS), append(v.cpu, load.CPUUS), append(v.p50, idle.P50MS)
			samples[p.name] = v
		}
		rounds = append(rounds, r)
	}
	return samples, rounds, nil
}

// startGatewayNode starts an admit serving gRPC too, under a key prefix of its own; it
// returns the node and its gRPC address.
func (s *stack) startGatewayNode(ctx context.Context) (*sandbox.Proc, string, error) {
	addr, err := sandbox.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	grpcAddr, err := sandbox.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	env := append(append([]string{}, s.env...), "ADMIT_ADDR="+addr, "ADMIT_GRPC_ADDR="+grpcAddr, "ADMIT_NODE=bench-gateway",
		"REDIS_TIMEOUT=5s", "ADMIT_SERVICE_TOKEN="+serviceToken, "ADMIT_ADMIN_TOKEN="+adminToken,
		"ADMIT_KEY_PREFIX="+s.cfg.KeyPrefix+"-gateway")
	p, err := sandbox.StartAs(s.cfg.BinDir, s.cfg.LogDir, "admit", "gateway", addr, env)
	if err != nil {
		return nil, "", err
	}
	if err := p.WaitReady(ctx, 2*time.Minute); err != nil {
		p.Kill()
		return nil, "", err
	}
	return p, grpcAddr, nil
}

// httpDecision is POST /v1/admit with the bench's decision.
func (s *stack) httpDecision(base, key string) gatewayPath {
	body := []byte(`{"api_key":"` + key + `",` + decisionBody + `}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}
	return gatewayPath{name: "http", call: func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/admit", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+serviceToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST /v1/admit: %d %s", resp.StatusCode, bytes.TrimSpace(raw))
		}
		return nil
	}}
}

// checkDecision is the forward-auth check (GET /v1/check) with the bench's decision, as a
// gateway sends it: the key and the tokens in headers, the service token in its own.
func (s *stack) checkDecision(base, key string) gatewayPath {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 30 * time.Second}
	tokens := strconv.FormatInt(decisionUnits["tokens"], 10)
	return gatewayPath{name: "check", call: func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/check", nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Metergate-Token", serviceToken)
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("X-Estimated-Tokens", tokens)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /v1/check: %d %s", resp.StatusCode, bytes.TrimSpace(raw))
		}
		return nil
	}}
}

// grpcDecision is ShouldRateLimit with the bench's decision: the key as the api_key
// descriptor, the tokens as its hits_addend.
func grpcDecision(conn *grpc.ClientConn, key string) gatewayPath {
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries:    []*commonv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}},
		HitsAddend: wrapperspb.UInt64(uint64(decisionUnits["tokens"])),
	}}}
	md := metadata.Pairs("authorization", "Bearer "+serviceToken)
	return gatewayPath{name: "grpc", call: func(ctx context.Context) error {
		resp, err := client.ShouldRateLimit(metadata.NewOutgoingContext(ctx, md), req)
		if err != nil {
			return err
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			return fmt.Errorf("ShouldRateLimit: %s %s", resp.GetOverallCode(), resp.GetRawBody())
		}
		return nil
	}}
}

// gatewaySample runs clients closed loops through p for cfg.Warmup, then cfg.Duration,
// and reads admit's CPU over the measured window.
func (s *stack) gatewaySample(ctx context.Context, pid int, p gatewayPath, clients int) (gatewaySample, error) {
	var measuring atomic.Bool
	var n atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			for runCtx.Err() == nil {
				t0 := time.Now()
				err := p.call(runCtx)
				if runCtx.Err() != nil {
					return
				}
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					stop()
					return
				}
				if measuring.Load() {
					n.Add(1)
					mine = append(mine, time.Since(t0))
				}
			}
		}()
	}
	select {
	case <-time.After(s.cfg.Warmup):
	case <-runCtx.Done():
	}
	cpu0, err := procCPU(pid)
	if err != nil {
		stop()
		wg.Wait()
		return gatewaySample{}, err
	}
	begin := time.Now()
	measuring.Store(true)
	select {
	case <-time.After(s.cfg.Duration):
	case <-runCtx.Done():
	}
	measuring.Store(false)
	elapsed := time.Since(begin)
	cpu1, err := procCPU(pid)
	stop()
	wg.Wait()
	if firstErr != nil {
		return gatewaySample{}, firstErr
	}
	if err != nil {
		return gatewaySample{}, err
	}
	if len(lat) == 0 {
		return gatewaySample{}, errors.New("no decision in the measured window")
	}
	slices.Sort(lat)
	d := n.Load()
	return gatewaySample{Clients: clients, Decisions: d, PerS: float64(d) / elapsed.Seconds(),
		CPUUS: float64((cpu1 - cpu0).Microseconds()) / float64(d),
		P50MS: float64(lat[len(lat)/2]) / float64(time.Millisecond)}, nil
}

// retryUntil calls f until it succeeds or d has passed; it returns f's last error then.
func retryUntil(ctx context.Context, d time.Duration, f func(context.Context) error) error {
	deadline := time.Now().Add(d)
	for {
		err := f(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// renamedTree is benchTree's shape under other ids (prefix instead of "bench-").
func renamedTree(prefix string) []map[string]any {
	t := make([]map[string]any, len(benchTree))
	for i, a := range benchTree {
		c := map[string]any{}
		for k, v := range a {
			c[k] = v
		}
		c["id"] = strings.Replace(a["id"].(string), "bench-", prefix, 1)
		if p, ok := a["parent"].(string); ok {
			c["parent"] = strings.Replace(p, "bench-", prefix, 1)
		}
		t[i] = c
	}
	return t
}
