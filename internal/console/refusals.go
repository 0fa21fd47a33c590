package console

import (
	"context"
	"time"
)

// Refusal is a request refused by a limit, as the refusal log keeps it.
type Refusal struct {
	Time           time.Time
	Org, Account   string
	Path           []string
	APIKey         string
	IdempotencyKey string
	Status         int
	Code           string
	Level, Unit    string
}

// Refusals reads the refusal log.
type Refusals interface {
	Recent(ctx context.Context, org string, limit int) ([]Refusal, error)
	Find(ctx context.Context, org, account, idempotencyKey string) ([]Refusal, error)
}
