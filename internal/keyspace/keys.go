package keyspace

import (
	"crypto/sha256"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/metergate/metergate/internal/policy"
)

// Keys names the Redis keys of a deployment. Every key an org touches carries the hash
// tag of the org's shard, {N} with N = FNV-1a(org) mod Shards, so one decision touches one
// Redis Cluster slot; the outbox is one stream per shard. The admission engine, the relay,
// reconcile and the credit store use the same names. The methods that take a shard rather
// than an org serve callers that hashed the org already (the engine, once per decision).
type Keys struct {
	// Prefix starts every key ("mg" unless set).
	Prefix string
	// Shards is fixed for the life of a deployment: changing it moves every org's keys.
	Shards int
	// tags holds each shard's "<prefix>{N}:" when built by WithTags.
	tags []string
}

// WithTags returns k with each shard's key start (Tag) built once, for a caller that names
// keys on a hot path (the admission engine).
func (k Keys) WithTags() Keys {
	k.tags = make([]string, k.Shards)
	for i := range k.tags {
		k.tags[i] = k.Prefix + "{" + strconv.Itoa(i) + "}:"
	}
	return k
}

// Shard returns the shard of an org.
func (k Keys) Shard(org string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(org))
	return int(h.Sum32() % uint32(k.Shards)) //nolint:gosec // Shards is 1-1024
}

// Tag is how every key of shard starts: "<prefix>{N}:", the hash tag included. The
// scripts take it to name the keys they build themselves.
func (k Keys) Tag(shard int) string {
	if shard < len(k.tags) {
		return k.tags[shard]
	}
	return k.Prefix + "{" + strconv.Itoa(shard) + "}:"
}

// Outbox is the stream of a shard that the admission script appends usage events to:
// one entry per script call, holding the call's events (lua/admit.lua, "Outbox"), which
// only this version's relay splits (wire.OutboxMessages).
func (k Keys) Outbox(shard int) string { return k.Tag(shard) + "batches" }

// LegacyOutbox is the stream of a shard that the version before wrote one compact event
// per entry to. Its relays read only it (and the stream of the version before it), so
// they never meet an entry of several events; this version's relay reads it too, so that
// what nodes of the earlier version write during a rolling upgrade is relayed.
func (k Keys) LegacyOutbox(shard int) string { return k.Tag(shard) + "events" }

// Outboxes are the streams of a shard the relay reads: Outbox and LegacyOutbox.
func (k Keys) Outboxes(shard int) []string {
	return []string{k.Outbox(shard), k.LegacyOutbox(shard)}
}

// Quota is the counter of what account (of org) used of unit in the period labelled label
// ("YYYY-MM" for monthly quotas, "YYYY-MM-DD" for daily ones): a plain integer string.
func (k Keys) Quota(org, account string, unit policy.Unit, label string) string {
	return k.QuotaIn(k.Shard(org), account, unit, label)
}

// QuotaIn is Quota of an account of an org in shard.
func (k Keys) QuotaIn(shard int, account string, unit policy.Unit, label string) string {
	return k.Tag(shard) + "q:" + account + ":" + string(unit) + ":" + label
}

// Grants is the hash of account's (of org) credit grants of unit: field = grant id →
// the units that remain of it, an integer (lua/admit.lua draws them; reconcile's refunds
// add to them with lua/adjust.lua).
func (k Keys) Grants(org, account string, unit policy.Unit) string {
	return k.GrantsIn(k.Shard(org), account, unit)
}

// GrantsIn is Grants of an account of an org in shard.
func (k Keys) GrantsIn(shard int, account string, unit policy.Unit) string {
	return k.Tag(shard) + "g:" + account + ":" + string(unit)
}

// GrantTerms is the hash beside Grants of how each grant is drawn: field = grant id →
// "<priority>|<effective ms>|<expires ms, 0 for never>" (ms since the epoch).
func (k Keys) GrantTerms(org, account string, unit policy.Unit) string {
	return k.GrantTermsIn(k.Shard(org), account, unit)
}

