// Package lua embeds metergate's Redis scripts and exposes them as ready *redis.Script
// values (EVALSHA, falling back to EVAL when the server has not cached the script yet).
package lua

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// mustScript builds a script from the named files, concatenated in order (a shared chunk
// such as clock.lua first).
func mustScript(names ...string) *redis.Script {
	var src []byte
	for _, name := range names {
		b, err := files.ReadFile(name)
		if err != nil {
			panic("lua: missing embedded script " + name) // a build defect, caught by every test
		}
		src = append(src, b...)
	}
	return redis.NewScript(string(src))
}

// Adjust applies one correction to one or more counters exactly once, guarded by a marker
// key written in the same script (see adjust.lua for keys, arguments and reply).
var Adjust = mustScript("adjust.lua")

// Admit takes one or more admission decisions, each all-or-nothing, and writes the usage
// event of each admitted request to the shard's outbox (see admit.lua).
var Admit = mustScript("admit.lua")

// QueueLeave takes a waiting request out of its limit's queue and tells the next waiter
// (see queue_leave.lua).
var QueueLeave = mustScript("queue_leave.lua")

// CreditRestore brings a credit grant in Redis back to its ledger, never above it (see
// credit_restore.lua).
var CreditRestore = mustScript("credit_restore.lua")

// Outcome releases a request's concurrency leases and appends its outcome event to the
// outbox (see outcome.lua).
var Outcome = mustScript("clock.lua", "outcome.lua")

// GrantMirror mirrors a credit grant into Redis, never adding its amount twice and never
// bringing a voided grant back (see grant.lua).
var GrantMirror = mustScript("grant.lua")

// GrantVoid takes what remains of a credit grant out of Redis, once (see grant_void.lua).
var GrantVoid = mustScript("grant_void.lua")

// GrantBalance reads an account's credit grants and Redis TIME in one snapshot (see
// grant_balance.lua).
var GrantBalance = mustScript("grant_balance.lua")

// ForgetConsumer deletes a stream group's consumer if it holds no pending entry (see
// forget_consumer.lua): the relay forgets the consumers of pods that are gone.
var ForgetConsumer = mustScript("forget_consumer.lua")

// MarkRead reads what the idempotency janitor needs of a shard to move its mark: Redis
// TIME, the mark and the oldest entry of each outbox stream (see mark_read.lua).
var MarkRead = mustScript("mark_read.lua")

// MarkMove moves a shard's idempotency mark forward, never back, and deletes the hot
// buckets it passed (see mark_move.lua).
var MarkMove = mustScript("mark_move.lua")

// RelayAck acknowledges outbox entries the relay produced and trims the stream below the
// oldest entry any relay of the group still holds (see relay_ack.lua).
var RelayAck = mustScript("relay_ack.lua")

// Void voids a request no caller was told the decision of: it appends a usage.voided event
// and releases the leases of the decision, once every attempt answered with it was voided
// (see void.lua).
var Void = mustScript("clock.lua", "void.lua")
