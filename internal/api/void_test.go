package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
	"github.com/metergate/metergate/internal/wire"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

// metric is the sum of the API's counters name with the labels given (0 when absent).
func (b *testBundle) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := b.reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// waitMetric polls the counter until it reaches want.
func (b *testBundle) waitMetric(t *testing.T, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.metric(t, name, labels) != want {
		require.True(t, time.Now().Before(deadline), "%s%v never reached %v", name, labels, want)
		time.Sleep(10 * time.Millisecond)
	}
}

// outboxEvents returns every event in every outbox stream of the bundle's Redis.
func (b *testBundle) outboxEvents(t *testing.T) []event.CloudEvent {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	var keys []string
	for _, pattern := range []string{"*:batches", "*:events"} { // keyspace.Keys.Outboxes
		ks, err := b.rdb.Keys(ctx, pattern).Result()
		require.NoError(t, err)
		keys = append(keys, ks...)
	}
	var out []event.CloudEvent
	for _, k := range keys {
		entries, err := b.rdb.XRange(ctx, k, "-", "+").Result()
		require.NoError(t, err)
		for _, e := range entries {
			_, value, err := wire.OutboxMessage(e.Values)
			require.NoError(t, err)
			var ev event.CloudEvent
			require.NoError(t, json.Unmarshal(value, &ev))
			out = append(out, ev)
		}
	}
	return out
}

// requireVoided checks the outbox once Redis ran everything: one usage.voided event of the
// reason, and no admitted event that it does not void.
func (b *testBundle) requireVoided(t *testing.T, reason string, mustHaveRun bool) {
	t.Helper()
	voided, admitted := map[string]bool{}, []string{}
	for _, ev := range b.outboxEvents(t) {
		switch ev.Type {
		case event.TypeVoided:
			var v event.Voided
			require.NoError(t, json.Unmarshal(ev.Data, &v))
			require.Equal(t, reason, v.Reason)
			voided[v.EventID] = true
		case event.TypeAdmitted:
			admitted = append(admitted, ev.ID)
		}
	}
	require.Len(t, voided, 1, "one void")
	if mustHaveRun {
		require.Len(t, admitted, 1, "the script call whose answer was lost ran")
	}
	for _, id := range admitted {
		require.True(t, voided[id], "admitted event %s is voided", id)
	}
}

// privateRedis starts a Redis server of the test's own: a stall would slow every test
// sharing the stack's.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(private.StartRedis(t).URL())
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// admitAndHangUp sends an admission for account and hangs up after wait, unanswered.
func (b *testBundle) admitAndHangUp(t *testing.T, account string, wait time.Duration) {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"account": account})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/admit", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+serviceToken)
	_, err = http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller hung up before any answer")
}

// stall makes the bundle's (private) Redis busy for d and returns when the stall has begun.
func (b *testBundle) stall(t *testing.T, d time.Duration) <-chan error {
	t.Helper()
	done, err := private.StallRedis(testenv.Context(t, 10*time.Second), b.rdb.(*redis.Client).Options(), d)
	require.NoError(t, err)
	return done
}

// replyDropper is a TCP proxy to a Redis server that, while drop is set, passes commands on
// and throws the replies away: a script runs, and its caller never hears of it (a reply
// lost in a network partition or a failover).
type replyDropper struct {
	addr string
	drop atomic.Bool
}

