package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/api"
	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/gate"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/meter"
	"github.com/metergate/metergate/internal/ops"
	"github.com/metergate/metergate/internal/outbox"
	"github.com/metergate/metergate/internal/policy"
)

// Admit is the configuration of cmd/admit.
type Admit struct {
	Server    Server
	Log       Log
	Redis     Redis
	Postgres  Postgres
	Kafka     Kafka
	Admission Admission
	// RLS is Envoy's rate-limit service (gRPC, docs/gateways.md).
	RLS RLS
	// Webhooks: admit reads only AllowPrivate, to check endpoints' URLs.
	Webhooks Webhooks
	// Billing is who issues the documents the invoices API voids and renders.
	Billing Billing
	// Console is the web console (docs/console.md).
	Console Console
	// Portal is the customer portal (docs/portal.md).
	Portal Portal
	// Refusals is the refusal log the console reads.
	Refusals Refusals
	// Migrate applies pending migrations before serving.
	Migrate bool
}

// Admission is how admit decides and whom it serves.
type Admission struct {
	ServiceToken string
	AdminToken   string
	Node         string
	// Keyspace names the Redis keys (ADMIT_KEY_PREFIX, ADMIT_SHARDS).
	Keyspace
	IdempotencyTTL time.Duration
	// IdempotencyLegacy also looks up idempotency records of the one-key-per-record
	// layout of earlier versions (for the 24 h after an upgrade).
	IdempotencyLegacy bool
	// IdempotencyHot is the hot window H: Redis holds each idempotency record exactly for
	// H (and until its event is in the billing log), a Bloom filter answers for the rest
	// of the TTL, and the billing log for the keys it may hold; 0 keeps every record in
	// Redis for the TTL (docs/admission.md, "Idempotency").
	IdempotencyHot time.Duration
	// IdempotencyFilterBits is the size of one idempotency filter, in bits.
	IdempotencyFilterBits int
	// IdempotencyMarkEvery is how often the relay's janitor moves the shards' marks.
	IdempotencyMarkEvery time.Duration
	// MeterGroup is the meters' Kafka consumer group (METER_GROUP, the meter's value):
	// its committed offsets tell the janitor what is in PostgreSQL.
	MeterGroup   string
	LeaseTTL     time.Duration
	PolicyReload time.Duration
	// RedisDownRateOnly and RedisDownQuota are "open" or "closed".
	RedisDownRateOnly string
	RedisDownQuota    string
	// Relay runs the outbox relay inside admit (`admit relay` runs it alone).
	Relay bool
	// RelayBatch is the most outbox entries per Kafka write; RelayClaimAfter how long
	// another relay's unacknowledged entries wait before this one takes them over.
	RelayBatch      int
	RelayClaimAfter time.Duration
	// OutboxMaxAge is the age of the oldest unrelayed event past which /readyz reports
	// the outbox as degraded.
	OutboxMaxAge time.Duration
	// MaxBatch and Pipeline shape the grouping of concurrent decisions of one shard into
	// script calls: at most MaxBatch decisions per call, at most Pipeline calls in flight.
	MaxBatch int
	Pipeline int
	// WaitReplicas and WaitTimeout: how many replicas must acknowledge a script call's
	// writes before its decision is answered, and for how long to wait (admission.Options).
	WaitReplicas int
	WaitTimeout  time.Duration
	// ToolCredits prices tools in credits, "name=credits,...".
	ToolCredits map[string]int64
	toolsRaw    []string
	// EstimateDefaultOutput is the output tokens an estimate assumes for a model request
	// that bounds none (internal/estimate).
	EstimateDefaultOutput int
	// Shadow puts every account in shadow mode: decided and recorded, never refused
	// (docs/admission.md, "Shadow mode").
	Shadow bool
	// MaxWait bounds how long a request may wait for capacity (admit's max_wait_ms); 0
	// disables waiting.
	MaxWait time.Duration
	// Check names the headers of the forward-auth check, GET /v1/check (docs/gateways.md).
	Check api.CheckHeaders
	// RevealAccounts shows end clients behind a gateway every account id of their path
	// (api.Config.RevealAccounts); off, they see their own only.
	RevealAccounts bool
	// MaxEstimates bounds the token estimates of large bodies running at once.
	MaxEstimates int
}

