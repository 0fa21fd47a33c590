package console

import (
	"context"

	"github.com/metergate/metergate/internal/gate"
)

// Refusal is a request refused by a limit, as the refusal log keeps it.
type Refusal = gate.Refusal

// Refusals reads the refusal log (refusals.Log).
type Refusals interface {
	Recent(ctx context.Context, org string, limit int) ([]Refusal, error)
	Find(ctx context.Context, org, account, idempotencyKey string) ([]Refusal, error)
}
