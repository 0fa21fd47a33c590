package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/metergate/metergate/internal/admission"
	"github.com/metergate/metergate/internal/estimate"
	"github.com/metergate/metergate/internal/invoice"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/ops"
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
	// Migrate applies pending migrations before serving.
	Migrate bool
}

// keyPrefix keeps the Redis keys free of hash-tag braces and spaces.
var keyPrefix = regexp.MustCompile(`^[A-Za-z0-9:._-]{1,64}$`)

// Admission is how admit decides and whom it serves.
type Admission struct {
	ServiceToken   string
	AdminToken     string
	Node           string
	KeyPrefix      string
	Shards         int
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
	Check CheckHeaders
	// RevealAccounts shows end clients behind a gateway every account id of their path
	// (api.Config.RevealAccounts); off, they see their own only.
	RevealAccounts bool
	// MaxEstimates bounds the token estimates of large bodies running at once.
	MaxEstimates int
}

// CheckHeaders are the header names of the forward-auth check (api.CheckHeaders).
type CheckHeaders struct {
	Token, APIKey, Account, Tokens, Tool, IdempotencyKey string
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
	l.String(&c.KeyPrefix, "ADMIT_KEY_PREFIX", keyspace.DefaultKeyPrefix, "start of every Redis key (several deployments, or tests, on one Redis)")
	l.Int(&c.Shards, "ADMIT_SHARDS", keyspace.DefaultShards, "Redis hash-tag shards; fixed for the life of a deployment")
	l.Duration(&c.IdempotencyTTL, "ADMIT_IDEMPOTENCY_TTL", keyspace.DefaultIdempotencyTTL, "idempotency TTL: a retry within it is charged once (at least 1m); without the billing log (ADMIT_IDEMPOTENCY_HOT=0) one between TTL and 2 TTL may be charged again")
	l.Bool(&c.IdempotencyLegacy, "ADMIT_IDEMPOTENCY_LEGACY", true, "also honour idempotency records written by versions before the bucket layout (turn off 24h after the upgrade)")
	l.Duration(&c.IdempotencyHot, "ADMIT_IDEMPOTENCY_HOT", keyspace.DefaultIdempotencyHot, "hot window H: Redis holds idempotency records exactly for H (and until their events are in PostgreSQL), older keys are answered from the billing log; 0: every record in Redis for the TTL")
	l.Int(&c.IdempotencyFilterBits, "ADMIT_IDEMPOTENCY_FILTER_BITS", admission.DefaultIdempotencyFilterBits, "bits of one idempotency filter (per shard and half TTL): about 9.6 per key admitted with a key in that time for 1% of lookups in the billing log")
	l.Duration(&c.IdempotencyMarkEvery, "ADMIT_IDEMPOTENCY_MARK_EVERY", 10*time.Second, "how often the relay's janitor moves each shard's idempotency mark (what is in PostgreSQL) and deletes the hot buckets it passed")
	l.String(&c.MeterGroup, "METER_GROUP", "metergate-meter", "Kafka consumer group of the meters")
	l.Duration(&c.LeaseTTL, "ADMIT_LEASE_TTL", admission.DefaultLeaseTTL, "how long a concurrency slot is held when no outcome releases it")
	l.Duration(&c.PolicyReload, "ADMIT_POLICY_RELOAD", 30*time.Second, "full policy reload period (changes arrive sooner through LISTEN/NOTIFY)")
	l.String(&c.RedisDownRateOnly, "ADMIT_REDIS_DOWN_RATE_ONLY", "open", "while Redis is down, accounts without quotas: open (admit, record straight to Kafka) or closed (503)")
	l.String(&c.RedisDownQuota, "ADMIT_REDIS_DOWN_QUOTA", "closed", "while Redis is down, accounts with quotas: closed (503) or open")
	l.Bool(&c.Relay, "ADMIT_RELAY", true, "run the outbox relay (Redis → Kafka) in this process")
	l.Int(&c.RelayBatch, "ADMIT_RELAY_BATCH", 500, "most outbox entries per Kafka write")
	l.Duration(&c.RelayClaimAfter, "ADMIT_RELAY_CLAIM_AFTER", 30*time.Second, "how long entries read and not acknowledged by another relay wait before this one takes them over")
	l.Duration(&c.OutboxMaxAge, "ADMIT_OUTBOX_MAX_AGE", time.Minute, "age of the oldest unrelayed event past which /readyz reports the outbox degraded")
	l.Int(&c.WaitReplicas, "ADMIT_REDIS_WAIT_REPLICAS", 0, "replicas that must acknowledge a decision's writes (Redis WAIT) before it is answered; 1 with Sentinel or a Cluster with replicas")
	l.Duration(&c.WaitTimeout, "ADMIT_REDIS_WAIT_TIMEOUT", 100*time.Millisecond, "longest WAIT for ADMIT_REDIS_WAIT_REPLICAS; short of them the decision is answered 503 and voided")
	l.Int(&c.MaxBatch, "ADMIT_MAX_BATCH", 16, "most decisions of one shard per script call (1 = no grouping)")
	l.Int(&c.Pipeline, "ADMIT_PIPELINE", admission.DefaultPipeline, "most script calls in flight per shard")
	l.List(&c.toolsRaw, "ADMIT_TOOL_CREDITS", []string{"web_search=1", "llm_call=3", "code_execute=5", "image_generate=10"}, "credits per tool call, name=credits,...")
	l.Duration(&c.MaxWait, "ADMIT_MAX_WAIT", 30*time.Second, "longest max_wait_ms a request may give to wait for capacity (0 disables waiting; at most 10m)")
	l.Bool(&c.Shadow, "ADMIT_SHADOW", false, "shadow mode for every account: decide and record, count refusals, never refuse")
	l.Bool(&c.RevealAccounts, "ADMIT_GATEWAY_REVEAL_ACCOUNTS", false, "show end clients behind a gateway (the check, the rate-limit service) the ids of every account of their path; off: their own account's id only, the others by their kind (org, team, ...)")
	l.Int(&c.MaxEstimates, "ADMIT_MAX_ESTIMATES", 0, "most token estimates of large bodies (POST /v1/estimate, POST /v1/admit with an estimate) running at once; one more waits up to 1 s, then gets 503 busy (0: 2 × GOMAXPROCS)")
	l.String(&c.Check.Token, "ADMIT_CHECK_TOKEN_HEADER", "X-Metergate-Token", "header of GET /v1/check carrying the service token (Authorization takes \"Bearer <token>\")")
	l.String(&c.Check.APIKey, "ADMIT_CHECK_API_KEY_HEADER", "X-Api-Key", "header of GET /v1/check carrying the end customer's API key")
	l.String(&c.Check.Account, "ADMIT_CHECK_ACCOUNT_HEADER", "", "header of GET /v1/check naming the account, for gateways that authenticate clients and overwrite it (empty: off)")
	l.String(&c.Check.Tokens, "ADMIT_CHECK_TOKENS_HEADER", "X-Estimated-Tokens", "header of GET /v1/check carrying the request's estimated tokens")
	l.String(&c.Check.Tool, "ADMIT_CHECK_TOOL_HEADER", "X-Tool", "header of GET /v1/check naming the tool called")
	l.String(&c.Check.IdempotencyKey, "ADMIT_CHECK_IDEMPOTENCY_HEADER", "Idempotency-Key", "header of GET /v1/check carrying the idempotency key")
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
	if !keyPrefix.MatchString(c.KeyPrefix) {
		errs = append(errs, fmt.Errorf("ADMIT_KEY_PREFIX=%q: want 1-64 of [A-Za-z0-9:._-]", c.KeyPrefix))
	}
	if c.Shards < 1 || c.Shards > 1024 {
		errs = append(errs, fmt.Errorf("ADMIT_SHARDS=%d: want 1-1024", c.Shards))
	}
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
		c.Admission.Validate(), c.RLS.Validate(), prefix("server", errs))
}

