// Package sandbox runs metergate's binaries on the local stack in a space of their own: a
// fresh database (or schema), a Redis key prefix and Kafka topics, with the binaries as
// child processes whose output goes to log files. make demo and make bench use it.
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
	"syscall"
	"time"
)

// Proc is a child process (admit, meter) with its output in a log file.
type Proc struct {
	name    string
	addr    string // host:port it serves on
	logPath string
	cmd     *exec.Cmd
	logFile *os.File
	done    chan struct{}
	err     error
}

// Start starts binDir/name with env on top of this process's environment, its stdout
// and stderr going to logDir/name.log.
func Start(binDir, logDir, name, addr string, env []string, args ...string) (*Proc, error) {
	return StartAs(binDir, logDir, name, name, addr, env, args...)
}

// StartAs is Start with a name of its own for the process and its log (logDir/name.log),
// for a binary run in more than one role ("relay": admit relay).
func StartAs(binDir, logDir, bin, name, addr string, env []string, args ...string) (*Proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s log: %w", name, err)
	}
	cmd := exec.Command(filepath.Join(binDir, bin), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{name: name, addr: addr, logPath: logPath, cmd: cmd, logFile: f, done: make(chan struct{})}
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

// Stop sends SIGTERM and waits up to timeout for a clean exit (status 0); past it the
// process is killed and stop fails.
func (p *Proc) Stop(timeout time.Duration) error {
	if p.Exited() {
		return p.exitError()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
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

// Kill ends the process at once (after a failure) and waits for it.
func (p *Proc) Kill() {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Tail returns the last n lines of the process's log.
func (p *Proc) Tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
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

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// exitErr is a process' exit as an error: cmd.Wait's, or one for an exit status 0.
func exitErr(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
