package config

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"time"

	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/policy"
)

// RLS configures Envoy's rate-limit service (gRPC, docs/gateways.md): its address and how
// descriptor entries map to an admission (api.RLS).
type RLS struct {
	// Addr is the gRPC listen address; empty serves no gRPC.
	Addr string
	// The descriptor entry keys of api.RLS.
	APIKey, Account, Tool, IdempotencyKey, Event, Status, Unit string
	// Hits is the unit hits_addend counts.
	Hits string
	// Ignore lists entry keys that carry nothing for admit ("*": every key not mapped).
	Ignore []string
	// Limits bound the gRPC listener (ADMIT_GRPC_*; its MaxHeaderBytes is set by
	// Admit.GRPC), and MaxHeldStreams the streaming calls held at once (ops.StreamGuard).
	Limits         ops.GRPC
	MaxHeldStreams int
}

// descriptorKey is an Envoy descriptor key as admit accepts one in its settings.
var descriptorKey = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// register adds ADMIT_GRPC_ADDR and the ADMIT_RLS_* settings.
func (c *RLS) register(l *Loader) {
	l.String(&c.Addr, "ADMIT_GRPC_ADDR", "", "gRPC listen address of Envoy's rate-limit service, health checking and reflection (empty: off)")
	d := api.DefaultRLS
	l.String(&c.APIKey, "ADMIT_RLS_KEY_ENTRY", d.APIKey, "descriptor entry carrying the end customer's API key")
	l.String(&c.Account, "ADMIT_RLS_ACCOUNT_ENTRY", d.Account, "descriptor entry naming the account (trusted gateways)")
	l.String(&c.Tool, "ADMIT_RLS_TOOL_ENTRY", d.Tool, "descriptor entry naming the tool called")
	l.String(&c.IdempotencyKey, "ADMIT_RLS_IDEMPOTENCY_ENTRY", d.IdempotencyKey, "descriptor entry carrying the idempotency key")
	l.String(&c.Event, "ADMIT_RLS_EVENT_ENTRY", d.Event, "descriptor entry of the stream-done call carrying the admitted event id (the call is then an outcome)")
	l.String(&c.Status, "ADMIT_RLS_STATUS_ENTRY", d.Status, "descriptor entry of the stream-done call carrying the upstream's HTTP status (200 when absent)")
	l.String(&c.Unit, "ADMIT_RLS_UNIT_ENTRY", d.Unit, "descriptor entry of the stream-done call naming the unit its descriptor's hits_addend counts (ADMIT_RLS_HITS_UNIT when absent)")
	l.String(&c.Hits, "ADMIT_RLS_HITS_UNIT", string(d.Hits), "unit that hits_addend counts: tokens, credits, cost_micros or requests")
	l.List(&c.Ignore, "ADMIT_RLS_IGNORE_ENTRIES", slices.Clone(d.Ignore), "descriptor entries ignored (* ignores every entry not mapped); any other is INVALID_ARGUMENT")
	g := &c.Limits
	l.Int(&g.MaxConns, "ADMIT_GRPC_MAX_CONNS", 1024, "most gRPC connections open at once; one past it is closed when accepted")
	l.Int(&g.MaxStreams, "ADMIT_GRPC_MAX_STREAMS", 256, "most concurrent calls per gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)")
	l.Int(&g.MaxRecvBytes, "ADMIT_GRPC_MAX_RECV_BYTES", 64<<10, "largest gRPC request message, in bytes (past it: RESOURCE_EXHAUSTED)")
	l.Duration(&g.HandshakeTimeout, "ADMIT_GRPC_HANDSHAKE_TIMEOUT", 5*time.Second, "longest time a new gRPC connection may take to finish its HTTP/2 handshake")
	l.Duration(&g.IdleTimeout, "ADMIT_GRPC_IDLE_TIMEOUT", 5*time.Minute, "a gRPC connection without calls for this long is closed (GOAWAY)")
	l.Duration(&g.MaxAge, "ADMIT_GRPC_MAX_CONN_AGE", 30*time.Minute, "a gRPC connection this old is closed (GOAWAY, ±10 % jitter); its calls get ADMIT_GRPC_MAX_CONN_AGE_GRACE to finish")
	l.Duration(&g.MaxAgeGrace, "ADMIT_GRPC_MAX_CONN_AGE_GRACE", 30*time.Second, "how long calls of a connection closed for its age may still run")
	l.Duration(&g.KeepaliveTime, "ADMIT_GRPC_KEEPALIVE_TIME", time.Minute, "a gRPC connection silent for this long is pinged")
	l.Duration(&g.KeepaliveTimeout, "ADMIT_GRPC_KEEPALIVE_TIMEOUT", 20*time.Second, "a ping unanswered for this long closes the connection")
	l.Duration(&g.KeepaliveMinTime, "ADMIT_GRPC_KEEPALIVE_MIN_TIME", 10*time.Second, "shortest interval between a client's pings; a client pinging more often is sent GOAWAY")
	l.Int(&c.MaxHeldStreams, "ADMIT_GRPC_MAX_HELD_STREAMS", 16, "most streaming calls (health Watch, reflection; each needs the service token) held open at once")
}

