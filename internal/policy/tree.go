package policy

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/list_children.sql
	listChildrenSQL string
	//go:embed sql/list_api_keys.sql
	listAPIKeysSQL string
	//go:embed sql/read_api_key.sql
	readAPIKeySQL string
)

// MaxPage bounds the rows one call of Children or APIKeys returns.
const MaxPage = 200

// Children returns the children of parent with ids after after, by id, at most limit
// (1 to MaxPage), without their overrides (GetAccount reads those).
func (s *Store) Children(ctx context.Context, parent, after string, limit int) ([]Account, error) {
	if !ValidID(parent) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, listChildrenSQL, pgx.StrictNamedArgs{"parent": parent, "after": after, "limit": min(max(limit, 1), MaxPage)})
	if err != nil {
		return nil, fmt.Errorf("list children of %q: %w", parent, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Account, error) {
		var a Account
		err := r.Scan(&a.ID, &a.Kind, &a.Parent, &a.Org, &a.Plan, &a.Concurrency, &a.Priority, &a.Shadow, &a.CreatedAt, &a.UpdatedAt)
		return a, err
	})
}

// APIKeys returns account's API keys, revoked ones included, newest first, at most
// MaxPage.
func (s *Store) APIKeys(ctx context.Context, account string) ([]APIKey, error) {
	if !ValidID(account) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, listAPIKeysSQL, pgx.StrictNamedArgs{"account": account, "limit": MaxPage})
	if err != nil {
		return nil, fmt.Errorf("list api keys of %q: %w", account, err)
	}
	return pgx.CollectRows(rows, scanAPIKey)
}

// APIKey returns the key id, revoked or not; ErrNotFound if there is none.
func (s *Store) APIKey(ctx context.Context, id string) (APIKey, error) {
	if !ValidID(id) {
		return APIKey{}, fmt.Errorf("api key %q: %w", id, ErrNotFound)
	}
	rows, err := s.pool.Query(ctx, readAPIKeySQL, pgx.StrictNamedArgs{"id": id})
	if err != nil {
		return APIKey{}, fmt.Errorf("read api key %q: %w", id, err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, scanAPIKey)
	if errors.Is(err, pgx.ErrNoRows) {
		return APIKey{}, fmt.Errorf("api key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, fmt.Errorf("read api key %q: %w", id, err)
	}
	return k, nil
}

func scanAPIKey(r pgx.CollectableRow) (APIKey, error) {
	var k APIKey
	err := r.Scan(&k.ID, &k.Account, &k.CreatedAt, &k.RevokedAt)
	return k, err
}
