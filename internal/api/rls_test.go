package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/testenv"
	"github.com/metergate/metergate/pkg/event"
)

// withToken is ctx carrying the bearer token as gRPC metadata.
func withToken(ctx context.Context, token string) context.Context {
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// desc is one descriptor of key/value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits is d with a hits_addend.
func hits(d *commonv3.RateLimitDescriptor, n uint64) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (b *testBundle) should(t *testing.T, token string, descs ...*commonv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(withToken(context.Background(), token), 30*time.Second)
	defer cancel()
	return b.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "metergate", Descriptors: descs})
}

func (b *testBundle) mustShould(t *testing.T, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := b.should(t, serviceToken, descs...)
	require.NoError(t, err)
	require.Len(t, resp.GetStatuses(), len(descs), "a status per descriptor")
	return resp
}

// headers are the response headers the answer adds.
func headers(resp *rlsv3.RateLimitResponse) http.Header {
	h := http.Header{}
	for _, v := range resp.GetResponseHeadersToAdd() {
		h.Add(v.GetKey(), v.GetValue())
	}
	return h
}

// rlsEventID is the event id the answer adds to the upstream request.
func rlsEventID(resp *rlsv3.RateLimitResponse) string {
	for _, v := range resp.GetRequestHeadersToAdd() {
		if strings.EqualFold(v.GetKey(), "x-metergate-event-id") {
			return v.GetValue()
		}
	}
	return ""
}

// rlsBody is the raw_body of a refusal, decoded.
func rlsBody(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(resp.GetRawBody(), &m), "raw_body %q", resp.GetRawBody())
	return m
}

// httpStatus is the HTTP status of admit's reply, from the answer's dynamic metadata.
func httpStatus(resp *rlsv3.RateLimitResponse) int {
	return int(resp.GetDynamicMetadata().GetFields()["http_status"].GetNumberValue())
}

// The seeds' free key (burst 20, 10/s) fires 30 calls at once: about 20 OK, the rest
// OVER_LIMIT with Retry-After, the RateLimit fields, each descriptor's limit and the 429
// body; every OK names its event for the upstream.
func TestRLSFreeBurst(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("free")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "free"})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	var mu sync.Mutex
	var ok, over []*rlsv3.RateLimitResponse
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := b.should(t, serviceToken, desc("generic_key", "api"), desc("api_key", key))
			mu.Lock()
			defer mu.Unlock()
			if !assertNoError(t, err) {
				return
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok = append(ok, resp)
			} else {
				over = append(over, resp)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.Equal(t, 30, len(ok)+len(over))
	// 10/s refill: a slow machine may refill one or two tokens while the 30 are in flight.
	require.GreaterOrEqual(t, len(ok), 20)
	require.LessOrEqual(t, len(ok), 22)
	for _, resp := range ok {
		require.NotEmpty(t, rlsEventID(resp), "an OK names its event")
		require.Regexp(t, `;r=\d+;t=\d+`, headers(resp).Get("RateLimit"))
		require.Empty(t, resp.GetRawBody())
	}
	for _, resp := range over {
		require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
		h := headers(resp)
		retry, err := strconv.Atoi(h.Get("Retry-After"))
		require.NoError(t, err, "Retry-After in %v", h)
		require.GreaterOrEqual(t, retry, 1)
		require.Contains(t, h.Get("RateLimit-Policy"), `"`+org+`-requests";q=20;w=2`)
		require.Contains(t, h.Get("RateLimit"), `"`+org+`-requests";r=0;t=`)
		require.Equal(t, "application/json", h.Get("Content-Type"))
		require.Empty(t, rlsEventID(resp), "a refusal names no event")
		require.Equal(t, http.StatusTooManyRequests, httpStatus(resp))
		require.Equal(t, "rate_limited", resp.GetDynamicMetadata().GetFields()["code"].GetStringValue())
		m := rlsBody(t, resp)
		require.Equal(t, "rate_limited", m["decision"])
		require.Equal(t, map[string]any{"account": org, "level": "org", "unit": "requests"}, m["blocked_by"])
		require.Len(t, resp.GetStatuses(), 2)
		for _, st := range resp.GetStatuses() {
			require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, st.GetCode())
			require.Equal(t, org+"-requests", st.GetCurrentLimit().GetName())
			// 20 per 2 s: the bucket's burst and the time it takes to fill.
			require.Equal(t, uint32(20), st.GetCurrentLimit().GetRequestsPerUnit())
			require.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, st.GetCurrentLimit().GetUnit())
			require.Equal(t, uint32(2), st.GetCurrentLimit().GetUnitMultiplier().GetValue())
			require.Zero(t, st.GetLimitRemaining())
			require.Positive(t, st.GetDurationUntilReset().AsDuration())
		}
	}
}