// Mapping is the descriptor mapping of Envoy's rate-limit service as configured.
func (c RLS) Mapping() api.RLS {
	return api.RLS{APIKey: c.APIKey, Account: c.Account, Tool: c.Tool, IdempotencyKey: c.IdempotencyKey,
		Event: c.Event, Status: c.Status, Unit: c.Unit, Hits: policy.Unit(c.Hits), Ignore: c.Ignore}
}

// Validate reports a bad address, entry key or unit; entries must differ.
func (c RLS) Validate() error {
	var errs []error
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			errs = append(errs, fmt.Errorf("ADMIT_GRPC_ADDR=%q: want host:port", c.Addr))
		}
	}
	seen := map[string]string{}
	for _, f := range []struct{ name, v string }{{"ADMIT_RLS_KEY_ENTRY", c.APIKey}, {"ADMIT_RLS_ACCOUNT_ENTRY", c.Account},
		{"ADMIT_RLS_TOOL_ENTRY", c.Tool}, {"ADMIT_RLS_IDEMPOTENCY_ENTRY", c.IdempotencyKey},
		{"ADMIT_RLS_EVENT_ENTRY", c.Event}, {"ADMIT_RLS_STATUS_ENTRY", c.Status}, {"ADMIT_RLS_UNIT_ENTRY", c.Unit}} {
		switch {
		case !descriptorKey.MatchString(f.v):
			errs = append(errs, fmt.Errorf("%s=%q: want 1-64 of [A-Za-z0-9_.:-]", f.name, f.v))
		case seen[f.v] != "":
			errs = append(errs, fmt.Errorf("%s=%q: %s has it too", f.name, f.v, seen[f.v]))
		default:
			seen[f.v] = f.name
		}
	}
	for _, k := range c.Ignore {
		switch {
		case k != "*" && !descriptorKey.MatchString(k):
			errs = append(errs, fmt.Errorf("ADMIT_RLS_IGNORE_ENTRIES: %q is not a descriptor key or *", k))
		case seen[k] != "":
			errs = append(errs, fmt.Errorf("ADMIT_RLS_IGNORE_ENTRIES: %q is %s", k, seen[k]))
		}
	}
	g := c.Limits
	for _, n := range []struct {
		name   string
		v, max int
	}{{"ADMIT_GRPC_MAX_CONNS", g.MaxConns, 1 << 20}, {"ADMIT_GRPC_MAX_STREAMS", g.MaxStreams, 1 << 16},
		{"ADMIT_GRPC_MAX_RECV_BYTES", g.MaxRecvBytes, 16 << 20}, {"ADMIT_GRPC_MAX_HELD_STREAMS", c.MaxHeldStreams, 1 << 16}} {
		if n.v < 1 || n.v > n.max {
			errs = append(errs, fmt.Errorf("%s=%d: want 1-%d", n.name, n.v, n.max))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ADMIT_GRPC_HANDSHAKE_TIMEOUT", g.HandshakeTimeout}, {"ADMIT_GRPC_IDLE_TIMEOUT", g.IdleTimeout},
		{"ADMIT_GRPC_MAX_CONN_AGE", g.MaxAge}, {"ADMIT_GRPC_MAX_CONN_AGE_GRACE", g.MaxAgeGrace},
		{"ADMIT_GRPC_KEEPALIVE_TIME", g.KeepaliveTime}, {"ADMIT_GRPC_KEEPALIVE_TIMEOUT", g.KeepaliveTimeout},
		{"ADMIT_GRPC_KEEPALIVE_MIN_TIME", g.KeepaliveMinTime}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", d.name, d.v))
		}
	}
	if !policy.Unit(c.Hits).Valid() {
		errs = append(errs, fmt.Errorf("ADMIT_RLS_HITS_UNIT=%q: want tokens, credits, cost_micros or requests", c.Hits))
	}
	return prefix("rate-limit service", errs)
}
