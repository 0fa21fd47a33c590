package admission

import "github.com/metergate/metergate/internal/keyspace"

// IdempotencyRecord returns the field and the head of an idempotency record as the script
// writes them for a request of account with key, units and tool (tests write records of
// the previous layout with it).
func IdempotencyRecord(r Request, eventID, period string) (field, head string) {
	return keyspace.IdempotencyField(r.Policy.Account(), r.IdempotencyKey),
		eventID + " " + period + " " + shortFingerprint(fingerprint(r.Units, r.Tool))
}