// headerName is an HTTP field name (RFC 9110 token).
var headerName = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")

// minFilterBits and maxFilterBits bound ADMIT_IDEMPOTENCY_FILTER_BITS: a filter of 1 KiB,
// and the largest Redis string (512 MB), which the key's 32-bit positions also address.
const minFilterBits, maxFilterBits = 1 << 13, 1 << 32

// maxWaitLimit is the greatest ADMIT_MAX_WAIT (the OpenAPI document's bound of max_wait_ms).
const maxWaitLimit = 10 * time.Minute

// Register adds the ADMIT_* decision settings.
func (c *Admission) Register(l *Loader) {
	host, _ := os.Hostname()
	if host == "" {
		host = "admit"
	}
	l.String(&c.ServiceToken, "ADMIT_SERVICE_TOKEN", "", "bearer token of calling services (at least 16 characters)")
	l.String(&c.AdminToken, "ADMIT_ADMIN_TOKEN", "", "bearer token of the admin API (at least 16 characters, not the service token)")
	l.String(&c.Node, "ADMIT_NODE", host, "this node's name: the CloudEvents source of its events")
	c.registerKeyspace(l)
	l.Duration(&c.IdempotencyTTL, "ADMIT_IDEMPOTENCY_TTL", keyspace.DefaultIdempotencyTTL, "idempotency TTL: a retry within it is charged once (at least 1m); without the billing log (ADMIT_IDEMPOTENCY_HOT=0) one between TTL and 2 TTL may be charged again")
	l.Bool(&c.IdempotencyLegacy, "ADMIT_IDEMPOTENCY_LEGACY", true, "also honour idempotency records written by versions before the bucket layout (turn off 24h after the upgrade)")
	l.Duration(&c.IdempotencyHot, "ADMIT_IDEMPOTENCY_HOT", keyspace.DefaultIdempotencyHot, "hot window H: Redis holds idempotency records exactly for H (and until their events are in PostgreSQL), older keys are answered from the billing log; 0: every record in Redis for the TTL")
	l.Int(&c.IdempotencyFilterBits, "ADMIT_IDEMPOTENCY_FILTER_BITS", admission.DefaultIdempotencyFilterBits, "bits of one idempotency filter (per shard and half TTL): about 9.6 per key admitted with a key in that time for 1% of lookups in the billing log")
	l.Duration(&c.IdempotencyMarkEvery, "ADMIT_IDEMPOTENCY_MARK_EVERY", outbox.DefaultMarkEvery, "how often the relay's janitor moves each shard's idempotency mark (what is in PostgreSQL) and deletes the hot buckets it passed")
	registerMeterGroup(l, &c.MeterGroup)
	l.Duration(&c.LeaseTTL, "ADMIT_LEASE_TTL", admission.DefaultLeaseTTL, "how long a concurrency slot is held when no outcome releases it")
	l.Duration(&c.PolicyReload, "ADMIT_POLICY_RELOAD", 30*time.Second, "full policy reload period (changes arrive sooner through LISTEN/NOTIFY)")
	l.String(&c.RedisDownRateOnly, "ADMIT_REDIS_DOWN_RATE_ONLY", string(gate.DefaultRedisDownRateOnly), "while Redis is down, accounts without quotas: open (admit, record straight to Kafka) or closed (503)")
	l.String(&c.RedisDownQuota, "ADMIT_REDIS_DOWN_QUOTA", string(gate.DefaultRedisDownQuota), "while Redis is down, accounts with quotas: closed (503) or open")
	l.Bool(&c.Relay, "ADMIT_RELAY", true, "run the outbox relay (Redis → Kafka) in this process")
	l.Int(&c.RelayBatch, "ADMIT_RELAY_BATCH", outbox.DefaultRelayBatch, "most outbox entries per Kafka write")
	l.Duration(&c.RelayClaimAfter, "ADMIT_RELAY_CLAIM_AFTER", outbox.DefaultClaimAfter, "how long entries read and not acknowledged by another relay wait before this one takes them over")
	l.Duration(&c.OutboxMaxAge, "ADMIT_OUTBOX_MAX_AGE", time.Minute, "age of the oldest unrelayed event past which /readyz reports the outbox degraded")
	l.Int(&c.WaitReplicas, "ADMIT_REDIS_WAIT_REPLICAS", 0, "replicas that must acknowledge a decision's writes (Redis WAIT) before it is answered; 1 with Sentinel or a Cluster with replicas")
	l.Duration(&c.WaitTimeout, "ADMIT_REDIS_WAIT_TIMEOUT", keyspace.DefaultWaitTimeout, "longest WAIT for ADMIT_REDIS_WAIT_REPLICAS; short of them the decision is answered 503 and voided")
	l.Int(&c.MaxBatch, "ADMIT_MAX_BATCH", admission.DefaultMaxBatch, "most decisions of one shard per script call (1 = no grouping)")
	l.Int(&c.Pipeline, "ADMIT_PIPELINE", admission.DefaultPipeline, "most script calls in flight per shard")
	l.List(&c.toolsRaw, "ADMIT_TOOL_CREDITS", toolCredits(policy.ToolCredits), "credits per tool call, name=credits,...")
	l.Duration(&c.MaxWait, "ADMIT_MAX_WAIT", 30*time.Second, "longest max_wait_ms a request may give to wait for capacity (0 disables waiting; at most 10m)")
	l.Bool(&c.Shadow, "ADMIT_SHADOW", false, "shadow mode for every account: decide and record, count refusals, never refuse")
	l.Bool(&c.RevealAccounts, "ADMIT_GATEWAY_REVEAL_ACCOUNTS", false, "show end clients behind a gateway (the check, the rate-limit service) the ids of every account of their path; off: their own account's id only, the others by their kind (org, team, ...)")
	l.Int(&c.MaxEstimates, "ADMIT_MAX_ESTIMATES", 0, "most token estimates of large bodies (POST /v1/estimate, POST /v1/admit with an estimate) running at once; one more waits up to 1 s, then gets 503 busy (0: 2 × GOMAXPROCS)")
	h := api.DefaultCheckHeaders
	l.String(&c.Check.Token, "ADMIT_CHECK_TOKEN_HEADER", h.Token, "header of GET /v1/check carrying the service token (Authorization takes \"Bearer <token>\")")
	l.String(&c.Check.APIKey, "ADMIT_CHECK_API_KEY_HEADER", h.APIKey, "header of GET /v1/check carrying the end customer's API key")
	l.String(&c.Check.Account, "ADMIT_CHECK_ACCOUNT_HEADER", h.Account, "header of GET /v1/check naming the account, for gateways that authenticate clients and overwrite it (empty: off)")
	l.String(&c.Check.Tokens, "ADMIT_CHECK_TOKENS_HEADER", h.Tokens, "header of GET /v1/check carrying the request's estimated tokens")
	l.String(&c.Check.Tool, "ADMIT_CHECK_TOOL_HEADER", h.Tool, "header of GET /v1/check naming the tool called")
	l.String(&c.Check.IdempotencyKey, "ADMIT_CHECK_IDEMPOTENCY_HEADER", h.IdempotencyKey, "header of GET /v1/check carrying the idempotency key")
	l.Int(&c.EstimateDefaultOutput, "ADMIT_ESTIMATE_DEFAULT_OUTPUT", estimate.DefaultOutput, "output tokens an estimate assumes for an OpenAI request without max_tokens or max_completion_tokens")
}

