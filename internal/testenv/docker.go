package testenv

import (
	"context"
	"os"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

var dockerOnce = sync.OnceValue(func() (ok bool) {
	if os.Getenv("METERGATE_NO_DOCKER") == "1" {
		return false
	}
	// testcontainers-go panics ("rootless Docker not found") when it finds no Docker host
	// at all: that is "no Docker" too, and a test skips instead of the package crashing.
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return p.Health(ctx) == nil
})

// dockerAvailable reports whether a Docker daemon answers, so testcontainers-go can be used.
// METERGATE_NO_DOCKER=1 says no without asking.
func dockerAvailable() bool { return dockerOnce() }

// startOnce starts one container per test process the first time it is asked for and
// terminates it in Run.
type container[T any] struct {
	once  sync.Once
	value T
	err   error
}

func (c *container[T]) get(start func(ctx context.Context) (T, testcontainers.Container, error)) (T, error) {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var ctr testcontainers.Container
		c.value, ctr, c.err = start(ctx)
		if ctr != nil {
			atExit(func(ctx context.Context) { _ = ctr.Terminate(ctx) })
		}
	})
	return c.value, c.err
}
