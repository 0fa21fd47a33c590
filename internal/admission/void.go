package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/lua"
	"github.com/metergate/metergate/pkg/event"
)

// Void is a request whose decision its caller was not told: the script call's outcome is
// unknown (admit answered 503) or the caller hung up. The decision may have been taken,
// and must then bill nothing.
type Void struct {
	// Request is the request as it was sent to Decide (its event id is the attempt's).
	Request Request
	// Reason is event.VoidUnavailable or event.VoidCallerGone.
	Reason string
}

// Void voids v in Redis (lua/void.lua): once every request answered with its decision has
// been voided, the decision's usage.voided event goes into the outbox and its leases are
// released; a replay by its idempotency key then decides afresh. voided is false when
// another request answered with the same decision (a replay) may have been told 200.
//
// Voiding is idempotent, and independent of the order in which Redis runs it and the
// script call of the decision (a call still queued behind a stall is voided when it runs).
func (a *Admitter) Void(ctx context.Context, v Void) (voided bool, err error) {
	r := v.Request
	if err := r.validate(); err != nil {
		return false, err
	}
	shard := a.keys.Shard(r.Policy.Org)
	keys := []string{a.keys.Outbox(shard)}
	field, marked := "", "0"
	if r.IdempotencyKey != "" {
		field = keyspace.IdempotencyField(r.Policy.Account(), r.IdempotencyKey)
	}
	if a.opts.IdempotencyLog != nil {
		marked = "1"
	}
	afterID, afterTime, rest := voidedEventPieces(r, v.Reason)
	n, err := a.runScript(ctx, lua.Void, keys, r.EventID, a.keys.Tag(shard), r.Policy.Org, a.markTTL,
		afterID, afterTime, rest, field, a.idemHot, a.idemTTL, marked, a.idemLegacy, a.keys.EventIDTail(shard, r.Policy.Org)).Int64()
	if err != nil {
		return false, fmt.Errorf("void %s: %w", r.EventID, err)
	}
	return n == 1, nil
}

// voidedEventPieces returns the usage.voided event of v's attempt as void.lua assembles it:
// '{"specversion":"1.0","id":"' + voided id + "/void" + afterID + time + afterTime +
// voided id + rest. The bytes are encoding/json's for VoidedEvent (TestVoidedEventIsJSON).
func voidedEventPieces(r Request, reason string) (afterID, afterTime, rest string) {
	afterID = `","source":` + quote(r.Source) + `,"type":` + quote(event.TypeVoided) + `,"subject":` + quote(r.Policy.Org) + `,"time":"`
	afterTime = envelopeData + `{"event_id":"`
	rest = `","attempt":` + quote(r.EventID) + `,"reason":` + quote(reason) + `}}`
	return afterID, afterTime, rest
}

// VoidedEvent is the usage.voided event of the admitted request voided (r's own event id,
// or the one r replayed), as admit writes it straight to Kafka when Redis cannot take the
// void.
func VoidedEvent(r Request, voided, reason string, at time.Time) (event.CloudEvent, error) {
	return event.New(voided+event.VoidSuffix, r.Source, event.TypeVoided, r.Policy.Org, at,
		event.Voided{EventID: voided, Attempt: r.EventID, Reason: reason})
}
