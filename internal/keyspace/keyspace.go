// Package keyspace is a deployment's Redis layout: the names of its keys (Keys), the
// defaults that every binary reading them must agree on, the bounds of what they hold, and
// WaitReplicated, which holds a caller back until replicas hold what it wrote. The admission
// engine, the relay, reconcile and the credit store import it; nothing else cuts a key
// string apart.
package keyspace

import (
	"errors"
	"time"
)

// A deployment's defaults, shared by admit's and reconcile's configuration: they must
// agree on the keys.
const (
	// DefaultKeyPrefix starts every Redis key of a deployment.
	DefaultKeyPrefix = "mg"
	// DefaultShards is the number of hash-tag shards.
	DefaultShards = 16
	// DefaultIdempotencyTTL is the idempotency window W: a retry within W of the first
	// request is charged once (between W and 2W it may or may not be).
	DefaultIdempotencyTTL = 24 * time.Hour
	// MinIdempotencyTTL is the shortest idempotency window a deployment may configure.
	MinIdempotencyTTL = time.Minute
	// DefaultIdempotencyHot is the hot window: how long Redis holds an idempotency record
	// exactly when a billing log answers for older keys.
	DefaultIdempotencyHot = 10 * time.Minute
	// DefaultQuotaRetention is how long a quota counter outlives its period, so that
	// reconcile can still correct it before the period is closed.
	DefaultQuotaRetention = 35 * 24 * time.Hour
)

// MaxCounter is the largest value a quota counter takes, capped or not: 2^53 - 1, the
// largest integer the script's Lua numbers hold exactly (lua/admit.lua, MAX_COUNTER). A
// request that would take a counter past it is refused as over its quota.
const MaxCounter = 1<<53 - 1

// ErrUnknownEvent is returned for an event id that Keys.NewEventID did not make (an
// outcome's or a void's malformed id).
var ErrUnknownEvent = errors.New("unknown event id")
