package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/policy"
)

// Envoy's rate-limit service (envoy.service.ratelimit.v3.RateLimitService, docs/gateways.md):
// one ShouldRateLimit call is one admission, decided by decide like POST /v1/admit, and a
// call that names an admitted event (a rate limit applied when Envoy's stream is done) is
// its outcome, like POST /v1/outcomes.

// RLSService is the full name of Envoy's rate-limit service, as health checks name it.
const RLSService = "envoy.service.ratelimit.v3.RateLimitService"

// MaxHitsAddend is the largest hits_addend accepted: Envoy's own bound on a hits_addend it
// formats from the request (RateLimit.HitsAddend).
const MaxHitsAddend = 1_000_000_000

// rlsEventHeader carries the admitted event's id to the upstream (request_headers_to_add on
// OK); Envoy sends it back in the descriptors of the call made when the stream is done.
const rlsEventHeader = "x-metergate-event-id"

// RLS maps the descriptor entries of a ShouldRateLimit call to an admission. Every entry's
// key must be one of these or ignored (Ignore); an entry may repeat across the call's
// descriptors only with the same value.
type RLS struct {
	// APIKey, Account, Tool and IdempotencyKey name the entries that carry admit's api_key,
	// account, tool and idempotency_key (ADMIT_RLS_*_ENTRY).
	APIKey, Account, Tool, IdempotencyKey string
	// Event names the entry of the stream-done call that carries the admitted event id; a
	// call with it is an outcome, not an admission. Status names the entry that carries the
	// upstream's HTTP status in that call (200 when absent). Unit names an entry of a
	// stream-done descriptor saying which unit that descriptor's hits_addend counts (Hits
	// when absent), so that one outcome settles every unit the upstream reports.
	Event, Status, Unit string
	// Hits is the unit that hits_addend counts (ADMIT_RLS_HITS_UNIT, tokens by default);
	// every call counts one request besides, unless Hits is requests.
	Hits policy.Unit
	// Ignore lists entry keys that carry nothing for admit (e.g. generic_key); "*" ignores
	// every key not mapped.
	Ignore []string
}

// DefaultRLS is the mapping unless configured otherwise.
var DefaultRLS = RLS{
	APIKey: "api_key", Account: "account", Tool: "tool", IdempotencyKey: "idempotency_key",
	Event: "event_id", Status: "status", Unit: "unit", Hits: policy.Tokens, Ignore: []string{"generic_key"},
}

// Validate reports a mapping whose entries are empty or shared, or whose unit is unknown.
func (m RLS) Validate() error {
	var errs []error
	seen := map[string]string{}
	for _, f := range []struct{ name, key string }{{"api key", m.APIKey}, {"account", m.Account}, {"tool", m.Tool},
		{"idempotency key", m.IdempotencyKey}, {"event", m.Event}, {"status", m.Status}, {"unit", m.Unit}} {
		switch {
		case f.key == "":
			errs = append(errs, fmt.Errorf("the %s entry is empty", f.name))
		case seen[f.key] != "":
			errs = append(errs, fmt.Errorf("the %s entry %q is the %s entry too", f.name, f.key, seen[f.key]))
		default:
			seen[f.key] = f.name
		}
	}
	for _, k := range m.Ignore {
		if seen[k] != "" {
			errs = append(errs, fmt.Errorf("the ignored entry %q is the %s entry", k, seen[k]))
		}
	}
	if !m.Hits.Valid() {
		errs = append(errs, fmt.Errorf("unknown hits unit %q", m.Hits))
	}
	return errors.Join(errs...)
}

// rls serves ShouldRateLimit for a Server.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s         *Server
	m         RLS
	ignore    map[string]bool
	ignoreAll bool
}

