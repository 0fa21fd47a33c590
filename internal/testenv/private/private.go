// Package private starts servers of one test alone: Redis (plain, with an append-only
// file, a replicated pair, a Cluster), PostgreSQL and a Kafka broker, on loopback ports of
// their own, that the test may stop, crash, stall and start again without disturbing the
// shared services the other tests use (internal/testenv). Each is killed when its test
// ends. A missing program skips the test, or fails it under METERGATE_REQUIRE_SERVICES=1.
package private

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/sandbox"
	"github.com/metergate/metergate/internal/testenv"
)

// RedisServer is a redis-server process of one test alone, on a loopback port of its own
// and without persistence unless asked (StartRedisAOF), so that the test can stop it and
// start it again: a Redis outage (and a Redis that lost its data, or a crash recovered from
// its append-only file) without disturbing the shared Redis.
type RedisServer struct {
	tb   testing.TB
	addr string
	dir  string
	path string
	// fsync is the appendfsync policy of the AOF ("always", "everysec", "no"); "" for no
	// AOF at all.
	fsync string
	// extra are more redis-server arguments, such as a cluster node's.
	extra []string

	mu   sync.Mutex
	proc *sandbox.Proc // nil while stopped
}

// StartRedis starts a private Redis (no RDB snapshots, no AOF) and returns once it answers
// PING. It is killed when the test ends.
func StartRedis(tb testing.TB) *RedisServer {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(tb, "a private Redis", "PATH", "redis-server not found")
	}
	r := &RedisServer{tb: tb, addr: testenv.FreeAddr(tb), dir: tb.TempDir(), path: path}
	tb.Cleanup(r.kill)
	r.Start()
	return r
}

// StartRedisAOF starts a private Redis with an append-only file fsynced by fsync
// ("always", "everysec" or "no": Redis's appendfsync) in a data directory of the test,
// and no RDB snapshots. Start after Stop loads the AOF: what a crashed Redis recovers.
func StartRedisAOF(tb testing.TB, fsync string) *RedisServer {
	tb.Helper()
	switch fsync {
	case "always", "everysec", "no":
	default:
		tb.Fatalf("StartRedisAOF: appendfsync %q, want always, everysec or no", fsync)
	}
	path, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(tb, "a private Redis", "PATH", "redis-server not found")
	}
	r := &RedisServer{tb: tb, addr: testenv.FreeAddr(tb), dir: tb.TempDir(), path: path, fsync: fsync}
	tb.Cleanup(r.kill)
	r.Start()
	return r
}

// Addr is the server's host:port.
func (r *RedisServer) Addr() string { return r.addr }

// URL is the server's URL, database 0.
func (r *RedisServer) URL() string { return "redis://" + r.addr + "/0" }

