package staff

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// Entry is a row of the audit log: a write through the admin API.
type Entry struct {
	ID     int64           `json:"id"`
	At     time.Time       `json:"at"`
	Actor  string          `json:"actor"` // a staff id, or AdminToken
	Role   Role            `json:"role"`
	Method string          `json:"method"`
	Route  string          `json:"route"` // the route's pattern, e.g. /v1/admin/accounts/{id}
	Path   string          `json:"path"`
	Status int             `json:"status"`
	Before json.RawMessage `json:"before,omitempty"`
	After  json.RawMessage `json:"after,omitempty"`
}

// AdminToken is the actor of the single admin token (ADMIT_ADMIN_TOKEN), an Admin.
const AdminToken = "admin-token"

// The statements of the audit log.
var (
	//go:embed sql/insert_audit.sql
	insertAuditSQL string
	//go:embed sql/audit_entries.sql
	auditEntriesSQL string
)

// Record writes e to the audit log and returns it with its id and time.
func (s *Store) Record(ctx context.Context, e Entry) (Entry, error) {
	nullable := func(m json.RawMessage) any {
		if len(m) == 0 {
			return nil
		}
		return m
	}
	if err := s.pool.QueryRow(ctx, insertAuditSQL, pgx.StrictNamedArgs{
		"actor": e.Actor, "role": string(e.Role), "method": e.Method, "route": e.Route, "path": e.Path,
		"status": e.Status, "before": nullable(e.Before), "after": nullable(e.After),
	}).Scan(&e.ID, &e.At); err != nil {
		return Entry{}, fmt.Errorf("audit %s %s: %w", e.Method, e.Path, err)
	}
	return e, nil
}

// The bounds of a page of the audit log.
const (
	// DefaultEntries is a page's size when its Limit is 0.
	DefaultEntries = 100
	// MaxEntries is the largest page.
	MaxEntries = 500
)

// AuditFilter selects a page of the audit log, newest first.
type AuditFilter struct {
	Actor  string // only this actor's entries (a staff id, AdminToken); "": everyone's
	Before int64  // only entries of a smaller id (the last id of the previous page); 0: from the newest
	Limit  int    // at most this many, up to MaxEntries; 0: DefaultEntries
}

// Audit returns the page of the audit log f selects, newest first.
func (s *Store) Audit(ctx context.Context, f AuditFilter) ([]Entry, error) {
	if f.Before <= 0 {
		f.Before = math.MaxInt64
	}
	if f.Limit <= 0 {
		f.Limit = DefaultEntries
	}
	var actor *string // a NULL filter: every actor (docs/code.md)
	if f.Actor != "" {
		actor = &f.Actor
	}
	rows, err := s.pool.Query(ctx, auditEntriesSQL, pgx.StrictNamedArgs{
		"actor": actor, "before": f.Before, "limit": min(f.Limit, MaxEntries),
	})
	if err != nil {
		return nil, fmt.Errorf("read the audit log: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		var role string
		err := r.Scan(&e.ID, &e.At, &e.Actor, &role, &e.Method, &e.Route, &e.Path, &e.Status, &e.Before, &e.After)
		e.Role = Role(role)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the audit log: %w", err)
	}
	return out, nil
}

// Entries returns a page of everyone's entries, newest first: before an id (0: from the
// newest), at most limit (0: DefaultEntries). It is Audit without an actor.
func (s *Store) Entries(ctx context.Context, before int64, limit int) ([]Entry, error) {
	return s.Audit(ctx, AuditFilter{Before: before, Limit: limit})
}