// Validate reports every bad decision setting.
func (c *Admission) Validate() error {
	var errs []error
	if len(c.ServiceToken) < 16 {
		errs = append(errs, errors.New("ADMIT_SERVICE_TOKEN: must be set, at least 16 characters"))
	}
	if len(c.AdminToken) < 16 {
		errs = append(errs, errors.New("ADMIT_ADMIN_TOKEN: must be set, at least 16 characters"))
	}
	if c.AdminToken != "" && c.AdminToken == c.ServiceToken {
		errs = append(errs, errors.New("ADMIT_ADMIN_TOKEN: must differ from ADMIT_SERVICE_TOKEN"))
	}
	if c.MaxEstimates < 0 || c.MaxEstimates > 1024 {
		errs = append(errs, fmt.Errorf("ADMIT_MAX_ESTIMATES=%d: want 0-1024", c.MaxEstimates))
	}
	if c.Node == "" {
		errs = append(errs, errors.New("ADMIT_NODE: must not be empty"))
	}
	errs = append(errs, c.validateKeyspace()...)
	if c.IdempotencyTTL < keyspace.MinIdempotencyTTL {
		errs = append(errs, fmt.Errorf("ADMIT_IDEMPOTENCY_TTL=%s: want at least %s", c.IdempotencyTTL, keyspace.MinIdempotencyTTL))
	}
	if c.IdempotencyHot != 0 && (c.IdempotencyHot < time.Second || c.IdempotencyHot%time.Millisecond != 0) {
		errs = append(errs, fmt.Errorf("ADMIT_IDEMPOTENCY_HOT=%s: want 0 (off) or at least 1s, whole milliseconds", c.IdempotencyHot))
	}
	if c.IdempotencyFilterBits < minFilterBits || c.IdempotencyFilterBits > maxFilterBits {
		errs = append(errs, fmt.Errorf("ADMIT_IDEMPOTENCY_FILTER_BITS=%d: want %d-%d (a Redis string of at most 512 MB)", c.IdempotencyFilterBits, minFilterBits, maxFilterBits))
	}
	if c.MeterGroup == "" {
		errs = append(errs, errors.New("METER_GROUP: must not be empty"))
	}
	for name, d := range map[string]time.Duration{"ADMIT_LEASE_TTL": c.LeaseTTL, "ADMIT_POLICY_RELOAD": c.PolicyReload,
		"ADMIT_RELAY_CLAIM_AFTER": c.RelayClaimAfter, "ADMIT_OUTBOX_MAX_AGE": c.OutboxMaxAge,
		"ADMIT_IDEMPOTENCY_MARK_EVERY": c.IdempotencyMarkEvery} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", name, d))
		}
	}
	for name, v := range map[string]int{"ADMIT_MAX_BATCH": c.MaxBatch, "ADMIT_PIPELINE": c.Pipeline, "ADMIT_RELAY_BATCH": c.RelayBatch} {
		if v < 1 || v > 1024 {
			errs = append(errs, fmt.Errorf("%s=%d: want 1-1024", name, v))
		}
	}
	if c.WaitReplicas < 0 || c.WaitReplicas > 16 {
		errs = append(errs, fmt.Errorf("ADMIT_REDIS_WAIT_REPLICAS=%d: want 0-16", c.WaitReplicas))
	}
	if c.WaitTimeout < time.Millisecond || c.WaitTimeout > 10*time.Second || c.WaitTimeout%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("ADMIT_REDIS_WAIT_TIMEOUT=%s: want 1ms-10s, whole milliseconds", c.WaitTimeout))
	}
	if c.EstimateDefaultOutput < 1 || c.EstimateDefaultOutput > 10_000_000 {
		errs = append(errs, fmt.Errorf("ADMIT_ESTIMATE_DEFAULT_OUTPUT=%d: want 1-10000000", c.EstimateDefaultOutput))
	}
	if c.MaxWait < 0 || c.MaxWait > maxWaitLimit || c.MaxWait%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("ADMIT_MAX_WAIT=%s: want 0-%s, whole milliseconds", c.MaxWait, maxWaitLimit))
	}
	for name, v := range map[string]string{"ADMIT_CHECK_TOKEN_HEADER": c.Check.Token, "ADMIT_CHECK_API_KEY_HEADER": c.Check.APIKey,
		"ADMIT_CHECK_TOKENS_HEADER": c.Check.Tokens, "ADMIT_CHECK_TOOL_HEADER": c.Check.Tool,
		"ADMIT_CHECK_IDEMPOTENCY_HEADER": c.Check.IdempotencyKey, "ADMIT_CHECK_ACCOUNT_HEADER": c.Check.Account} {
		if !headerName.MatchString(v) && (v != "" || name != "ADMIT_CHECK_ACCOUNT_HEADER") {
			errs = append(errs, fmt.Errorf("%s=%q: want an HTTP header name", name, v))
		}
	}
	for name, v := range map[string]string{"ADMIT_REDIS_DOWN_RATE_ONLY": c.RedisDownRateOnly, "ADMIT_REDIS_DOWN_QUOTA": c.RedisDownQuota} {
		if v != "open" && v != "closed" {
			errs = append(errs, fmt.Errorf("%s=%q: want open or closed", name, v))
		}
	}
	c.ToolCredits = make(map[string]int64, len(c.toolsRaw))
	for _, item := range c.toolsRaw {
		name, credits, ok := strings.Cut(item, "=")
		n, err := strconv.ParseInt(strings.TrimSpace(credits), 10, 64)
		if !ok || err != nil || n < 0 || strings.TrimSpace(name) == "" {
			errs = append(errs, fmt.Errorf("ADMIT_TOOL_CREDITS: %q is not name=credits with credits ≥ 0", item))
			continue
		}
		c.ToolCredits[strings.TrimSpace(name)] = n
	}
	return prefix("admission", errs)
}

