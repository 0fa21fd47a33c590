package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/metergate/metergate/migrations"
)

// PostgresImage is the image testcontainers-go starts when DATABASE_URL is unset.
const PostgresImage = "postgres:16"

var pgContainer container[string]

// DatabaseURL returns the URL of the test PostgreSQL database.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	if !dockerAvailable() {
		unavailable(tb, "PostgreSQL", "DATABASE_URL", "DATABASE_URL unset and no Docker daemon")
	}
	u, err := pgContainer.get(func(ctx context.Context) (string, testcontainers.Container, error) {
		c, err := tcpostgres.Run(ctx, PostgresImage,
			tcpostgres.WithDatabase("metergate"), tcpostgres.WithUsername("metergate"),
			tcpostgres.WithPassword("metergate"), tcpostgres.BasicWaitStrategies())
		if err != nil {
			return "", c, err
		}
		u, err := c.ConnectionString(ctx, "sslmode=disable")
		return u, c, err
	})
	if err != nil {
		unavailable(tb, "PostgreSQL", "DATABASE_URL", "testcontainers: "+err.Error())
	}
	return u
}

var packageSchema struct {
	once sync.Once
	name string
	err  error
}

// Postgres returns a pool whose connections use this test package's own schema, created
// on first use with every migration applied and dropped by Run. Tests of one package
// share it: give rows test-unique keys (Name) when tests run in parallel.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := DatabaseURL(tb)
	packageSchema.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		name := "test_" + unsafeChars.ReplaceAllString(strings.TrimSuffix(filepath.Base(os.Args[0]), ".test"), "_") + "_" + Random(4)
		packageSchema.name, packageSchema.err = name, createSchema(ctx, url, name)
		if packageSchema.err != nil {
			return
		}
		atExit(func(ctx context.Context) { _ = dropSchema(ctx, url, name) })
		pool, err := pool(ctx, url, name)
		if err != nil {
			packageSchema.err = err
			return
		}
		defer pool.Close()
		_, packageSchema.err = migrations.Up(ctx, pool)
	})
	if packageSchema.err != nil {
		tb.Fatalf("prepare test schema: %v", packageSchema.err)
	}
	p, err := pool(Context(tb, 30*time.Second), url, packageSchema.name)
	if err != nil {
		unavailable(tb, "PostgreSQL", "DATABASE_URL", err.Error())
	}
	tb.Cleanup(p.Close)
	return p
}

// EmptySchema returns a pool on a new schema of this test alone, with no migration applied,
// and the schema's name. The schema is dropped when the test ends.
func EmptySchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	url := DatabaseURL(tb)
	ctx := Context(tb, 30*time.Second)
	name := "test_" + Name(tb)
	if err := createSchema(ctx, url, name); err != nil {
		unavailable(tb, "PostgreSQL", "DATABASE_URL", err.Error())
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropSchema(ctx, url, name); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	p, err := pool(ctx, url, name)
	if err != nil {
		tb.Fatalf("pool on schema %s: %v", name, err)
	}
	tb.Cleanup(p.Close)
	return p, name
}

// pool opens a pool on url whose search_path is schema, and checks that it answers.
func pool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("ping postgres: %w", err)
	}
	return p, nil
}

func execOnce(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect postgres: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

func createSchema(ctx context.Context, url, name string) error {
	return execOnce(ctx, url, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
}

func dropSchema(ctx context.Context, url, name string) error {
	return execOnce(ctx, url, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
}