// GRPC is the rate-limit service's listener limits as internal/ops applies them; its metadata
// is bounded by HTTP_MAX_HEADER_BYTES, as the HTTP headers are.
func (c *Admit) GRPC() ops.GRPC {
	g := c.RLS.Limits
	g.MaxHeaderBytes = c.Server.MaxHeaderBytes
	return g
}

// Meter is the configuration of cmd/meter.
type Meter struct {
	Server   Server
	Log      Log
	Postgres Postgres
	Kafka    Kafka
	// Group is the Kafka consumer group of the meters.
	Group string
	// BatchSize is the most messages written per PostgreSQL transaction; BatchWait how long
	// a batch waits to fill once its first message is in.
	BatchSize int
	BatchWait time.Duration
	// SessionTimeout is how long the group waits for a silent meter before giving its
	// partitions to the others.
	SessionTimeout time.Duration
	// DeliverWebhooks runs the webhook deliverer in the meter (METER_WEBHOOKS).
	DeliverWebhooks bool
	Webhooks        Webhooks
	Migrate         bool
}

// Webhooks is how webhook targets are guarded (admit and meter) and deliveries retried
// (meter's deliverer, internal/webhook).
type Webhooks struct {
	AllowPrivate bool
	Timeout      time.Duration
	Poll         time.Duration
	Concurrency  int
	BackoffBase  time.Duration
	BackoffCap   time.Duration
	RetryFor     time.Duration
	DisableAfter int
}