// GrantTermsIn is GrantTerms of an account of an org in shard.
func (k Keys) GrantTermsIn(shard int, account string, unit policy.Unit) string {
	return k.GrantsIn(shard, account, unit) + "|terms"
}

// GrantVoided is the marker of grant id's void (lua/grant_void.lua), beside the grant's
// hashes: while it is there, the grant is never put back into Redis.
func (k Keys) GrantVoided(org, account string, unit policy.Unit, id string) string {
	return k.Grants(org, account, unit) + "|void:" + id
}

// AlertMarks is the hash beside a quota counter or a grants hash (key) of the alert
// thresholds fired for it (lua/admit.lua, "Alerts"): field = the threshold's spec ("p80",
// "b5000") → 1 for a counter, the arming grant for a balance. A counter's expires with it,
// so a new period re-arms every threshold.
func (k Keys) AlertMarks(key string) string { return key + "|a" }

// QueueChannel is the channel the scripts tell when a waiter leaves a priority queue
// (lua/admit.lua, lua/queue_leave.lua); the message is the queue's key.
func (k Keys) QueueChannel() string { return k.Prefix + ":queues" }

// CreditMarker is the marker key of reconcile's credit adjustment id of org: present
// once the adjustment changed its grant (lua/adjust.lua).
func (k Keys) CreditMarker(org string, id int64) string {
	return k.Tag(k.Shard(org)) + "cadj:" + strconv.FormatInt(id, 10)
}

// Refusals is the stream of org's latest refusals by a limit (internal/refusals): one
// entry per refused request, trimmed to about a fixed number per org and expiring a while
// after the latest, in the hash tag of the org's other keys.
func (k Keys) Refusals(org string) string { return k.Tag(k.Shard(org)) + "r:" + org }

// QuotaPattern matches (SCAN MATCH) every quota counter of the period labelled label, of
// every shard.
func (k Keys) QuotaPattern(label string) string { return k.Prefix + "{*}:q:*:" + label }

// ParseQuota returns the account, unit and period label of a quota counter's key made by
// Quota; ok is false for any other key.
func (k Keys) ParseQuota(key string) (account string, unit policy.Unit, label string, ok bool) {
	rest, found := strings.CutPrefix(key, k.Prefix+"{")
	if !found {
		return "", "", "", false
	}
	if _, rest, found = strings.Cut(rest, "}:q:"); !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 || !policy.Unit(parts[1]).Valid() || !policy.ValidID(parts[0]) {
		return "", "", "", false
	}
	return parts[0], policy.Unit(parts[1]), parts[2], true
}

// Marker is the key that marks correction id applied (lua/adjust.lua), in the hash tag of
// org's counters so that the correction's script touches one Redis Cluster slot.
func (k Keys) Marker(org string, id int64) string {
	return k.Tag(k.Shard(org)) + "adj:" + strconv.FormatInt(id, 10)
}

// Window is the sliding window of account's unit in shard (lua/admit.lua): a sorted set of
// what was admitted in the window, scored by Redis time.
func (k Keys) Window(shard int, account string, unit policy.Unit) string {
	return k.Tag(shard) + "w:" + account + ":" + string(unit)
}

// Leases is the sorted set of account's concurrency slots taken in shard: member = event
// id, score = when the slot lapses (lua/admit.lua).
func (k Keys) Leases(shard int, account string) string { return k.Tag(shard) + "c:" + account }

// LeaseRecord is the record of the slots event eventID took in shard (lua/admit.lua),
// which its outcome releases (lua/outcome.lua).
func (k Keys) LeaseRecord(shard int, eventID string) string {
	return k.Tag(shard) + "l:" + eventID
}

// VoidMark marks event eventID of shard voided (lua/void.lua): a replay of its idempotency
// key decides afresh rather than answer with it (lua/admit.lua, Admitter's billing log
// lookup).
func (k Keys) VoidMark(shard int, eventID string) string { return k.Tag(shard) + "v:" + eventID }