// toolCredits writes prices as ADMIT_TOOL_CREDITS does, cheapest first.
func toolCredits(prices map[string]int64) []string {
	names := slices.Collect(maps.Keys(prices))
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(prices[a], prices[b]), strings.Compare(a, b)) })
	items := make([]string, len(names))
	for i, name := range names {
		items[i] = name + "=" + strconv.FormatInt(prices[name], 10)
	}
	return items
}

// registerMeterGroup adds METER_GROUP, which admit's idempotency janitor reads too.
func registerMeterGroup(l *Loader, p *string) {
	l.String(p, "METER_GROUP", meter.DefaultGroup, "Kafka consumer group of the meters")
}

// UsesBillingLog reports whether idempotency keys past the hot window are answered from
// the billing log (ADMIT_IDEMPOTENCY_HOT above 0), which needs the relay's janitor.
func (c Admission) UsesBillingLog() bool { return c.IdempotencyHot > 0 }

// AdmitterOptions returns o, which carries the admitter's dependencies, with the decision
// settings. o.IdempotencyLog is dropped unless UsesBillingLog: every record then stays in
// Redis for the TTL.
func (c Admission) AdmitterOptions(o admission.Options) admission.Options {
	if !c.UsesBillingLog() {
		o.IdempotencyLog = nil
	}
	o.KeyPrefix, o.Shards = c.KeyPrefix, c.Shards
	o.IdempotencyTTL, o.IdempotencyLegacy, o.IdempotencyHot = c.IdempotencyTTL, c.IdempotencyLegacy, c.IdempotencyHot
	o.IdempotencyFilterBits = uint64(c.IdempotencyFilterBits) //nolint:gosec // validated: 2^13-2^32
	o.LeaseTTL, o.MaxBatch, o.Pipeline = c.LeaseTTL, c.MaxBatch, c.Pipeline
	o.WaitReplicas, o.WaitTimeout = c.WaitReplicas, c.WaitTimeout
	return o
}

