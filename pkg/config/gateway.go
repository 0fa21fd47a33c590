package config

import (
	"fmt"
	"net"
	"regexp"

	"github.com/metergate/metergate/pkg/policy"
)

// RLS configures Envoy's rate-limit service (gRPC, docs/gateways.md): its address and how
// descriptor entries map to an admission (api.RLS).
type RLS struct {
	// Addr is the gRPC listen address; empty serves no gRPC.
	Addr string
	// The descriptor entry keys of api.RLS.
	APIKey, Account, Tool, IdempotencyKey, Event, Status string
	// Hits is the unit hits_addend counts.
	Hits string
	// Ignore lists entry keys that carry nothing for admit ("*": every key not mapped).
	Ignore []string
}

// descriptorKey is an Envoy descriptor key as admit accepts one in its settings.
var descriptorKey = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// register adds ADMIT_GRPC_ADDR and the ADMIT_RLS_* settings.
func (c *RLS) register(l *Loader) {
	l.String(&c.Addr, "ADMIT_GRPC_ADDR", "", "gRPC listen address of Envoy's rate-limit service, health checking and reflection (empty: off)")
	l.String(&c.APIKey, "ADMIT_RLS_KEY_ENTRY", "api_key", "descriptor entry carrying the end customer's API key")
	l.String(&c.Account, "ADMIT_RLS_ACCOUNT_ENTRY", "account", "descriptor entry naming the account (trusted gateways)")
	l.String(&c.Tool, "ADMIT_RLS_TOOL_ENTRY", "tool", "descriptor entry naming the tool called")
	l.String(&c.IdempotencyKey, "ADMIT_RLS_IDEMPOTENCY_ENTRY", "idempotency_key", "descriptor entry carrying the idempotency key")
	l.String(&c.Event, "ADMIT_RLS_EVENT_ENTRY", "event_id", "descriptor entry of the stream-done call carrying the admitted event id (the call is then an outcome)")
	l.String(&c.Status, "ADMIT_RLS_STATUS_ENTRY", "status", "descriptor entry of the stream-done call carrying the upstream's HTTP status (200 when absent)")
	l.String(&c.Hits, "ADMIT_RLS_HITS_UNIT", string(policy.Tokens), "unit that hits_addend counts: tokens, credits, cost_micros or requests")
	l.List(&c.Ignore, "ADMIT_RLS_IGNORE_ENTRIES", []string{"generic_key"}, "descriptor entries ignored (* ignores every entry not mapped); any other is INVALID_ARGUMENT")
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
		{"ADMIT_RLS_EVENT_ENTRY", c.Event}, {"ADMIT_RLS_STATUS_ENTRY", c.Status}} {
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
	if !policy.Unit(c.Hits).Valid() {
		errs = append(errs, fmt.Errorf("ADMIT_RLS_HITS_UNIT=%q: want tokens, credits, cost_micros or requests", c.Hits))
	}
	return prefix("rate-limit service", errs)
}
