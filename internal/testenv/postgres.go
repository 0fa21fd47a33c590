package testenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/metergate/metergate/migrations"
)

// postgresImage is the image testcontainers-go starts when DATABASE_URL is unset.
const postgresImage = "postgres:16"

var pgContainer container[pgURLs]

// pgURLs are the two roles' URLs of the test database: the services' (app) and the
// schema owner's, which creates schemas and applies migrations (owner).
type pgURLs struct{ app, owner string }

// appRole is the group role the migrations grant the services' privileges to
// (migrations/00019_sealed_books.sql); the testcontainers database has a login of that name.
const appRole = "metergate_app"

// DatabaseURL returns the URL of the test PostgreSQL database as the services connect to
// it (DATABASE_URL): a role that owns nothing, when the stack sets up two roles.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	return databaseURLs(tb).app
}

// MigrateDatabaseURL returns the URL of the role that owns the test schemas and applies
// the migrations (DATABASE_MIGRATE_URL; DATABASE_URL when it is unset).
func MigrateDatabaseURL(tb testing.TB) string {
	tb.Helper()
	return databaseURLs(tb).owner
}

// RequireRoles skips (or under METERGATE_REQUIRE_SERVICES fails) the test unless the
// services' role and the owner are two roles, which a test of the sealed books needs.
func RequireRoles(tb testing.TB) {
	tb.Helper()
	u := databaseURLs(tb)
	app, err1 := pgx.ParseConfig(u.app)
	owner, err2 := pgx.ParseConfig(u.owner)
	if err1 != nil || err2 != nil || app.User == owner.User {
		Unavailable(tb, "PostgreSQL with two roles", "DATABASE_MIGRATE_URL", "DATABASE_URL and DATABASE_MIGRATE_URL name the same role")
	}
}

func databaseURLs(tb testing.TB) pgURLs {
	tb.Helper()
	if u := os.Getenv("DATABASE_URL"); u != "" {
		owner := os.Getenv("DATABASE_MIGRATE_URL")
		if owner == "" {
			owner = u
		}
		return pgURLs{app: u, owner: owner}
	}
	if !dockerAvailable() {
		Unavailable(tb, "PostgreSQL", "DATABASE_URL", "DATABASE_URL unset and no Docker daemon")
	}
	u, err := pgContainer.get(func(ctx context.Context) (pgURLs, testcontainers.Container, error) {
		c, err := tcpostgres.Run(ctx, postgresImage,
			tcpostgres.WithDatabase("metergate"), tcpostgres.WithUsername("metergate"),
			tcpostgres.WithPassword("metergate"), tcpostgres.BasicWaitStrategies())
		if err != nil {
			return pgURLs{}, c, err
		}
		owner, err := c.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			return pgURLs{}, c, err
		}
		// The image's user is a superuser: it makes the services' login, as make up does.
		if err := execOnce(ctx, owner, "CREATE ROLE "+appRole+" LOGIN PASSWORD '"+appRole+"'"); err != nil {
			return pgURLs{}, c, err
		}
		app, err := url.Parse(owner)
		if err != nil {
			return pgURLs{}, c, err
		}
		app.User = url.UserPassword(appRole, appRole)
		return pgURLs{app: app.String(), owner: owner}, c, nil
	})
	if err != nil {
		Unavailable(tb, "PostgreSQL", "DATABASE_URL", "testcontainers: "+err.Error())
	}
	containerURLs.Store(&u)
	return u
}

// containerURLs are the testcontainers database's URLs, once it runs.
var containerURLs atomic.Pointer[pgURLs]