// APIConfig returns o, which carries the API's dependencies, with the settings of whom
// admit serves and how.
func (c Admission) APIConfig(o api.Config) api.Config {
	o.ServiceToken, o.AdminToken, o.Source, o.Tools = c.ServiceToken, c.AdminToken, c.Node, c.ToolCredits
	o.RedisDownRateOnly, o.RedisDownQuota = api.FailPolicy(c.RedisDownRateOnly), api.FailPolicy(c.RedisDownQuota)
	o.Estimate = estimate.Options{DefaultOutput: int64(c.EstimateDefaultOutput)}
	o.MaxWait, o.Shadow, o.Check = c.MaxWait, c.Shadow, c.Check
	o.RevealAccounts, o.MaxEstimates = c.RevealAccounts, c.MaxEstimates
	return o
}

// RelayOptions returns o, which carries the relay's logger and registerer, with the relay
// settings: this node's name is its consumer name.
func (c Admission) RelayOptions(o outbox.RelayOptions) outbox.RelayOptions {
	o.Keys, o.Consumer = c.Keys(), c.Node
	o.Batch, o.ClaimAfter = c.RelayBatch, c.RelayClaimAfter
	o.WaitReplicas, o.WaitTimeout = c.WaitReplicas, c.WaitTimeout
	return o
}