// assertNoError is require.NoError for goroutines other than the test's: it reports and
// returns whether err is nil.
func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// A spent quota is OVER_LIMIT with admit's 402 body, and the quota as each descriptor's
// limit; unknown and revoked credentials are OVER_LIMIT with the 401/403 body, whatever
// Envoy's failure_mode_deny says.
func TestRLSQuotaAndCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("quota")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"requests": map[string]any{"quota": 2}}})
	b.waitResolvable(t, org)
	for range 2 {
		resp := b.mustShould(t, desc("account", org))
		require.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode(), "%s", resp.GetRawBody())
	}
	resp := b.mustShould(t, desc("account", org))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
	require.Equal(t, http.StatusPaymentRequired, httpStatus(resp))
	m := rlsBody(t, resp)
	require.Equal(t, "quota_exceeded", m["decision"])
	require.Equal(t, map[string]any{"account": org, "level": "org", "unit": "requests"}, m["blocked_by"])
	st := resp.GetStatuses()[0]
	require.Equal(t, org+"-requests-quota", st.GetCurrentLimit().GetName())
	require.Equal(t, uint32(2), st.GetCurrentLimit().GetRequestsPerUnit())
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MONTH, st.GetCurrentLimit().GetUnit())
	require.Zero(t, st.GetLimitRemaining())
	require.Contains(t, headers(resp).Get("RateLimit"), `"`+org+`-requests-quota";r=0;t=`)

	for _, tc := range []struct {
		name, key, value string
		status           int
		code             string
	}{
		{"unknown api key", "api_key", "mgk_unknown", 401, "unknown_api_key"},
		{"api key too long to be one", "api_key", strings.Repeat("k", 300), 401, "unknown_api_key"},
		{"unknown account", "account", b.id("ghost"), 401, "unknown_account"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := b.mustShould(t, desc(tc.key, tc.value))
			require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
			require.Equal(t, tc.status, httpStatus(resp))
			require.Equal(t, tc.code, rlsBody(t, resp)["error"].(map[string]any)["code"])
		})
	}
}

// The service token comes from the gRPC metadata: none or a wrong one is Unauthenticated,
// the admin token PermissionDenied.
func TestRLSServiceToken(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	for _, tc := range []struct {
		name, token string
		code        codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"wrong token", "not-the-token-0123456789", codes.Unauthenticated},
		{"admin token", adminToken, codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.should(t, tc.token, desc("account", "whoever"))
			require.Equal(t, tc.code, status.Code(err), "%v", err)
		})
	}
}

// usage is GET /v1/usage's used units of account.
func (b *testBundle) usage(t *testing.T, account string) map[string]float64 {
	t.Helper()
	r := b.call(t, "GET", "/v1/usage/"+account, serviceToken, nil)
	require.Equal(t, 200, r.Status, r.Raw)
	used := map[string]float64{}
	for u, v := range r.Body["units"].(map[string]any) {
		used[u] = v.(map[string]any)["used"].(float64)
	}
	return used
}

// All the descriptors of a call are one admission: a call whose second descriptor would
// refuse (a tool past the credits quota) charges nothing for the first; the hits of two
// descriptors are the request's tokens once, not twice; two accounts in one call are
// refused.
func TestRLSDescriptorsAreOneAdmission(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("atomic")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{
		"requests": map[string]any{"quota": 100}, "tokens": map[string]any{"quota": 10_000}, "credits": map[string]any{"quota": 5}}})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	resp := b.mustShould(t, hits(desc("api_key", key), 300), hits(desc("api_key", key, "tool", "image_generate"), 300))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode(), "image_generate is 10 credits, over the 5")
	require.Equal(t, map[string]any{"account": org, "level": "org", "unit": "credits"}, rlsBody(t, resp)["blocked_by"])
	for _, st := range resp.GetStatuses() {
		require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, st.GetCode(), "every descriptor is refused with the call")
	}
	require.Equal(t, map[string]float64{"requests": 0, "tokens": 0, "credits": 0}, b.usage(t, org), "nothing charged")

	resp = b.mustShould(t, hits(desc("api_key", key), 300), hits(desc("api_key", key, "tool", "web_search"), 300))
	require.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode(), "%s", resp.GetRawBody())
	for _, st := range resp.GetStatuses() {
		require.Equal(t, rlsv3.RateLimitResponse_OK, st.GetCode())
	}
	require.Equal(t, map[string]float64{"requests": 1, "tokens": 300, "credits": 1}, b.usage(t, org), "one admission")

	other := b.id("other")
	b.account(t, map[string]any{"id": other, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, other)
	_, err := b.should(t, serviceToken, desc("account", org), desc("account", other))
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), `two values of "account"`)
	require.Equal(t, map[string]float64{"requests": 1, "tokens": 300, "credits": 1}, b.usage(t, org))
}