// childMigrateURL returns the DATABASE_MIGRATE_URL of a child process given DATABASE_URL
// dbURL: when dbURL is the test database as the services' role (DatabaseURL, perhaps with
// a search_path: WithSearchPath), the owner's URL with dbURL's parameters, so that -migrate
// works in the same schema; otherwise "" (the child migrates through dbURL: a private
// server, say). It never lets a child inherit the owner's URL of another schema.
func childMigrateURL(dbURL string) string {
	known, ok := resolvedURLs()
	if !ok {
		return ""
	}
	d, err1 := url.Parse(dbURL)
	app, err2 := url.Parse(known.app)
	owner, err3 := url.Parse(known.owner)
	if err1 != nil || err2 != nil || err3 != nil || d.Host != app.Host || d.Path != app.Path || d.User.String() != app.User.String() {
		return ""
	}
	q := owner.Query()
	for k, v := range d.Query() {
		q[k] = v
	}
	owner.RawQuery = q.Encode()
	return owner.String()
}

// resolvedURLs returns the URLs DatabaseURL and MigrateDatabaseURL return, if they are
// known without starting anything.
func resolvedURLs() (pgURLs, bool) {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		owner := os.Getenv("DATABASE_MIGRATE_URL")
		if owner == "" {
			owner = u
		}
		return pgURLs{app: u, owner: owner}, true
	}
	if u := containerURLs.Load(); u != nil {
		return *u, true
	}
	return pgURLs{}, false
}

var packageSchema struct {
	once sync.Once
	name string
	err  error
}

// Postgres returns a pool whose connections use this test package's own schema, created
// on first use by the owner role with every migration applied, and dropped by Run. Its
// connections are the services' role (DatabaseURL): what they may not do, the test may not
// either. Tests of one package share the schema: give rows test-unique keys (Name) when
// tests run in parallel.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return packagePool(tb, DatabaseURL(tb))
}

func packagePool(tb testing.TB, dbURL string) *pgxpool.Pool {
	tb.Helper()
	owner := MigrateDatabaseURL(tb)
	packageSchema.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		name := "test_" + unsafeChars.ReplaceAllString(strings.TrimSuffix(filepath.Base(os.Args[0]), ".test"), "_") + "_" + Random(4)
		packageSchema.name, packageSchema.err = name, createSchema(ctx, owner, name)
		if packageSchema.err != nil {
			return
		}
		atExit(func(ctx context.Context) { _ = dropSchema(ctx, owner, name) })
		pool, err := pool(ctx, owner, name)
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
	p, err := pool(Context(tb, 30*time.Second), dbURL, packageSchema.name)
	if err != nil {
		Unavailable(tb, "PostgreSQL", "DATABASE_URL", err.Error())
	}
	tb.Cleanup(p.Close)
	return p
}

// EmptySchema returns a pool on a new schema of this test alone, with no migration applied,
// and the schema's name. The schema and the pool are the owner's (MigrateDatabaseURL): the
// test may migrate through the pool; the services reach the schema through
// WithSearchPath(t, DatabaseURL(t), schema). The schema is dropped when the test ends.
func EmptySchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	owner := MigrateDatabaseURL(tb)
	ctx := Context(tb, 30*time.Second)
	name := "test_" + Name(tb)
	if err := createSchema(ctx, owner, name); err != nil {
		Unavailable(tb, "PostgreSQL", "DATABASE_MIGRATE_URL", err.Error())
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := dropSchema(ctx, owner, name); err != nil {
			tb.Errorf("drop schema %s: %v", name, err)
		}
	})
	p, err := pool(ctx, owner, name)
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

// ExecUnsealed runs sql through pool (the owner's: EmptySchema) with the user triggers of
// table disabled, in one transaction that enables them again: a row the sealed books
// refuse, written behind their back, for a test showing that a finance view notices it.
// Only the owner of a table can do this, which is why the services are not it.
func ExecUnsealed(ctx context.Context, pool *pgxpool.Pool, table, sql string, args ...any) error {
	t := pgx.Identifier{table}.Sanitize()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "ALTER TABLE "+t+" DISABLE TRIGGER USER"); err != nil {
			return fmt.Errorf("disable the triggers of %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+t+" ENABLE TRIGGER USER"); err != nil {
			return fmt.Errorf("enable the triggers of %s: %w", table, err)
		}
		return nil
	})
}