// Register adds every setting of admit to l.
func (c *Admit) Register(l *Loader) {
	c.Server.register(l, "ADMIT_ADDR", "127.0.0.1:8080")
	c.Log.Register(l)
	c.Redis.Register(l)
	c.Postgres.Register(l)
	c.Kafka.Register(l)
	c.Admission.Register(l)
	c.RLS.register(l)
	c.Webhooks.registerAllowPrivate(l)
	c.Billing.Register(l)
	c.Console.Register(l)
	c.Portal.Register(l)
	c.Refusals.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// answerMargin is what HTTP_WRITE_TIMEOUT must leave, past the body's arrival and the
// longest wait for capacity, for the decision itself: its Redis call (REDIS_TIMEOUT), the
// replicas' WAIT, a fail-open event written straight to Kafka.
const answerMargin = 30 * time.Second

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c *Admit) Validate() error {
	var errs []error
	// The write deadline starts once a request's headers are in: a request may then take
	// HTTP_READ_TIMEOUT for its body and wait ADMIT_MAX_WAIT, and must still be answered
	// (an admission answered to nobody would be billed).
	if need := c.Server.ReadTimeout + c.Admission.MaxWait + answerMargin; c.Server.WriteTimeout < need {
		errs = append(errs, fmt.Errorf("HTTP_WRITE_TIMEOUT=%s: want at least HTTP_READ_TIMEOUT + ADMIT_MAX_WAIT + %s = %s, so that a request allowed to wait is still answered",
			c.Server.WriteTimeout, answerMargin, need))
	}
	return errors.Join(c.Server.Validate(), c.Log.Validate(), c.Redis.Validate(), c.Postgres.Validate(), c.Kafka.Validate(),
		c.Admission.Validate(), c.RLS.Validate(), c.Billing.Validate(), c.Console.Validate(), c.Portal.Validate(), c.Refusals.Validate(), prefix("server", errs))
}

// Issuer is who issues the documents of the invoices API: the billing settings, with this
// node's name as the CloudEvents source of the billing events.
func (c Admit) Issuer() invoice.Issuer {
	is := c.Billing.Issuer()
	is.Source = c.Admission.Node
	return is
}

// GRPC is the rate-limit service's listener limits as internal/ops applies them; its metadata
// is bounded by HTTP_MAX_HEADER_BYTES, as the HTTP headers are.
func (c *Admit) GRPC() ops.GRPC {
	g := c.RLS.Limits
	g.MaxHeaderBytes = c.Server.MaxHeaderBytes
	return g
}

// MarkOptions returns o, which carries the idempotency janitor's logger and registerer,
// with the settings of the marks it moves and of the meters it watches.
func (c Admit) MarkOptions(o outbox.MarkOptions) outbox.MarkOptions {
	a := c.Admission
	o.Keys, o.Hot, o.TTL, o.Every = a.Keys(), a.IdempotencyHot, a.IdempotencyTTL, a.IdempotencyMarkEvery
	o.Brokers, o.Topic, o.Group = c.Kafka.Brokers, c.Kafka.Topic, a.MeterGroup
	return o
}