// Start starts the server (again) on the same port and waits until PING answers: empty,
// or with what its append-only file holds (StartRedisAOF).
func (r *RedisServer) Start() {
	r.tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		r.tb.Fatal("private redis already running")
	}
	_, port, _ := net.SplitHostPort(r.addr)
	aof := []string{"--appendonly", "no"}
	if r.fsync != "" {
		aof = []string{"--appendonly", "yes", "--appendfsync", r.fsync}
	}
	args := append([]string{"--bind", "127.0.0.1", "--port", port, "--dir", r.dir,
		"--save", "", "--daemonize", "no", "--protected-mode", "no"}, aof...)
	args = append(args, r.extra...)
	p, err := sandbox.StartCommand(sandbox.Command{Name: "redis-server", Path: r.path, Args: args, Addr: r.addr,
		Log: filepath.Join(r.dir, "redis-server.log"), Group: true})
	if err != nil {
		r.tb.Fatal(err)
	}
	r.proc = p

	c := redis.NewClient(&redis.Options{Addr: r.addr, DialTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if p.Exited() {
			r.proc = nil
			r.tb.Fatalf("private redis on %s exited at start: %v\n%s", r.addr, err, tail(p.Output(), 3000))
		}
		if time.Now().After(deadline) {
			r.tb.Fatalf("private redis on %s did not answer PING within a minute: %v\n%s", r.addr, err, tail(p.Output(), 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: a crash; whatever it held is gone but what its
// append-only file has) and returns once its port refuses connections.
func (r *RedisServer) Stop() {
	r.tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killLocked()
	if err := waitRefused(r.addr, time.Minute); err != nil {
		r.tb.Fatalf("private redis: %v", err)
	}
}

func (r *RedisServer) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killLocked()
}

func (r *RedisServer) killLocked() {
	if r.proc == nil {
		return
	}
	r.proc.Kill()
	r.proc = nil
}

// waitRefused polls addr until a TCP connection to it is refused.
func waitRefused(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
		if c != nil {
			_ = c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still accepts connections after %s", addr, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PostgresServer is a PostgreSQL server (its own initdb, its own port) of one test alone,
// so that the test can stop, start and restart it without disturbing the shared one.
// As root it runs as the system user postgres (PostgreSQL refuses root), like
// deploy/local/stack.sh.
type PostgresServer struct {
	tb   testing.TB
	bin  string // the server's bin directory
	dir  string // data, socket and log live under it
	port string
	db   string
	asPG bool // run the server's programs as the user postgres (the test runs as root)

	mu      sync.Mutex
	running bool
}

// pgBinDir finds the PostgreSQL server programs: the newest /usr/lib/postgresql/*/bin with
// initdb and postgres, else initdb on the PATH.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) && isExec(filepath.Join(d, "pg_ctl")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "pg_ctl")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb, pg_ctl and postgres under /usr/lib/postgresql/*/bin or on the PATH")
}

func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// StartPostgres initdbs a private cluster in a temporary directory, starts it on a free
// loopback port (its unix socket in that directory), creates a database and returns once
// the database accepts connections. The server is stopped and its directory removed when
// the test ends.
func StartPostgres(tb testing.TB) *PostgresServer {
	tb.Helper()
	bin, err := pgBinDir()
	if err != nil {
		testenv.Unavailable(tb, "a private PostgreSQL", "PATH", err.Error())
	}
	asPG := os.Geteuid() == 0
	var uid, gid int
	if asPG {
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(tb, "a private PostgreSQL", "PATH", "running as root and there is no user postgres to run the server as (deploy/local/stack.sh creates it)")
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		if _, err := exec.LookPath("runuser"); err != nil {
			testenv.Unavailable(tb, "a private PostgreSQL", "PATH", "running as root and runuser not found")
		}
	}
	// Not tb.TempDir: its parents are root's and closed to the user postgres.
	dir, err := os.MkdirTemp("", "metergate-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if asPG {
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatalf("chown %s: %v", dir, err)
		}
	}
	_, port, _ := net.SplitHostPort(testenv.FreeAddr(tb))
	p := &PostgresServer{tb: tb, bin: bin, dir: dir, port: port, db: "metergate", asPG: asPG}

	if out, err := p.run("initdb", "-D", p.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--locale=C.UTF-8", "--no-sync"); err != nil {
		if out2, err2 := p.run("initdb", "-D", p.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8",
			"--no-locale", "--no-sync"); err2 != nil {
			tb.Fatalf("initdb: %v\n%s\n%v\n%s", err, out, err2, out2)
		}
	}
	if err := os.Mkdir(p.sock(), 0o755); err != nil {
		tb.Fatal(err)
	}
	if asPG {
		if err := os.Chown(p.sock(), uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(p.stopAtEnd)
	p.Start()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:"+port+"/postgres?sslmode=disable")
	if err != nil {
		tb.Fatalf("connect to the private postgres: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "create database "+p.db); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	return p
}

func (p *PostgresServer) data() string { return filepath.Join(p.dir, "data") }
func (p *PostgresServer) sock() string { return filepath.Join(p.dir, "sock") }
func (p *PostgresServer) logFile() string {
	return filepath.Join(p.dir, "postgres.log")
}

// run runs one of the server's programs (as the user postgres when the test is root).
func (p *PostgresServer) run(prog string, args ...string) (string, error) {
	path := filepath.Join(p.bin, prog)
	var cmd *exec.Cmd
	if p.asPG {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = p.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// URL is the URL of the server's database, as the superuser postgres (trust auth).
func (p *PostgresServer) URL() string {
	return "postgres://postgres@127.0.0.1:" + p.port + "/" + p.db + "?sslmode=disable"
}

// Addr is the server's host:port.
func (p *PostgresServer) Addr() string { return "127.0.0.1:" + p.port }

// Start starts the server (again) on the same data directory and port and waits until it
// accepts connections.
func (p *PostgresServer) Start() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		p.tb.Fatal("private postgres already running")
	}
	opts := strings.Join([]string{"-c listen_addresses=127.0.0.1", "-p " + p.port, "-k " + p.sock(),
		"-c fsync=off", "-c full_page_writes=off", "-c max_connections=100"}, " ")
	if out, err := p.run("pg_ctl", "-D", p.data(), "-l", p.logFile(), "-w", "-t", "120", "start", "-o", opts); err != nil {
		log, _ := os.ReadFile(p.logFile())
		p.tb.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, tail(string(log), 3000))
	}
	p.running = true
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := p.run("pg_isready", "-q", "-h", "127.0.0.1", "-p", p.port)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("private postgres on :%s not ready within a minute: %v %s", p.port, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server with pg_ctl stop -m fast (open transactions are rolled back, the
// clients disconnected) and returns once its port refuses connections.
func (p *PostgresServer) Stop() { p.stop("fast") }

// Kill stops the server with pg_ctl stop -m immediate (a crash: no checkpoint, recovery
// from the WAL at the next start) and returns once its port refuses connections.
func (p *PostgresServer) Kill() { p.stop("immediate") }

// Restart stops the server (fast) and starts it again.
func (p *PostgresServer) Restart() {
	p.tb.Helper()
	p.Stop()
	p.Start()
}

func (p *PostgresServer) stop(mode string) {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return
	}
	if out, err := p.run("pg_ctl", "-D", p.data(), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		p.tb.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	p.running = false
	if err := waitRefused(p.Addr(), time.Minute); err != nil {
		p.tb.Fatalf("private postgres: %v", err)
	}
}

// stopAtEnd stops the server when the test ends: pg_ctl stop -m immediate, then SIGKILL to
// the postmaster named in postmaster.pid if it still runs.
func (p *PostgresServer) stopAtEnd() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _ = p.run("pg_ctl", "-D", p.data(), "-m", "immediate", "-w", "-t", "30", "stop")
	if raw, err := os.ReadFile(filepath.Join(p.data(), "postmaster.pid")); err == nil {
		first, _, _ := strings.Cut(string(raw), "\n")
		if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	p.running = false
}
