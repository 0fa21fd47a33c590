package staff

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/internal/credential"
)

// TokenPrefix starts every staff token: "mgs_" and 43 characters of base64url.
const TokenPrefix = "mgs_"

// idPrefix starts every staff id: "st_" and 16 hex digits (credential.New).
const idPrefix = "st_"

var (
	// ErrInvalid is returned for a staff member that does not validate (an *InvalidError
	// says which field).
	ErrInvalid = errors.New("invalid staff member")
	// ErrExists is returned for a name a live staff member has already.
	ErrExists = errors.New("a staff member of that name exists")
	// ErrNotFound is returned for a staff member that does not exist (or is revoked
	// already, for Revoke) and for a token no live staff member holds.
	ErrNotFound = errors.New("not found")
)

// InvalidError is a staff member that does not validate: Field ("name", "role") says
// what, Message why. It is an ErrInvalid.
type InvalidError struct{ Field, Message string }

func (e *InvalidError) Error() string { return ErrInvalid.Error() + ": " + e.Message }

// Unwrap makes an InvalidError an ErrInvalid.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// Member is a staff member. Its token is never stored: Create returns it once.
type Member struct {
	ID        string     `json:"id"`
	Name      string     `json:"name"`
	Role      Role       `json:"role"`
	CreatedAt time.Time  `json:"created_at"`
	CreatedBy string     `json:"created_by"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	RevokedBy string     `json:"revoked_by,omitempty"`
}

// Store keeps staff members in PostgreSQL.
type Store struct{ pool *pgxpool.Pool }

// NewStore returns a Store over pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// The statements of staff members.
var (
	//go:embed sql/insert_staff.sql
	insertStaffSQL string
	//go:embed sql/staff_by_token.sql
	staffByTokenSQL string
	//go:embed sql/revoke_staff.sql
	revokeStaffSQL string
	//go:embed sql/list_staff.sql
	listStaffSQL string
	//go:embed sql/staff_by_id.sql
	staffByIDSQL string
)

// Create adds a staff member named name with role, made by by, and returns it with its
// token: shown this once, stored as its SHA-256 only.
func (s *Store) Create(ctx context.Context, name string, role Role, by string) (Member, string, error) {
	switch {
	// Characters, not bytes: the bound of the table's CHECK and of the OpenAPI document.
	case strings.TrimSpace(name) == "" || utf8.RuneCountInString(name) > 100 || strings.ContainsFunc(name, unicode.IsControl):
		return Member{}, "", &InvalidError{Field: "name",
			Message: fmt.Sprintf("name %q: 1 to 100 characters, not only spaces, no control characters", name)}
	case !role.Valid():
		return Member{}, "", &InvalidError{Field: "role", Message: fmt.Sprintf("role %q: want one of %v", role, Roles)}
	}
	id, token := credential.New(idPrefix, TokenPrefix)
	m := Member{ID: id, Name: name, Role: role, CreatedBy: by}
	err := s.pool.QueryRow(ctx, insertStaffSQL, pgx.StrictNamedArgs{
		"id": m.ID, "name": name, "role": string(role), "token_hash": credential.Hash(token), "created_by": by,
	}).Scan(&m.CreatedAt)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Member{}, "", fmt.Errorf("staff member %q: %w", name, ErrExists)
	}
	if err != nil {
		return Member{}, "", fmt.Errorf("add staff member %q: %w", name, err)
	}
	return m, token, nil
}

// Authenticate returns the live staff member holding token; ErrNotFound for any other
// token (unknown, revoked, malformed). The lookup is by the token's SHA-256, so no
// comparison of the secret leaks its bytes through time.
func (s *Store) Authenticate(ctx context.Context, token string) (Member, error) {
	if !strings.HasPrefix(token, TokenPrefix) || len(token) > 100 {
		return Member{}, ErrNotFound
	}
	var m Member
	var role string
	err := s.pool.QueryRow(ctx, staffByTokenSQL, pgx.StrictNamedArgs{"token_hash": credential.Hash(token)}).
		Scan(&m.ID, &m.Name, &role, &m.CreatedAt, &m.CreatedBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return Member{}, ErrNotFound
	}
	if err != nil {
		return Member{}, fmt.Errorf("authenticate staff: %w", err)
	}
	m.Role = Role(role)
	return m, nil
}

// Revoke revokes staff member id, by by: its token is refused from the next request on.
// ErrNotFound when there is no live member id.
func (s *Store) Revoke(ctx context.Context, id, by string) error {
	if !credential.ValidID(id, idPrefix) {
		return fmt.Errorf("staff member %q: %w", id, ErrNotFound)
	}
	var at time.Time
	err := s.pool.QueryRow(ctx, revokeStaffSQL, pgx.StrictNamedArgs{"id": id, "revoked_by": by}).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("staff member %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("revoke staff member %q: %w", id, err)
	}
	return nil
}

// Member returns staff member id, revoked or not; ErrNotFound when there is none.
func (s *Store) Member(ctx context.Context, id string) (Member, error) {
	if !credential.ValidID(id, idPrefix) {
		return Member{}, fmt.Errorf("staff member %q: %w", id, ErrNotFound)
	}
	rows, err := s.pool.Query(ctx, staffByIDSQL, pgx.StrictNamedArgs{"id": id})
	if err != nil {
		return Member{}, fmt.Errorf("read staff member %q: %w", id, err)
	}
	m, err := pgx.CollectExactlyOneRow(rows, scanMember)
	if errors.Is(err, pgx.ErrNoRows) {
		return Member{}, fmt.Errorf("staff member %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Member{}, fmt.Errorf("read staff member %q: %w", id, err)
	}
	return m, nil
}

// List returns every staff member, revoked ones too, oldest first.
func (s *Store) List(ctx context.Context) ([]Member, error) {
	rows, err := s.pool.Query(ctx, listStaffSQL)
	if err != nil {
		return nil, fmt.Errorf("list staff: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanMember)
	if err != nil {
		return nil, fmt.Errorf("list staff: %w", err)
	}
	return out, nil
}

// scanMember reads a row of list_staff.sql's columns.
func scanMember(r pgx.CollectableRow) (Member, error) {
	var m Member
	var role string
	err := r.Scan(&m.ID, &m.Name, &role, &m.CreatedAt, &m.CreatedBy, &m.RevokedAt, &m.RevokedBy)
	m.Role = Role(role)
	return m, err
}
