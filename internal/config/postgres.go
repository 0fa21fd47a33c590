package config

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/metergate/metergate/migrations"
)

// Postgres locates the billing database.
type Postgres struct {
	URL string
	// MigrateURL is the schema owner's URL, for migrations; empty means URL. The services
	// connect through URL as a role that owns nothing (docs/deploy.md#database-roles).
	MigrateURL string
	MaxConns   int
}

// Register adds DATABASE_URL, DATABASE_MIGRATE_URL and DATABASE_MAX_CONNS.
func (c *Postgres) Register(l *Loader) {
	l.String(&c.URL, "DATABASE_URL", "postgres://metergate:metergate@127.0.0.1:5432/metergate?sslmode=disable", "PostgreSQL connection URL")
	l.String(&c.MigrateURL, "DATABASE_MIGRATE_URL", "", "PostgreSQL URL of the schema's owner, used by -migrate (empty: DATABASE_URL)")
	l.Int(&c.MaxConns, "DATABASE_MAX_CONNS", 10, "largest number of pooled PostgreSQL connections")
}

// MigrationURL is the URL migrations run through: MigrateURL, or URL when it is empty.
func (c Postgres) MigrationURL() string {
	if c.MigrateURL != "" {
		return c.MigrateURL
	}
	return c.URL
}

// Validate reports an unparsable URL or a pool size below 1.
func (c Postgres) Validate() error {
	var errs []error
	if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		errs = append(errs, fmt.Errorf("DATABASE_URL: %w", err))
	}
	if c.MigrateURL != "" {
		if _, err := pgxpool.ParseConfig(c.MigrateURL); err != nil {
			errs = append(errs, fmt.Errorf("DATABASE_MIGRATE_URL: %w", err))
		}
	}
	if c.MaxConns < 1 {
		errs = append(errs, fmt.Errorf("DATABASE_MAX_CONNS=%d: want at least 1", c.MaxConns))
	}
	return prefix("postgres", errs)
}

// Open returns a connection pool. Connections are made lazily: it does not wait for the server.
func (c Postgres) Open(ctx context.Context) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = int32(c.MaxConns) //nolint:gosec // validated ≥ 1, and a pool of 2^31 is not a thing
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	return pool, nil
}

// OpenMigrated is Open and, with migrate (-migrate), first checks that PostgreSQL answers
// (within 10 s) and then applies the pending migrations through MigrationURL, logging the
// versions applied.
func (c Postgres) OpenMigrated(ctx context.Context, migrate bool, log *slog.Logger) (*pgxpool.Pool, error) {
	pool, err := c.Open(ctx)
	if err != nil || !migrate {
		return pool, err
	}
	if err := Ping(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	applied, err := migrations.UpURL(ctx, c.MigrationURL())
	if err != nil {
		pool.Close()
		return nil, err
	}
	log.Info("migrations applied", "versions", applied)
	return pool, nil
}

// Ping checks that PostgreSQL answers through pool, within 10 s: for a run-once command,
// which fails at once rather than halfway when the database is not there.
func Ping(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}
