// Package config reads each binary's settings from environment variables, with a
// command-line flag mirroring every variable (REDIS_URL ↔ -redis-url; a flag wins over the
// variable), and reports every bad setting at once, each named by its variable.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Loader registers settings on a flag set and fills them from the environment.
type Loader struct {
	fs    *flag.FlagSet
	env   func(string) (string, bool)
	names []string
	errs  []error
}

// NewLoader returns a Loader for the command name whose variables are read through env
// (os.LookupEnv in production, a map in tests). Usage goes to output.
func NewLoader(name string, env func(string) (string, bool), output io.Writer) *Loader {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(output)
	return &Loader{fs: fs, env: env}
}

// Names lists the environment variables registered so far, in registration order.
func (l *Loader) Names() []string { return append([]string(nil), l.names...) }

// FlagName is the flag that mirrors an environment variable: KAFKA_TOPIC → kafka-topic.
func FlagName(env string) string { return strings.ReplaceAll(strings.ToLower(env), "_", "-") }

// Parse parses the command line and returns every problem met so far, joined: variables that
// did not parse and flags that did not.
func (l *Loader) Parse(args []string) error {
	if err := l.fs.Parse(args); err != nil {
		l.errs = append(l.errs, err)
	}
	if l.fs.NArg() > 0 {
		l.errs = append(l.errs, fmt.Errorf("unexpected arguments: %q", l.fs.Args()))
	}
	return errors.Join(l.errs...)
}

// value is a flag.Value over a typed setting.
type value[T any] struct {
	p      *T
	parse  func(string) (T, error)
	format func(T) string
	isBool bool
}

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.format(*v.p)
}

func (v *value[T]) IsBoolFlag() bool { return v.isBool }

func register[T any](l *Loader, v *value[T], env string, def T, usage string) {
	*v.p = def
	l.names = append(l.names, env)
	if s, ok := l.env(env); ok {
		if err := v.Set(s); err != nil {
			l.errs = append(l.errs, fmt.Errorf("%s=%q: %w", env, s, err))
		}
	}
	l.fs.Var(v, FlagName(env), fmt.Sprintf("%s (env %s)", usage, env))
}

// String registers a string setting.
func (l *Loader) String(p *string, env, def, usage string) {
	register(l, &value[string]{p: p,
		parse:  func(s string) (string, error) { return s, nil },
		format: func(s string) string { return s },
	}, env, def, usage)
}

// Int registers an integer setting.
func (l *Loader) Int(p *int, env string, def int, usage string) {
	register(l, &value[int]{p: p,
		parse: func(s string) (int, error) {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return 0, errors.New("not an integer")
			}
			return n, nil
		},
		format: strconv.Itoa,
	}, env, def, usage)
}

// Bool registers a boolean setting (1/0, true/false, …); as a flag it needs no value.
func (l *Loader) Bool(p *bool, env string, def bool, usage string) {
	register(l, &value[bool]{p: p, isBool: true,
		parse: func(s string) (bool, error) {
			b, err := strconv.ParseBool(strings.TrimSpace(s))
			if err != nil {
				return false, errors.New("not a boolean")
			}
			return b, nil
		},
		format: strconv.FormatBool,
	}, env, def, usage)
}

// Duration registers a duration setting written as Go durations are ("1.5s", "200ms").
func (l *Loader) Duration(p *time.Duration, env string, def time.Duration, usage string) {
	register(l, &value[time.Duration]{p: p,
		parse: func(s string) (time.Duration, error) {
			d, err := time.ParseDuration(strings.TrimSpace(s))
			if err != nil {
				return 0, errors.New("not a duration (e.g. 500ms, 10s)")
			}
			return d, nil
		},
		format: time.Duration.String,
	}, env, def, usage)
}

// List registers a comma-separated list; blanks around items and empty items are dropped.
func (l *Loader) List(p *[]string, env string, def []string, usage string) {
	register(l, &value[[]string]{p: p,
		parse: func(s string) ([]string, error) {
			var out []string
			for _, item := range strings.Split(s, ",") {
				if item = strings.TrimSpace(item); item != "" {
					out = append(out, item)
				}
			}
			return out, nil
		},
		format: func(v []string) string { return strings.Join(v, ",") },
	}, env, def, usage)
}