// The call Envoy makes when the stream is done (apply_on_stream_done), carrying the event
// id added to the upstream request and the actual tokens, records the admitted event's
// outcome with them (in the outbox, for reconcile), and charges nothing.
func TestRLSStreamDoneRecordsTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("done")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"tokens": map[string]any{"quota": 1_000_000}}})
	key := b.apiKey(t, org)
	b.waitResolvable(t, org)

	first := b.mustShould(t, desc("generic_key", "api"), hits(desc("api_key", key), 500))
	require.Equal(t, rlsv3.RateLimitResponse_OK, first.GetOverallCode(), "%s", first.GetRawBody())
	id := rlsEventID(first)
	require.NotEmpty(t, id)

	done := b.mustShould(t, desc("generic_key", "api"), hits(desc("api_key", key, "event_id", id, "status", "200"), 1234))
	require.Equal(t, rlsv3.RateLimitResponse_OK, done.GetOverallCode())
	require.Empty(t, rlsEventID(done))
	require.Equal(t, map[string]float64{"requests": 1, "tokens": 500}, b.usage(t, org), "the outcome charged nothing")

	// The outcome event is in the outbox of the org's shard, for the relay and reconcile.
	require.Equal(t, []event.Outcome{{EventID: id, Status: 200, Units: map[string]int64{"tokens": 1234}}}, b.outcomes(t, org, id))

	_, err := b.should(t, serviceToken, hits(desc("api_key", key, "event_id", "0196a0c4-7b1e-7c3a-9f00-0123456789ab.999."+org), 1))
	require.Equal(t, codes.InvalidArgument, status.Code(err), "an event admit did not issue: %v", err)
}

// gRPC health checking answers SERVING for the server and the rate-limit service once the
// policies are loaded, and reflection lists the service.
func TestRLSHealthAndReflection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	ctx := testenv.Context(t, 30*time.Second)
	hc := healthpb.NewHealthClient(b.conn)
	for _, svc := range []string{"", api.RLSService} {
		for {
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			require.NoError(t, err)
			if r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				break
			}
			require.NoError(t, ctx.Err(), "%q never SERVING", svc)
			time.Sleep(10 * time.Millisecond)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(b.conn).ServerReflectionInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	r, err := stream.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	require.Contains(t, names, api.RLSService)
	require.Contains(t, names, "grpc.health.v1.Health")
	require.NoError(t, stream.CloseSend())
}

// Redis unavailable: the fail policy of POST /v1/admit. A quota-bearing account is
// OVER_LIMIT with the 503 body and Retry-After; a rate-only account is OK (fail-open,
// its event written straight to Kafka) and names its event.
func TestRLSRedisDown(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true, rdb: deadRedis(t), recorder: true})
	quota, rateOnly := b.id("quota"), b.id("rate-only")
	b.account(t, map[string]any{"id": quota, "kind": "org", "plan": "pro"})
	b.account(t, map[string]any{"id": rateOnly, "kind": "org", "plan": "enterprise"})
	b.waitResolvable(t, quota)
	b.waitResolvable(t, rateOnly)

	resp := b.mustShould(t, desc("account", quota))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, resp.GetOverallCode())
	require.Equal(t, http.StatusServiceUnavailable, httpStatus(resp))
	require.Equal(t, "unavailable", rlsBody(t, resp)["error"].(map[string]any)["code"])
	require.Equal(t, "1", headers(resp).Get("Retry-After"))

	resp = b.mustShould(t, hits(desc("account", rateOnly), 42))
	require.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode(), "%s", resp.GetRawBody())
	id := rlsEventID(resp)
	require.NotEmpty(t, id)
	ev := b.recorded(t, rateOnly)
	require.Equal(t, id, ev.ID)
	var data event.Admitted
	require.NoError(t, json.Unmarshal(ev.Data, &data))
	require.True(t, data.FailOpen)
	require.Equal(t, int64(42), data.Units["tokens"])
}

