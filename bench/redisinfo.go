package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The bench reads Redis through its server-wide counters only (INFO cpu, memory,
// commandstats; DBSIZE), never through admission's key names: the layout may change, and
// what a deployment pays for is the server's work, whatever keys it touches. Other
// clients of the same Redis (tests running meanwhile) show in these counters as noise.

// redisInfo reads one INFO section as key → value.
func (s *stack) redisInfo(ctx context.Context, section string) (map[string]string, error) {
	raw, err := s.rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", section, err)
	}
	return parseInfo(raw), nil
}

func parseInfo(raw string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(raw, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// redisCPU is Redis's used CPU time (user + system) so far.
func (s *stack) redisCPU(ctx context.Context) (time.Duration, error) {
	info, err := s.redisInfo(ctx, "cpu")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, err := strconv.ParseFloat(info[k], 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		total += f
	}
	return time.Duration(total * float64(time.Second)), nil
}

// redisUsed is INFO memory's used_memory, in bytes, and DBSIZE.
func (s *stack) redisUsed(ctx context.Context) (used, keys int64, err error) {
	info, err := s.redisInfo(ctx, "memory")
	if err != nil {
		return 0, 0, err
	}
	if used, err = strconv.ParseInt(info["used_memory"], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("INFO memory used_memory: %w", err)
	}
	keys, err = s.rdb.DBSize(ctx).Result()
	return used, keys, err
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	Calls  float64 `json:"calls"`
	Usec   float64 `json:"usec"`
	Failed float64 `json:"failed_calls,omitempty"`
}

// commandStats reads INFO commandstats: command → its counters since the server started.
func (s *stack) commandStats(ctx context.Context) (map[string]cmdStat, error) {
	info, err := s.redisInfo(ctx, "commandstats")
	if err != nil {
		return nil, err
	}
	return parseCommandStats(info), nil
}

// parseCommandStats reads "cmdstat_evalsha" → "calls=3,usec=120,usec_per_call=40.00,
// rejected_calls=0,failed_calls=0".
func parseCommandStats(info map[string]string) map[string]cmdStat {
	out := map[string]cmdStat{}
	for k, v := range info {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var c cmdStat
		for _, kv := range strings.Split(v, ",") {
			f, val, _ := strings.Cut(kv, "=")
			n, err := strconv.ParseFloat(val, 64)
			if err != nil {
				continue
			}
			switch f {
			case "calls":
				c.Calls = n
			case "usec":
				c.Usec = n
			case "failed_calls":
				c.Failed = n
			}
		}
		out[name] = c
	}
	return out
}

// scriptCalls counts the script calls of a commandstats reading (EVAL, EVALSHA, FCALL
// and their read-only forms): however admission calls its script.
func scriptCalls(cs map[string]cmdStat) (calls, failed float64) {
	for _, name := range []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"} {
		calls += cs[name].Calls
		failed += cs[name].Failed
	}
	return calls, failed
}

// perUnit is the commandstats delta from before to after, divided by n (decisions or
// requests): which commands Redis ran for each, and the time its command code took.
func perUnit(before, after map[string]cmdStat, n float64) map[string]cmdStat {
	out := map[string]cmdStat{}
	for name, a := range after {
		b := before[name]
		if d := a.Calls - b.Calls; d > 0 && n > 0 {
			out[name] = cmdStat{Calls: round(d / n), Usec: round((a.Usec - b.Usec) / n), Failed: a.Failed - b.Failed}
		}
	}
	return out
}

// metrics scrapes the Prometheus text of the service at base: each metric name (labels
// dropped) → the sum of its samples.
func (s *stack) metrics(ctx context.Context, base string) (map[string]float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line+" ", "{ ")]
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			out[name] += f
		}
	}
	return out, sc.Err()
}

// metric is one metric of the service at base (see metrics); an error when absent.
func (s *stack) metric(ctx context.Context, base, name string) (float64, error) {
	m, err := s.metrics(ctx, base)
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("%s/metrics has no %s", base, name)
	}
	return v, nil
}

// outboxEmpty polls the node's metergate_outbox_length (every shard's outbox, read by the
// node itself) until its relay has moved every event to Kafka and trimmed the outbox.
func (s *stack) outboxEmpty(ctx context.Context, base string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n, err := s.metric(ctx, base, "metergate_outbox_length")
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%.0f events still in the outbox after %s", n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