func (c *Webhooks) registerAllowPrivate(l *Loader) {
	l.Bool(&c.AllowPrivate, "WEBHOOK_ALLOW_PRIVATE", false, "let webhook endpoints be loopback, private or link-local addresses (tests, private deployments)")
}

// Register adds the WEBHOOK_* settings of the deliverer.
func (c *Webhooks) Register(l *Loader) {
	c.registerAllowPrivate(l)
	l.Duration(&c.Timeout, "WEBHOOK_TIMEOUT", 10*time.Second, "bound of one delivery attempt, connection to the end of the reply")
	l.Duration(&c.Poll, "WEBHOOK_POLL", time.Second, "how often due deliveries are looked for (a queued alert wakes the deliverer sooner through LISTEN/NOTIFY)")
	l.Int(&c.Concurrency, "WEBHOOK_CONCURRENCY", 8, "most delivery attempts in flight per meter")
	l.Duration(&c.BackoffBase, "WEBHOOK_BACKOFF_BASE", 5*time.Second, "retry n waits a random time up to min(WEBHOOK_BACKOFF_CAP, base·2^(n-1))")
	l.Duration(&c.BackoffCap, "WEBHOOK_BACKOFF_CAP", time.Hour, "longest wait between two attempts of a delivery")
	l.Duration(&c.RetryFor, "WEBHOOK_RETRY_FOR", 24*time.Hour, "how long after its first attempt a delivery is retried before it is failed")
	l.Int(&c.DisableAfter, "WEBHOOK_DISABLE_AFTER", 50, "failed attempts in a row, across an endpoint's deliveries, that disable it")
}

// Validate reports every bad deliverer setting.
func (c Webhooks) Validate() error {
	var errs []error
	for name, d := range map[string]time.Duration{"WEBHOOK_TIMEOUT": c.Timeout, "WEBHOOK_POLL": c.Poll,
		"WEBHOOK_BACKOFF_BASE": c.BackoffBase, "WEBHOOK_BACKOFF_CAP": c.BackoffCap, "WEBHOOK_RETRY_FOR": c.RetryFor} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s=%s: want more than 0", name, d))
		}
	}
	if c.BackoffCap < c.BackoffBase {
		errs = append(errs, fmt.Errorf("WEBHOOK_BACKOFF_CAP=%s: want at least WEBHOOK_BACKOFF_BASE (%s)", c.BackoffCap, c.BackoffBase))
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("WEBHOOK_CONCURRENCY=%d: want 1-1024", c.Concurrency))
	}
	if c.DisableAfter < 1 {
		errs = append(errs, fmt.Errorf("WEBHOOK_DISABLE_AFTER=%d: want at least 1", c.DisableAfter))
	}
	return prefix("webhooks", errs)
}

// Register adds every setting of meter to l.
func (c *Meter) Register(l *Loader) {
	c.Server.register(l, "METER_ADDR", "127.0.0.1:8081")
	c.Log.Register(l)
	c.Postgres.Register(l)
	c.Kafka.Register(l)
	l.String(&c.Group, "METER_GROUP", "metergate-meter", "Kafka consumer group of the meters")
	l.Int(&c.BatchSize, "METER_BATCH_SIZE", 1000, "most messages per batch (one PostgreSQL transaction, then one offset commit)")
	l.Duration(&c.BatchWait, "METER_BATCH_WAIT", 200*time.Millisecond, "how long a batch waits to fill once its first message is in")
	l.Duration(&c.SessionTimeout, "METER_SESSION_TIMEOUT", 30*time.Second, "how long the consumer group waits for a silent meter before giving its partitions to the others (within the broker's group.min/max.session.timeout.ms)")
	l.Bool(&c.DeliverWebhooks, "METER_WEBHOOKS", true, "run the webhook deliverer in this process (docs/webhooks.md)")
	c.Webhooks.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Meter) Validate() error {
	var errs []error
	if c.Group == "" {
		errs = append(errs, errors.New("METER_GROUP: must not be empty"))
	}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		errs = append(errs, fmt.Errorf("METER_BATCH_SIZE=%d: want 1-100000", c.BatchSize))
	}
	if c.BatchWait <= 0 || c.BatchWait > time.Minute {
		errs = append(errs, fmt.Errorf("METER_BATCH_WAIT=%s: want more than 0 and at most 1m", c.BatchWait))
	}
	if c.SessionTimeout < time.Second || c.SessionTimeout > 30*time.Minute {
		errs = append(errs, fmt.Errorf("METER_SESSION_TIMEOUT=%s: want 1s-30m", c.SessionTimeout))
	}
	return errors.Join(c.Server.Validate(), c.Log.Validate(), c.Postgres.Validate(), c.Kafka.Validate(), prefix("meter", errs), c.Webhooks.Validate())
}