// Bad calls are InvalidArgument with a message naming the problem; nothing is charged.
func TestRLSBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{grpc: true})
	org := b.id("bad")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro"})
	b.waitResolvable(t, org)
	neg := desc("account", org)
	neg.IsNegativeHits = true
	override := desc("account", org)
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		msg  string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org)}}, "domain is empty"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "d"}, "no descriptors"},
		{"descriptor without entries", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{}}}, "no entries"},
		{"unknown key", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "remote_address", "10.0.0.1")}}, `unknown entry key "remote_address"`},
		{"entry without key", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "", "x")}}, "without a key"},
		{"empty value", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", "")}}, `"account" is empty`},
		{"huge descriptor hits", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{hits(desc("account", org), 1<<63)}}, "is over 1000000000"},
		{"huge request hits", &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 1 << 31, Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org)}}, "is over 1000000000"},
		{"different hits", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{hits(desc("account", org), 1), hits(desc("account", org), 2)}}, "different hits_addend"},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{neg}}, "negative hits"},
		{"limit override", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{override}}, "overrides the limit"},
		{"no credentials", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("generic_key", "x")}}, `neither "api_key" nor "account"`},
		{"both credentials", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "api_key", "k")}}, "not both"},
		{"bad account", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", "-x")}}, "must be 1-64"},
		{"bad idempotency key", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "idempotency_key", "a b")}}, "printable ASCII"},
		{"unknown tool", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "tool", "teleport")}}, `unknown tool "teleport"`},
		{"status without event", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org, "status", "200")}}, "stream-done call"},
		{"bad status", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("event_id", "x", "status", "42")}}, "HTTP status code"},
		{"long event id", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("event_id", strings.Repeat("e", 129))}}, "longer than 128"},
		{"malformed event id", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("event_id", "x")}}, "not issued by admit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(withToken(context.Background(), serviceToken), 30*time.Second)
			defer cancel()
			_, err := b.client.ShouldRateLimit(ctx, tc.req)
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.msg)
		})
	}
	require.Equal(t, map[string]float64{"requests": 0}, b.usage(t, org), "nothing charged")
}

// The mapping is configurable, and checked: entries must be distinct and the unit known.
func TestRLSMapping(t *testing.T) {
	t.Parallel()
	require.NoError(t, api.DefaultRLS.Validate())
	m := api.DefaultRLS
	m.Tool = m.APIKey
	require.ErrorContains(t, m.Validate(), `the tool entry "api_key" is the api key entry too`)
	m = api.DefaultRLS
	m.Hits = "gpus"
	require.ErrorContains(t, m.Validate(), `unknown hits unit "gpus"`)
	m = api.DefaultRLS
	m.Ignore = []string{"account"}
	require.ErrorContains(t, m.Validate(), `the ignored entry "account" is the account entry`)

	m = api.DefaultRLS
	m.Account, m.Hits, m.Ignore = "tenant", "cost_micros", []string{"*"}
	b := setup(t, setupOpts{grpc: true, rls: &m})
	org := b.id("mapped")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro", "limits": map[string]any{"cost_micros": map[string]any{"quota": 1000}}})
	b.waitResolvable(t, org)
	resp, err := b.client.ShouldRateLimit(withToken(testenv.Context(t, 30*time.Second), serviceToken),
		&rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 7, Descriptors: []*commonv3.RateLimitDescriptor{desc("tenant", org, "anything", "ignored")}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode(), "%s", resp.GetRawBody())
	require.Equal(t, map[string]float64{"requests": 1, "cost_micros": 7}, b.usage(t, org), "the request's hits_addend, in the configured unit")
}

// Envoy going away while its decision waits for Redis: the decision is voided (as for
// /v1/admit), counted as abandoned, and the call ends CANCELED, never a crash; the service
// answers the next call.
func TestRLSCallerGoneIsVoided(t *testing.T) {
	t.Parallel()
	codesSeen := make(chan codes.Code, 4)
	record := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		codesSeen <- status.Code(err)
		return resp, err
	}
	b := setup(t, setupOpts{rdb: privateRedis(t), recorder: true, grpc: true,
		grpcOptions: []grpc.ServerOption{grpc.UnaryInterceptor(record)}})
	org := b.id("gone")
	b.account(t, map[string]any{"id": org, "kind": "org", "plan": "pro",
		"limits": map[string]any{"requests": map[string]any{"rate_per_s": 100, "burst": 100}}})
	b.waitResolvable(t, org)
	client := b.client
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("account", org)}}

	done := b.stall(t, 1500*time.Millisecond)
	hangUp, stop := context.WithTimeout(withToken(context.Background(), serviceToken), 200*time.Millisecond)
	_, err := client.ShouldRateLimit(hangUp, req)
	stop()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	require.Equal(t, codes.Canceled, <-codesSeen, "the server's answer to a caller gone")
	require.NoError(t, <-done)

	b.waitMetric(t, "metergate_admit_voids_total", map[string]string{"reason": "caller_gone"}, 1)
	require.EqualValues(t, 1, b.metric(t, "metergate_admit_abandoned_total", nil))
	require.Zero(t, b.metric(t, "metergate_admit_fail_open_total", nil), "not a Redis outage")
	b.requireVoided(t, event.VoidCallerGone, true)

	resp, err := client.ShouldRateLimit(withToken(testenv.Context(t, 30*time.Second), serviceToken), req)
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, resp.GetOverallCode(), "%s", resp.GetRawBody())
	require.Equal(t, codes.OK, <-codesSeen)
}