// NewGRPCServer returns a gRPC server of Envoy's rate-limit service, mapped by m, with gRPC
// health checking and server reflection. The health server says NOT_SERVING until
// ServeGRPC sees the policies loaded.
func (s *Server) NewGRPCServer(m RLS, opts ...grpc.ServerOption) (*grpc.Server, *health.Server, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, fmt.Errorf("rate-limit service mapping: %w", err)
	}
	svc := &rls{s: s, m: m, ignore: map[string]bool{}}
	for _, k := range m.Ignore {
		svc.ignore[k] = true
		svc.ignoreAll = svc.ignoreAll || k == "*"
	}
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, svc)
	hs := health.NewServer()
	for _, name := range []string{"", RLSService} {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return g, hs, nil
}

// ServeGRPC serves g on lis until ctx ends, then stops it gracefully within shutdown (past
// it, calls still running are cut). hs turns SERVING once the policies are loaded, and
// NOT_SERVING when ctx ends.
func (s *Server) ServeGRPC(ctx context.Context, lis net.Listener, g *grpc.Server, hs *health.Server, shutdown time.Duration) error {
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for !s.cfg.Policies.Loaded() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		if ctx.Err() == nil {
			hs.Resume() // every registered service SERVING, unless Shutdown came first
		}
	}()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		hs.Shutdown()
		done := make(chan struct{})
		go func() { g.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(shutdown):
			g.Stop()
			<-done
		}
	}()
	err := g.Serve(lis)
	if ctx.Err() != nil {
		<-stopped
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve grpc: %w", err)
	}
	return nil
}

// rlsCall is a ShouldRateLimit request read through the mapping.
type rlsCall struct {
	in        admitInput
	eventID   string
	status    int
	hits      int64
	hitsGiven bool
	// units are the stream-done call's hits of descriptors that name their unit (RLS.Unit);
	// unitNamed: a descriptor named one.
	units     map[policy.Unit]int64
	unitNamed bool
}