func newReplyDropper(t *testing.T, redisAddr string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	p := &replyDropper{addr: ln.Addr().String()}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", redisAddr)
			if err != nil {
				_ = client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); _ = server.Close() }()
			go func() {
				defer client.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 && !p.drop.Load() {
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// A script call whose reply is lost ran all the same: its decision was taken, and the
// request, answered 503, is voided so that it bills nothing.
func TestTimedOutCallIsVoided(t *testing.T) {
	t.Parallel()
	redisAddr := private.StartRedis(t).Addr()
	proxy := newReplyDropper(t, redisAddr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	b := setup(t, setupOpts{rdb: rdb})
	org := b.id("acme")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"}) // a monthly quota: fail closed
	b.waitResolvable(t, org)

	// The script is cached: with the reply of EVALSHA's NOSCRIPT lost, nothing would run.
	for _, script := range []*redis.Script{lua.Admit, lua.Void} {
		require.NoError(t, script.Load(testenv.Context(t, 10*time.Second), rdb).Err())
	}
	proxy.drop.Store(true)
	rep := b.admit(t, map[string]any{"account": org})
	proxy.drop.Store(false)
	require.Equal(t, http.StatusServiceUnavailable, rep.Status, rep.Raw)
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_fail_closed_total", nil))
	b.waitMetric(t, "metergate_admit_voids_total", map[string]string{"reason": "unavailable"}, 1)
	require.Zero(t, b.metric(t, "metergate_admit_voids_total", map[string]string{"via": "kafka"}), "redis took it")
	b.requireVoided(t, event.VoidUnavailable, true)
}

// A caller that hangs up while its decision waits for Redis is not a Redis outage: it is
// counted as abandoned, nothing is written fail-open, and the decision (taken once Redis is
// free) is voided.
func TestCallerHangingUpIsVoidedNotAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{rdb: privateRedis(t), recorder: true})
	org := b.id("rates")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 100, "burst": 100}}}) // fail open
	b.waitResolvable(t, org)

	done := b.stall(t, 1500*time.Millisecond)
	b.admitAndHangUp(t, org, 200*time.Millisecond)
	require.NoError(t, <-done)

	b.waitMetric(t, "metergate_admit_voids_total", map[string]string{"reason": "caller_gone"}, 1)
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_abandoned_total", nil))
	require.Zero(t, b.metric(t, "metergate_admit_fail_open_total", nil), "not a Redis outage")
	require.Zero(t, b.metric(t, "metergate_admit_fail_closed_total", nil), "not a Redis outage")
	b.requireVoided(t, event.VoidCallerGone, true)
}

// silentRedis is a client of a server that takes connections and commands and never
// answers: every call is sent, and times out.
func silentRedis(t *testing.T) *redis.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A void Redis does not take is retried in the background; when admit stops, it goes
// straight to Kafka instead of being lost.
func TestPendingVoidGoesToKafkaOnClose(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{rdb: silentRedis(t), recorder: true})
	org := b.id("quota")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)

	r := b.admit(t, map[string]any{"account": org})
	require.Equal(t, http.StatusServiceUnavailable, r.Status, r.Raw)
	require.Zero(t, b.metric(t, "metergate_admit_voids_total", nil), "redis took nothing")
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_voids_pending", nil))
	require.NoError(t, b.srv.Close(testenv.Context(t, 10*time.Second)))
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_voids_total", map[string]string{"reason": "unavailable", "via": "kafka"}))
	require.Zero(t, b.metric(t, "metergate_admit_voids_pending", nil))

	ev := b.recorded(t, org)
	require.Equal(t, event.TypeVoided, ev.Type)
	var v event.Voided
	require.NoError(t, json.Unmarshal(ev.Data, &v))
	require.Equal(t, event.Voided{EventID: v.Attempt, Attempt: v.Attempt, Reason: event.VoidUnavailable}, v)
	require.Equal(t, v.EventID+event.VoidSuffix, ev.ID)
}

// lateRecorder records an event only once the caller has hung up: a fail-open write that
// completes as the caller goes.
type lateRecorder struct{ api.Recorder }

func (l lateRecorder) Record(ctx context.Context, key string, ev event.CloudEvent) error {
	<-ctx.Done()
	return l.Recorder.Record(context.WithoutCancel(ctx), key, ev)
}

// A fail-open admission whose caller hung up while its event was written to Kafka is
// voided: its event is in Kafka though Redis never saw the request.
func TestFailOpenCallerGoneIsVoided(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{rdb: deadRedis(t), recorder: true,
		wrapRecorder: func(r api.Recorder) api.Recorder { return lateRecorder{r} }})
	org := b.id("rates")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "enterprise"}) // rate-only: fails open
	b.waitResolvable(t, org)

	b.admitAndHangUp(t, org, 200*time.Millisecond)

	b.waitMetric(t, "metergate_admit_voids_pending", nil, 1)
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_abandoned_total", nil))
	require.Zero(t, b.metric(t, "metergate_admit_fail_open_total", nil), "nobody was told")
	require.NoError(t, b.srv.Close(testenv.Context(t, 10*time.Second)))

	admitted := b.recorded(t, org)
	require.Equal(t, event.TypeAdmitted, admitted.Type)
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: testenv.KafkaBrokers(t), Topic: b.topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rd.Close() })
	require.NoError(t, rd.SetOffset(1))
	msg, err := rd.ReadMessage(testenv.Context(t, time.Minute))
	require.NoError(t, err)
	var void event.CloudEvent
	require.NoError(t, json.Unmarshal(msg.Value, &void))
	require.Equal(t, admitted.ID+event.VoidSuffix, void.ID, "the fail-open event is voided")
}
