// Package sandbox runs metergate's binaries on the local stack in a space of their own: a
// fresh database (or schema), a Redis key prefix and Kafka topics, with the binaries as
// child processes whose output goes to log files. make demo and make bench use it, and
// Proc, the one process runner, serves the tests too (internal/testenv).
package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process (admit, meter, a test binary, a private redis-server) with its
// output in a log file. It is the one way metergate's tools and tests run a process that
// outlives a call: make demo and make bench through Start, tests through testenv.Start
// and their private servers through StartCommand.
type Proc struct {
	name    string
	addr    string // host:port it serves on
	logPath string
	group   bool // the process leads a process group of its own, killed whole
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Command says how StartCommand starts a process.
type Command struct {
	// Name names the process in errors ("meter", "redis-server").
	Name string
	// Path is the program; Args its arguments.
	Path string
	Args []string
	// Env is added to this process's environment ("K=V").
	Env []string
	// Addr is the host:port it serves on (URL, WaitReady); "" for none.
	Addr string
	// Log is the file its stdout and stderr go to: created (emptied), or appended to with
	// AppendLog, which keeps the output of the runs before a restart.
	Log       string
	AppendLog bool
	// Group starts the process as the leader of a process group of its own, which Kill
	// ends whole: what it started goes with it (a JVM's children, say).
	Group bool
}

// Start starts binDir/name with env on top of this process's environment, its stdout
// and stderr going to logDir/name.log.
func Start(binDir, logDir, name, addr string, env []string, args ...string) (*Proc, error) {
	return StartAs(binDir, logDir, name, name, addr, env, args...)
}

// StartAs is Start with a name of its own for the process and its log (logDir/name.log),
// for a binary run in more than one role ("relay": admit relay).
func StartAs(binDir, logDir, bin, name, addr string, env []string, args ...string) (*Proc, error) {
	return StartCommand(Command{Name: name, Path: filepath.Join(binDir, bin), Args: args, Env: env, Addr: addr,
		Log: filepath.Join(logDir, name+".log")})
}

// StartCommand starts c.
func StartCommand(c Command) (*Proc, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if c.AppendLog {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(c.Log, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", c.Name, err)
	}
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	if c.Group {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", c.Name, err)
	}
	p := &Proc{name: c.Name, addr: c.Addr, logPath: c.Log, group: c.Group, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// URL is the process's base URL.
func (p *Proc) URL() string { return "http://" + p.addr }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitReady polls /readyz until it answers 200, the process exits or ctx ends.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready (%w); last lines of %s:\n%s", p.name, exitErr(p.err), p.logPath, p.Tail(15))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.URL()+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var b bytes.Buffer
			_, _ = b.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(b.String()))
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within %s (last: %s); last lines of %s:\n%s", p.name, timeout, last, p.logPath, p.Tail(15))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Signal sends sig to the process (not to its group).
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to d for the process to exit and returns its exit code.
func (p *Proc) Wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(d):
		return -1, fmt.Errorf("process still running after %s", d)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode(), nil
	}
	if p.err != nil {
		return -1, p.err
	}
	return 0, nil
}

// Stop sends SIGTERM and waits up to timeout for a clean exit (status 0); past it the
// process is killed and stop fails.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.Exited() {
		return p.exitError()
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitError()
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %s of SIGTERM: killed", p.name, timeout)
	}
}

func (p *Proc) exitError() error {
	if p.err != nil {
		return fmt.Errorf("%s exited: %w; last lines of %s:\n%s", p.name, exitErr(p.err), p.logPath, p.Tail(15))
	}
	return nil
}

// Kill ends the process at once with SIGKILL (its whole group with Command.Group) and
// waits for it.
func (p *Proc) Kill() {
	switch {
	case p.group: // even when the leader is gone: what it started may not be
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	case !p.Exited():
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// Output returns what the process wrote to stdout and stderr so far (its log).
func (p *Proc) Output() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// RunTool runs binDir/name once (reconcile) and returns its stdout; its stderr (logs) is
// appended to logDir/name.log. A non-zero exit is an error carrying both.
func RunTool(ctx context.Context, binDir, logDir, name string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, name), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if f, ferr := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); ferr == nil {
		fmt.Fprintf(f, "$ %s %s\n%s", name, strings.Join(args, " "), stderr.String())
		f.Close()
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return stdout.String(), fmt.Errorf("%s %s: exit %d:\n%s%s", name, strings.Join(args, " "), ee.ExitCode(),
				stdout.String(), LastLine(stderr.String()))
		}
		return stdout.String(), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return stdout.String(), nil
}

// given holds the addresses FreeAddr handed out in this process: the kernel may offer a
// port again as soon as it is closed, and two servers of one run (a broker's listener and
// its controller) must not get the same one.
var given = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// FreeAddr returns a loopback address with a port that was free a moment ago, and that no
// earlier call of this process returned.
func FreeAddr() (string, error) {
	given.Lock()
	defer given.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		if !given.addrs[addr] {
			given.addrs[addr] = true
			return addr, nil
		}
	}
	return "", errors.New("no free port that was not handed out already")
}

// exitErr is a process' exit as an error: cmd.Wait's, or one for an exit status 0.
func exitErr(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