// ShouldRateLimit takes the gate's decision for the call's descriptors, all together, as a
// Gateway door (a replayed idempotency key is refused, never passed), or records the
// outcome of an admitted event (the stream-done call).
func (r *rls) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := r.auth(ctx); err != nil {
		return nil, err
	}
	if !r.s.cfg.Policies.Loaded() {
		return nil, status.Error(codes.Unavailable, "policies_loading: this node has not loaded the policies yet; retry later")
	}
	n := len(req.GetDescriptors())
	call, e := r.read(req)
	if e != nil {
		r.s.gate.Rejected(e.Code)
		if e.Status == http.StatusBadRequest {
			return nil, status.Error(codes.InvalidArgument, e.Error())
		}
		return refused(http.Header{}, e.Status, e.Code, map[string]*Error{"error": e}, nil, n), nil
	}
	if call.eventID != "" {
		return r.outcome(ctx, call, n)
	}
	a, err := r.s.gate.Admit(ctx, call.in.gate(gate.Gateway, 0, "rls"))
	if err != nil {
		h := http.Header{}
		e, ok := refusal(h, err)
		if !ok {
			return nil, status.Error(codes.Canceled, "the caller went away: the decision was voided")
		}
		return refused(h, e.Status, e.Code, map[string]*Error{"error": e}, nil, n), nil
	}
	a = r.s.shown(a)
	h := http.Header{}
	code, reply := r.s.reply(h, a, nil)
	picks := rateLimitPicks(a.Decision.Limits)
	if code != http.StatusOK {
		return refused(h, code, string(reply.Decision), reply, picks, n), nil
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: headersToAdd(h)}
	resp.RequestHeadersToAdd = []*corev3.HeaderValue{{Key: rlsEventHeader, Value: reply.EventID}}
	st := descriptorStatus(resp.OverallCode, code, picks)
	for range n {
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

// auth checks the service token in the call's metadata, as the HTTP API checks its
// Authorization header.
func (r *rls) auth(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	var h string
	if v := md.Get("authorization"); len(v) > 0 {
		h = v[0]
	}
	if ops.Bearer(h, r.s.cfg.ServiceToken) {
		return nil
	}
	if ops.Bearer(h, r.s.cfg.AdminToken) {
		return status.Error(codes.PermissionDenied, "forbidden: the admin token does not take decisions")
	}
	return status.Error(codes.Unauthenticated, "unauthorized: a valid service token is required (metadata authorization: Bearer …)")
}

// read maps the call's descriptors to one admission, or to an outcome when they name an
// event. Its errors are 400s (InvalidArgument) but for an API key too long to be one (401,
// answered like decide's).
func (r *rls) read(req *rlsv3.RateLimitRequest) (rlsCall, *Error) {
	var c rlsCall
	if req.GetDomain() == "" {
		return c, badRequest("invalid_domain", "domain is empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return c, badRequest("invalid_descriptors", "the call has no descriptors")
	}
	var statusRaw string
	fields := map[string]*string{r.m.APIKey: &c.in.APIKey, r.m.Account: &c.in.Account, r.m.Tool: &c.in.Tool,
		r.m.IdempotencyKey: &c.in.IdempotencyKey, r.m.Event: &c.eventID, r.m.Status: &statusRaw}
	for i, d := range req.GetDescriptors() {
		if len(d.GetEntries()) == 0 {
			return c, badRequest("invalid_descriptors", "descriptor %d has no entries", i)
		}
		if d.GetLimit() != nil {
			return c, badRequest("invalid_descriptors", "descriptor %d overrides the limit: limits live in metergate's policies", i)
		}
		if d.GetIsNegativeHits() {
			return c, badRequest("invalid_hits_addend", "descriptor %d has negative hits: refunds are outcomes", i)
		}
		unit, e := r.descriptorUnit(i, d.GetEntries())
		if e != nil {
			return c, e
		}
		c.unitNamed = c.unitNamed || unit != ""
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > MaxHitsAddend {
				return c, badRequest("invalid_hits_addend", "descriptor %d: hits_addend %d is over %d", i, h.GetValue(), MaxHitsAddend)
			}
			v := int64(h.GetValue()) //nolint:gosec // bounded by MaxHitsAddend just above
			if unit != "" {
				if _, dup := c.units[unit]; dup {
					return c, badRequest("conflicting_descriptors", "two descriptors count %s", unit)
				}
				if c.units == nil {
					c.units = map[policy.Unit]int64{}
				}
				c.units[unit] = v
				continue
			}
			if c.hitsGiven && v != c.hits {
				return c, badRequest("invalid_hits_addend", "descriptors give different hits_addend (%d, %d): one call is one admission", c.hits, v)
			}
			c.hits, c.hitsGiven = v, true
		}
		for _, en := range d.GetEntries() {
			k, v := en.GetKey(), en.GetValue()
			p, mapped := fields[k]
			switch {
			case k == r.m.Unit:
				continue // read by descriptorUnit
			case k == "":
				return c, badRequest("invalid_descriptors", "descriptor %d has an entry without a key", i)
			case !mapped && (r.ignoreAll || r.ignore[k]):
				continue
			case !mapped:
				return c, badRequest("unknown_descriptor_key", "descriptor %d: unknown entry key %q (mapped: %s; ADMIT_RLS_IGNORE_ENTRIES ignores others)",
					i, k, strings.Join([]string{r.m.APIKey, r.m.Account, r.m.Tool, r.m.IdempotencyKey, r.m.Event, r.m.Status, r.m.Unit}, ", "))
			case v == "":
				return c, badRequest("invalid_descriptors", "descriptor %d: entry %q is empty", i, k)
			case *p != "" && *p != v:
				return c, badRequest("conflicting_descriptors", "the descriptors give two values of %q: one call is one admission", k)
			}
			*p = v
		}
	}
	if !c.hitsGiven && req.GetHitsAddend() > 0 {
		if req.GetHitsAddend() > MaxHitsAddend {
			return c, badRequest("invalid_hits_addend", "hits_addend %d is over %d", req.GetHitsAddend(), MaxHitsAddend)
		}
		c.hits, c.hitsGiven = int64(req.GetHitsAddend()), true
	}
	if c.eventID != "" {
		return c, r.readOutcome(&c, statusRaw)
	}
	if c.unitNamed {
		return c, badRequest("invalid_descriptors", "entry %q belongs to the stream-done call, with %q", r.m.Unit, r.m.Event)
	}
	if statusRaw != "" {
		return c, badRequest("invalid_descriptors", "entry %q belongs to the stream-done call, with %q", r.m.Status, r.m.Event)
	}
	return c, r.readAdmission(&c)
}

// descriptorUnit is the unit a descriptor's entries name with RLS.Unit ("" for none).
func (r *rls) descriptorUnit(i int, entries []*rlscommon.RateLimitDescriptor_Entry) (policy.Unit, *Error) {
	var unit policy.Unit
	for _, en := range entries {
		if en.GetKey() != r.m.Unit {
			continue
		}
		u := policy.Unit(en.GetValue())
		switch {
		case !u.Valid():
			return "", badRequest("invalid_descriptors", "descriptor %d: entry %q names no unit: %.40q", i, r.m.Unit, en.GetValue())
		case unit != "" && unit != u:
			return "", badRequest("conflicting_descriptors", "descriptor %d names two units", i)
		}
		unit = u
	}
	return unit, nil
}

// readAdmission checks the admission's credentials and units as parseAdmit does.
func (r *rls) readAdmission(c *rlsCall) *Error {
	in := &c.in
	switch {
	case in.APIKey == "" && in.Account == "":
		return badRequest("missing_credentials", "the descriptors carry neither %q nor %q", r.m.APIKey, r.m.Account)
	case in.APIKey != "" && in.Account != "":
		return badRequest("ambiguous_account", "give %q or %q, not both", r.m.APIKey, r.m.Account)
	case in.Account != "" && !policy.ValidID(in.Account):
		return badRequest("invalid_account", "%q must be 1-64 of [A-Za-z0-9._-], starting with a letter or digit", r.m.Account)
	case len(in.APIKey) > 256:
		return &Error{Status: http.StatusUnauthorized, Code: "unknown_api_key", Message: "the API key is not known"}
	}
	if e := validIdempotencyKey(in.IdempotencyKey); e != nil {
		return e
	}
	in.Units = map[policy.Unit]int64{policy.Requests: 1}
	if c.hitsGiven {
		in.Units[r.m.Hits] = c.hits
	}
	if in.Tool != "" {
		cost, ok := r.s.cfg.Tools[in.Tool]
		if !ok {
			return badRequest("unknown_tool", "unknown tool %q", in.Tool)
		}
		if _, set := in.Units[policy.Credits]; !set {
			in.Units[policy.Credits] = cost
		}
	}
	return nil
}

// readOutcome checks the stream-done call as parseOutcome does.
func (r *rls) readOutcome(c *rlsCall, statusRaw string) *Error {
	if len(c.eventID) > 128 {
		return badRequest("invalid_event_id", "%q is longer than 128 characters", r.m.Event)
	}
	c.status = http.StatusOK
	if statusRaw != "" {
		n, err := strconv.Atoi(statusRaw)
		if err != nil || n < 100 || n > 599 {
			return badRequest("invalid_status", "%q must be an HTTP status code, 100-599, got %.40q", r.m.Status, statusRaw)
		}
		c.status = n
	}
	return nil
}

// outcome records the stream-done call as the admitted event's outcome, with hits_addend
// as the units really used.
func (r *rls) outcome(ctx context.Context, c rlsCall, n int) (*rlsv3.RateLimitResponse, error) {
	o := admission.Outcome{EventID: c.eventID, Status: c.status, Source: r.s.cfg.Source, Units: c.units}
	if c.hitsGiven {
		if _, dup := o.Units[r.m.Hits]; dup {
			return nil, status.Errorf(codes.InvalidArgument, "conflicting_descriptors: two descriptors count %s", r.m.Hits)
		}
		if o.Units == nil {
			o.Units = map[policy.Unit]int64{}
		}
		o.Units[r.m.Hits] = c.hits
	}
	err := r.s.cfg.Decider.Outcome(ctx, o)
	switch {
	case errors.Is(err, keyspace.ErrUnknownEvent):
		return nil, status.Errorf(codes.InvalidArgument, "invalid_event_id: %q was not issued by admit", c.eventID)
	case ctx.Err() != nil:
		return nil, status.Error(codes.Canceled, "the caller went away")
	case err != nil:
		r.s.cfg.Log.Warn("record outcome", "event_id", c.eventID, "err", err)
		return nil, status.Error(codes.Unavailable, "unavailable: the outcome cannot be recorded right now; retry later")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range n {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
	}
	return resp, nil
}

// headersToAdd are the answer's RateLimit fields and Retry-After, for the client.
func headersToAdd(h http.Header) []*corev3.HeaderValue {
	var out []*corev3.HeaderValue
	for _, name := range []string{"RateLimit", "RateLimit-Policy", "Retry-After", ReplayedHeader} {
		if v := h.Get(name); v != "" {
			out = append(out, &corev3.HeaderValue{Key: name, Value: v})
		}
	}
	return out
}

// refused is Envoy's answer to a refusal: OVER_LIMIT with the reply's JSON body, its
// RateLimit fields and Retry-After, and its HTTP status and code in the dynamic metadata
// (for Envoy's local_reply_config).
func refused(h http.Header, httpStatus int, code string, body any, picks []admission.LimitState, n int) *rlsv3.RateLimitResponse {
	raw, err := json.Marshal(body)
	if err != nil {
		raw = []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: raw,
		ResponseHeadersToAdd: append(headersToAdd(h), &corev3.HeaderValue{Key: "Content-Type", Value: "application/json"})}
	resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
		"http_status": structpb.NewNumberValue(float64(httpStatus)),
		"code":        structpb.NewStringValue(code),
	}}
	st := descriptorStatus(resp.OverallCode, httpStatus, picks)
	for range n {
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp
}

// descriptorStatus is every descriptor's status: the call's code, and of the limits the
// RateLimit fields name (picks) the one that tells the most (the rate limit of a 429, the
// quota of a 402, otherwise the one closest to running out).
func descriptorStatus(code rlsv3.RateLimitResponse_Code, httpStatus int, picks []admission.LimitState) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: code}
	if len(picks) == 0 {
		return st
	}
	best := -1
	for i, l := range picks {
		switch {
		case httpStatus == http.StatusTooManyRequests:
			if !l.Quota && best < 0 {
				best = i
			}
		case httpStatus == http.StatusPaymentRequired:
			if l.Quota && best < 0 {
				best = i
			}
		case best < 0 || remainingShare(l) < remainingShare(picks[best]):
			best = i
		}
	}
	if best < 0 {
		best = 0
	}
	l := picks[best]
	st.CurrentLimit = envoyLimit(l)
	st.LimitRemaining = clampUint32(l.Remaining)
	st.DurationUntilReset = durationpb.New(time.Duration(ceilSeconds(l.Reset)) * time.Second)
	return st
}

// envoyLimit is the limit as Envoy states one: q requests per unit_multiplier units, the
// largest unit that divides the window (a quota's month is a MONTH).
func envoyLimit(lim admission.LimitState) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{Name: limitName(lim), RequestsPerUnit: clampUint32(lim.Limit)}
	const day = 86400
	switch w := ceilSeconds(lim.Window); {
	case w <= 0:
		l.Unit = rlsv3.RateLimitResponse_RateLimit_UNKNOWN
	case w >= 28*day && w <= 31*day:
		l.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
	default:
		for _, u := range []struct {
			unit rlsv3.RateLimitResponse_RateLimit_Unit
			s    int64
		}{{rlsv3.RateLimitResponse_RateLimit_DAY, day}, {rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
			{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60}, {rlsv3.RateLimitResponse_RateLimit_SECOND, 1}} {
			if w%u.s == 0 {
				l.Unit = u.unit
				if w/u.s > 1 {
					l.UnitMultiplier = wrapperspb.UInt32(clampUint32(w / u.s))
				}
				break
			}
		}
	}
	return l
}

func clampUint32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}