// State is the hash of an org's token buckets in shard: a field per bucket, "<account>:<unit
// letter>", holding its theoretical arrival time (lua/admit.lua).
func (k Keys) State(shard int, org string) string { return k.Tag(shard) + "s:" + org }

// IdempotencyBucket is the hash of the shard's idempotency records written in the hot
// bucket of width w (the hot window) that holds t (IdempotencyHotBucket).
func (k Keys) IdempotencyBucket(shard int, t time.Time, w time.Duration) string {
	return k.IdempotencyHotBucket(shard, t.UnixMilli()/w.Milliseconds())
}

// LegacyIdempotencyBucket is the bucket of the layout before hot buckets that holds t:
// "<prefix>{N}:i:<floor(t / w)>", w the idempotency TTL (admission.Options.IdempotencyLegacy).
func (k Keys) LegacyIdempotencyBucket(shard int, t time.Time, w time.Duration) string {
	return k.Tag(shard) + "i:" + strconv.FormatInt(t.UnixMilli()/w.Milliseconds(), 10)
}

// IdempotencyField names a request's idempotency record in a bucket hash: 16 bytes of
// SHA-256 of the account charged and the key, so the key is scoped by the account and a
// collision is negligible (2^-64 even at billions of records).
func IdempotencyField(account, key string) string {
	sum := IdempotencyHash(account, key)
	return string(sum[:16])
}

// IdempotencyHash is SHA-256 of account, a zero byte and key: the record's field is its
// first 16 bytes, the key's filter positions come from it too.
func IdempotencyHash(account, key string) [sha256.Size]byte {
	h := sha256.New()
	_, _ = h.Write([]byte(account))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// NewEventID returns a new event id for a request of org: a UUIDv7 (time-ordered), the
// shard and the org, "<uuid>.<shard>.<org>", so an outcome names its shard and org.
func (k Keys) NewEventID(org string) string {
	return uuid.Must(uuid.NewV7()).String() + k.EventIDTail(k.Shard(org), org)
}

// EventIDTail is how the event ids of org (of shard) end: ".<shard>.<org>". Idempotency
// records keep only what comes before it (lua/admit.lua).
func (k Keys) EventIDTail(shard int, org string) string {
	return "." + strconv.Itoa(shard) + "." + org
}

// ParseEventID returns the shard and org of an event id made by NewEventID, or
// ErrUnknownEvent.
func (k Keys) ParseEventID(id string) (shard int, org string, err error) {
	u, rest, ok := strings.Cut(id, ".")
	if !ok || len(u) != 36 {
		return 0, "", fmt.Errorf("event id %q: %w", id, ErrUnknownEvent)
	}
	s, org, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", fmt.Errorf("event id %q: %w", id, ErrUnknownEvent)
	}
	shard, err = strconv.Atoi(s)
	if _, perr := uuid.Parse(u); perr != nil || err != nil || shard < 0 || shard >= k.Shards ||
		!policy.ValidID(org) || k.Shard(org) != shard {
		return 0, "", fmt.Errorf("event id %q: %w", id, ErrUnknownEvent)
	}
	return shard, org, nil
}

// IdempotencyMark is the shard's mark: ms since the epoch (Redis time) before which every
// event the shard admitted is in the billing log. The relay's janitor moves it forward,
// never back; the script looks for records in every hot bucket from the one holding the
// mark on (the whole TTL when there is no mark).
func (k Keys) IdempotencyMark(shard int) string { return k.Tag(shard) + "h:mark" }

// IdempotencyHotBucket is the hash of the shard's idempotency records written in hot
// bucket b (b = floor(ms since the epoch / hot window)).
func (k Keys) IdempotencyHotBucket(shard int, b int64) string {
	return k.Tag(shard) + "h:" + strconv.FormatInt(b, 10)
}

// IdempotencyFilter is the shard's Bloom filter of the keys admitted in generation g (g =
// floor(ms since the epoch / (TTL / 2))): a string of admission.Options.IdempotencyFilterBits
// bits.
func (k Keys) IdempotencyFilter(shard int, g int64) string {
	return k.Tag(shard) + "f:" + strconv.FormatInt(g, 10)
}
