// Package migrations holds metergate's PostgreSQL schema as goose SQL migrations, embedded
// in the binaries. An applied migration is never edited: a change is a new file. The
// schema they make, views included, is in schema.sql (generated, kept true by
// TestSchemaSnapshot; not embedded).
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed 0*.sql
var files embed.FS

// FS is the folder of migrations, for goose.NewProvider.
var FS fs.FS = files

// NewProvider returns a goose provider over db. Runs take a PostgreSQL advisory lock, so
// binaries started together with -migrate apply each migration once; a waiting run polls
// for the lock every second, for up to five minutes.
func NewProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return nil, fmt.Errorf("goose session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, FS, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("goose provider: %w", err)
	}
	return p, nil
}

// UpURL applies every pending migration through a connection of its own to url (the
// schema owner's: config.Postgres.MigrationURL) and returns the versions it applied.
func UpURL(ctx context.Context, url string) ([]int64, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("open migration pool: %w", err)
	}
	defer pool.Close()
	return Up(ctx, pool)
}

// Up applies every pending migration through pool and returns the versions it applied.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	p, err := NewProvider(db)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("apply migrations: %w", err)
	}
	versions := make([]int64, 0, len(results))
	for _, r := range results {
		versions = append(versions, r.Source.Version)
	}
	return versions, nil
}
