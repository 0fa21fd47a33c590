package chaos_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/internal/testenv/private"
)

// Scenarios 2, 4 and 5: a service of the pipeline (Kafka, PostgreSQL, Redis) stopped and
// started again under load. Each stack gets a private server of that service (its own
// process, its own port) so that the outage touches no other test.

// enterpriseRate is the limits of an account without a quota (the enterprise plan's
// requests quota is uncapped) whose rate limit never gets in the way of the load.
var enterpriseRate = map[string]any{"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000}}

// Scenario 2: the Kafka broker stopped (a controlled shutdown) for 30 s (5 s in the short
// form) during a load, then started again. Admission does not depend on Kafka: it writes
// the event into the Redis outbox with the decision, so callers keep getting 200s while the
// broker is down; the relay retries and sends the backlog when the broker is back.
func TestBrokerStopped(t *testing.T) {
	t.Parallel()
	sc := begin(t, "2 Kafka broker stopped")
	broker := private.StartBroker(t)
	s := newStack(t, options{Brokers: []string{broker.Addr()}})
	keys := []string{s.account("chaos-org", "org", "", "enterprise", enterpriseRate),
		s.account("chaos-team", "team", "chaos-org", "", map[string]any{})}
	outage := pick(5*time.Second, 30*time.Second)

	l := s.startLoad(loadSpec{Workers: 8, Keys: keys, Retry5xx: true, Deadline: 6 * time.Minute}, 400)
	l.waitAdmitted(t, 200, 2*time.Minute)
	broker.Stop()
	down := time.Now()
	time.Sleep(outage) // the outage itself, with the load going on
	up := time.Now()
	broker.Start()
	l.waitAdmitted(t, l.admitted.Load()+200, 2*time.Minute) // and a load after it
	res, answers := l.finish(t)

	whileDown := 0
	for _, a := range answers {
		if a.status == 200 && !a.sent.Before(down) && !a.answered.After(up) {
			whileDown++
		}
	}
	b := s.waitBooks(4*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("broker down %s; %d requests sent and answered 200 while it was down (%.0f/s); final answers %v",
		outage, whileDown, float64(whileDown)/outage.Seconds(), res.Status)
	// At least 5 admissions a second through the outage: admission never waits for Kafka.
	require.GreaterOrEqual(t, whileDown, int(5*outage.Seconds()), "admissions answered 200 while the broker was down")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted")
	require.Zero(t, res.FiveXX, "5xx")
	b.requireExact(t, res.Requests)
}

// Scenario 4: PostgreSQL stopped (pg_ctl stop -m immediate: a crash) under load, kept down
// 10 s (3 s in the short form), started again. Admit decides from its policy cache (its
// /readyz reports postgres as degraded and answers 200); the meter retries its batch until
// PostgreSQL is back.
func TestPostgresRestarted(t *testing.T) {
	t.Parallel()
	sc := begin(t, "4 PostgreSQL restarted")
	pg := private.StartPostgres(t)
	s := newStack(t, options{DatabaseURL: pg.URL()})
	keys := []string{s.account("chaos-org", "org", "", "enterprise", enterpriseRate),
		s.account("chaos-team", "team", "chaos-org", "", map[string]any{})}
	outage := pick(3*time.Second, 10*time.Second)
	ctx := testenv.Context(t, 10*time.Minute)

	l := s.startLoad(loadSpec{Workers: 8, Keys: keys, Retry5xx: true, Deadline: 6 * time.Minute}, 400)
	l.waitAdmitted(t, 200, 2*time.Minute)
	pg.Kill()
	down := time.Now()
	// While it is down: admit is ready, degraded (postgres failing); the meter is not ready.
	readyz, err := testenv.WaitHTTP(ctx, s.admits[0].URL()+"/readyz", 200)
	require.NoError(t, err)
	require.Contains(t, readyz, `"status":"degraded"`, "admit /readyz while PostgreSQL is down")
	require.Contains(t, readyz, `{"name":"postgres","ok":false`, "admit /readyz while PostgreSQL is down")
	meterReady, err := testenv.WaitHTTP(ctx, s.meters[0].URL()+"/readyz", 503)
	require.NoError(t, err, "meter /readyz while PostgreSQL is down")
	time.Sleep(time.Until(down.Add(outage)))
	up := time.Now()
	pg.Start()
	l.waitAdmitted(t, l.admitted.Load()+200, 2*time.Minute)
	res, answers := l.finish(t)

	whileDown := 0
	for _, a := range answers {
		if a.status == 200 && !a.sent.Before(down) && !a.answered.After(up) {
			whileDown++
		}
	}
	b := s.waitBooks(4*time.Minute, res)
	sc.fill(b, res)
	sc.Note = fmt.Sprintf("PostgreSQL down %s (stop -m immediate); %d admitted while it was down; admit /readyz 200 degraded, meter /readyz 503 while down; final answers %v",
		outage, whileDown, res.Status)
	require.Contains(t, firstCheck(meterReady, "postgres"), `"ok":false`, "meter /readyz while PostgreSQL is down: %s", meterReady)
	require.GreaterOrEqual(t, whileDown, int(5*outage.Seconds()), "admissions answered 200 while PostgreSQL was down")
	require.Equal(t, res.Requests, res.Status[200], "every request is admitted")
	require.Zero(t, res.FiveXX, "5xx")
	b.requireExact(t, res.Requests)
}

// Scenario 5: Redis killed and started again empty (no persistence). Two orgs: one without a
// quota (a rate limit only) and one with a monthly requests quota. While Redis is down the
// rate-only org is admitted fail-open (its events go straight to Kafka) and the quota org
// gets 503: those 503s are the scenario's 5xx column, by design. After Redis is back, the
// books hold every admitted id once, and reconcile restores the wiped quota counters from
// PostgreSQL (`reconcile verify` then passes).
//
// Redis is killed once the outbox is drained (every admission so far in PostgreSQL): an
// entry still in the outbox when a Redis without persistence dies is gone with it, which
// is what Redis persistence (AOF) is for, not what this scenario measures.
func TestRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	sc := begin(t, "5 Redis restarted empty")
	rs := private.StartRedis(t)
	s := newStack(t, options{RedisURL: rs.URL()})
	rateOnly := s.account("chaos-rate", "org", "", "enterprise", enterpriseRate)
	quota := s.account("chaos-quota", "org", "", "enterprise", map[string]any{
		"requests": map[string]any{"rate_per_s": 1_000_000, "burst": 1_000_000, "quota": 100_000_000}})
	keys := []string{rateOnly, quota}
	outage := pick(4*time.Second, 15*time.Second)
	requests := pick(400, 4_000)

	before := s.load(loadSpec{Requests: requests, Workers: 8, Keys: keys, Deadline: 3 * time.Minute})
	require.Equal(t, requests, before.Status[200], "before the outage every request is admitted: %v", before.Status)
	drained := s.waitBooks(2*time.Minute, before)
	require.Zero(t, drained.Lost, "the outbox is drained before Redis is killed")

	rs.Stop()
	l := s.startLoad(loadSpec{Workers: 8, Keys: keys, Deadline: 3 * time.Minute}, 400)
	time.Sleep(outage) // the outage, with the load going on
	during, answers := l.finish(t)
	rs.Start()
	// Admit's Redis client refuses new connections for a moment after its dials failed
	// (go-redis backs off): the quota org would still get 503s. Wait until admit's /readyz
	// reports its Redis check ok again, and measure how long that took.
	restarted := time.Now()
	ctx := testenv.Context(t, 2*time.Minute)
	for {
		body, err := testenv.WaitHTTP(ctx, s.admits[0].URL()+"/readyz", 200)
		require.NoError(t, err)
		if strings.Contains(body, `{"name":"redis","ok":true`) {
			break
		}
		require.Less(t, time.Since(restarted), 2*time.Minute, "admit's /readyz still reports redis failing: %s", body)
		time.Sleep(20 * time.Millisecond)
	}
	recovered := time.Since(restarted)
	after := s.load(loadSpec{Requests: requests, Workers: 8, Keys: keys, Deadline: 3 * time.Minute})

	byKey := [2]map[int]int{{}, {}}
	for _, a := range answers {
		byKey[a.key][a.status]++
	}
	b := s.waitBooks(3*time.Minute, before, during, after)
	sc.fill(b, before, during, after)
	code, out := s.reconcile(nil)
	verifyCode, verifyOut := s.reconcile(nil, "verify")
	drift := -1 // counters reconcile found below their billable total: the wiped ones
	if m := regexp.MustCompile(`drift_found=(\d+)`).FindStringSubmatch(out); m != nil {
		drift, _ = strconv.Atoi(m[1])
	}
	sc.Note = fmt.Sprintf("Redis down %s: rate-only org %v (fail-open), quota org %v; the %d 5xx are the quota org's 503s "+
		"while Redis was down, by design; admit's redis check ok %s after the restart; after it %v; reconcile exit %d (drift_found=%d), verify exit %d",
		outage, byKey[0], byKey[1], sc.FiveXX, recovered.Round(time.Millisecond), after.Status, code, drift, verifyCode)

	require.Positive(t, byKey[0][200], "the rate-only org is admitted (fail-open) while Redis is down")
	require.Equal(t, byKey[0][200], sumCounts(byKey[0]), "every request of the rate-only org is admitted while Redis is down")
	require.Positive(t, byKey[1][503], "the quota org gets 503 while Redis is down")
	require.Equal(t, byKey[1][503], sumCounts(byKey[1]), "every request of the quota org gets 503 while Redis is down")
	require.Equal(t, requests, after.Status[200], "after the restart every request is admitted: %v", after.Status)
	require.Equal(t, byKey[1][503], sc.FiveXX, "the 5xx are exactly the quota org's requests while Redis was down")
	// The fail-open rows too (written to Kafka by admit itself) hold what their callers sent.
	b.requireExact(t, len(before.Admitted)+len(during.Admitted)+len(after.Admitted))
	require.Equal(t, 0, code, "reconcile:\n%s", out)
	require.Positive(t, drift, "reconcile restored the wiped counters (drift_found):\n%s", out)
	require.Equal(t, 0, verifyCode, "reconcile verify:\n%s", verifyOut)
}

func sumCounts(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// firstCheck returns the JSON object of the named check in a /readyz body (or the body).
func firstCheck(body, name string) string {
	i := strings.Index(body, `{"name":"`+name+`"`)
	if i < 0 {
		return body
	}
	j := strings.Index(body[i:], "}")
	if j < 0 {
		return body[i:]
	}
	return body[i : i+j+1]
}

// answer is the final answer to one request of a running load.
type answer struct {
	key            int       // index in the load's Keys
	status         int       // HTTP status
	sent, answered time.Time // when the attempt that got this answer was sent, and answered
}

// runningLoad is a load that runs until finish: the callers of s.load, each request with its
// own idempotency key, for as long as a fault takes rather than a number of requests.
type runningLoad struct {
	admitted atomic.Int64 // requests answered 200 so far
	stop     chan struct{}
	halt     func() // closes stop, once
	wg       sync.WaitGroup
	errs     chan error

	mu      sync.Mutex
	res     *loadResult
	answers []answer
}

// startLoad starts spec's Workers callers (Requests, Progress unused) over spec.Keys and
// the stack's admit nodes, together at most perSecond requests a second (no bound when 0);
// they go on until finish. Network errors and 503 policies_loading are retried with the
// same idempotency key, 5xx when spec.Retry5xx.
func (s *stack) startLoad(spec loadSpec, perSecond int) *runningLoad {
	s.t.Helper()
	if spec.Deadline == 0 {
		spec.Deadline = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), spec.Deadline)
	run := testenv.Random(8)
	urls := s.admitURLs()
	l := &runningLoad{stop: make(chan struct{}), errs: make(chan error, spec.Workers),
		res: &loadResult{Admitted: map[string]string{}, Status: map[int]int{}}}
	l.halt = sync.OnceFunc(func() { close(l.stop) })
	s.t.Cleanup(l.halt) // a test that failed half-way stops its callers
	var (
		next atomic.Int64
		tick <-chan time.Time
	)
	if perSecond > 0 {
		ticker := time.NewTicker(time.Second / time.Duration(perSecond))
		s.t.Cleanup(ticker.Stop)
		tick = ticker.C
	}
	for w := range spec.Workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				if tick != nil {
					select {
					case <-l.stop:
						return
					case <-tick:
					}
				}
				i := int(next.Add(1)) - 1
				req := spec.request(run, i)
				status, out, sent, err := admitAnswered(ctx, urls, (w+i)%len(urls), req.body(), spec.Retry5xx, func() {
					l.mu.Lock()
					l.res.FiveXX++
					l.mu.Unlock()
				})
				if err != nil {
					l.errs <- fmt.Errorf("request %d: %w", i, err)
					return
				}
				answered := time.Now()
				l.mu.Lock()
				l.res.Requests++
				l.res.record(req, status, out)
				l.answers = append(l.answers, answer{key: i % len(spec.Keys), status: status, sent: sent, answered: answered})
				l.mu.Unlock()
				if status == 200 {
					l.admitted.Add(1)
				}
			}
		}()
	}
	go func() { l.wg.Wait(); cancel() }()
	return l
}

// waitAdmitted waits (up to within) until n requests of the load were answered 200.
func (l *runningLoad) waitAdmitted(t *testing.T, n int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for l.admitted.Load() < n {
		select {
		case err := <-l.errs:
			l.halt()
			t.Fatalf("load: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			l.halt()
			l.mu.Lock()
			status := fmt.Sprint(l.res.Status)
			l.mu.Unlock()
			t.Fatalf("the load had %d of %d requests admitted after %s (answers %s)", l.admitted.Load(), n, within, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finish stops the load (requests under way get their answers), waits for its callers and
// returns what they saw, answers in the order they arrived.
func (l *runningLoad) finish(t *testing.T) (*loadResult, []answer) {
	t.Helper()
	l.halt()
	l.wg.Wait()
	close(l.errs)
	for err := range l.errs {
		require.NoError(t, err)
	}
	return l.res, l.answers
}