// Reconcile is the configuration of cmd/reconcile, a run-once job.
type Reconcile struct {
	Log      Log
	Redis    Redis
	Postgres Postgres
	// KeyPrefix and Shards name the quota counters: they must be admit's (the same
	// variables, ADMIT_KEY_PREFIX and ADMIT_SHARDS).
	KeyPrefix string
	Shards    int
	Migrate   bool
	// DryRun (-dry-run) prints the plan and changes nothing; JSON (-json) prints the summary
	// as one JSON object. Flags only: they describe one invocation, not a deployment.
	DryRun bool
	JSON   bool
	// Period (-period YYYY-MM), Force (-force), Grace (-grace), Org (-org) and Format
	// (-format csv|json) are the flags of `reconcile close` and `reconcile invoice`.
	Period string
	Force  bool
	Grace  time.Duration
	Org    string
	Format string
}

// Register adds every setting of reconcile to l.
func (c *Reconcile) Register(l *Loader) {
	c.Log.Register(l)
	c.Redis.Register(l)
	c.Postgres.Register(l)
	l.String(&c.KeyPrefix, "ADMIT_KEY_PREFIX", keyspace.DefaultKeyPrefix, "start of every Redis key: admit's value")
	l.Int(&c.Shards, "ADMIT_SHARDS", keyspace.DefaultShards, "Redis hash-tag shards: admit's value")
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
	l.fs.BoolVar(&c.DryRun, "dry-run", false, "print the corrections a run would make and change nothing")
	l.fs.BoolVar(&c.JSON, "json", false, "print the run's summary (or verify's differences) as one JSON object")
	l.fs.StringVar(&c.Period, "period", "", "close, invoice: the billing period, YYYY-MM (close: default the last month whose end plus the grace has passed)")
	l.fs.BoolVar(&c.Force, "force", false, "close: close before the period's end plus the grace")
	l.fs.DurationVar(&c.Grace, "grace", invoice.DefaultGrace, "close: how long after the period's end late events are still awaited")
	l.fs.StringVar(&c.Org, "org", "", "invoice: the org whose invoice to export")
	l.fs.StringVar(&c.Format, "format", "json", "invoice: csv or json")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Reconcile) Validate() error {
	var errs []error
	if !keyPrefix.MatchString(c.KeyPrefix) {
		errs = append(errs, fmt.Errorf("ADMIT_KEY_PREFIX=%q: want 1-64 of [A-Za-z0-9:._-]", c.KeyPrefix))
	}
	if c.Shards < 1 || c.Shards > 1024 {
		errs = append(errs, fmt.Errorf("ADMIT_SHARDS=%d: want 1-1024", c.Shards))
	}
	return errors.Join(c.Log.Validate(), c.Redis.Validate(), c.Postgres.Validate(), prefix("reconcile", errs))
}

// Validator is a configuration that can check itself.
type Validator interface{ Validate() error }

// Registrar is a configuration that registers its settings on a Loader.
type Registrar interface{ Register(*Loader) }

// Config is what each binary's configuration is.
type Config interface {
	Registrar
	Validator
}

// Load fills cfg from env and args and validates it. The error lists every problem, each
// naming its variable; flag.ErrHelp is returned as is when -h was asked for. validateOnly
// reports the -validate flag: check the configuration and exit.
func Load(cfg Config, name string, args []string, env func(string) (string, bool), output io.Writer) (validateOnly bool, err error) {
	l := NewLoader(name, env, output)
	cfg.Register(l)
	l.fs.BoolVar(&validateOnly, "validate", false, "validate the configuration and exit")
	if err := l.Parse(args); errors.Is(err, flag.ErrHelp) {
		return false, err
	} else if err != nil {
		return false, errors.Join(err, cfg.Validate())
	}
	return validateOnly, cfg.Validate()
}

// LoadOrExit is Load for a main, over args (os.Args[1:] less any subcommand) and the
// environment: it exits 0 after -h or after a valid -validate, and prints every problem
// and exits 2 on a bad setting.
func LoadOrExit(cfg Config, name string, args []string) {
	validateOnly, err := Load(cfg, name, args, os.LookupEnv, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: invalid configuration:\n%v\n", name, err)
		os.Exit(2)
	case validateOnly:
		fmt.Fprintf(os.Stderr, "%s: configuration is valid\n", name)
		os.Exit(0)
	}
}
