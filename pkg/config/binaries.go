package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Admit is the configuration of cmd/admit.
type Admit struct {
	Server   Server
	Log      Log
	Redis    Redis
	Postgres Postgres
	Kafka    Kafka
	// Migrate applies pending migrations before serving.
	Migrate bool
}

// Register adds every setting of admit to l.
func (c *Admit) Register(l *Loader) {
	c.Server.register(l, "ADMIT_ADDR", "127.0.0.1:8080")
	c.Log.Register(l)
	c.Redis.Register(l)
	c.Postgres.Register(l)
	c.Kafka.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Admit) Validate() error {
	return errors.Join(c.Server.Validate(), c.Log.Validate(), c.Redis.Validate(), c.Postgres.Validate(), c.Kafka.Validate())
}

// Meter is the configuration of cmd/meter.
type Meter struct {
	Server   Server
	Log      Log
	Postgres Postgres
	Kafka    Kafka
	// Group is the Kafka consumer group of the meters.
	Group   string
	Migrate bool
}

// Register adds every setting of meter to l.
func (c *Meter) Register(l *Loader) {
	c.Server.register(l, "METER_ADDR", "127.0.0.1:8081")
	c.Log.Register(l)
	c.Postgres.Register(l)
	c.Kafka.Register(l)
	l.String(&c.Group, "METER_GROUP", "metergate-meter", "Kafka consumer group of the meters")
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Meter) Validate() error {
	var group error
	if c.Group == "" {
		group = errors.New("meter: METER_GROUP: must not be empty")
	}
	return errors.Join(c.Server.Validate(), c.Log.Validate(), c.Postgres.Validate(), c.Kafka.Validate(), group)
}

// Reconcile is the configuration of cmd/reconcile, a run-once job.
type Reconcile struct {
	Log      Log
	Redis    Redis
	Postgres Postgres
	Migrate  bool
}

// Register adds every setting of reconcile to l.
func (c *Reconcile) Register(l *Loader) {
	c.Log.Register(l)
	c.Redis.Register(l)
	c.Postgres.Register(l)
	l.Bool(&c.Migrate, "MIGRATE", false, "apply pending database migrations at start")
}

// Validate reports every problem of the configuration, one per line, prefixed by section.
func (c Reconcile) Validate() error {
	return errors.Join(c.Log.Validate(), c.Redis.Validate(), c.Postgres.Validate())
}

// Validator is a configuration that can check itself.
type Validator interface{ Validate() error }

// Registrar is a configuration that registers its settings on a Loader.
type Registrar interface{ Register(*Loader) }

// Config is what each binary's configuration is.
type Config interface {
	Registrar
	Validator
}

// Load fills cfg from env and args and validates it. The error lists every problem, each
// naming its variable; flag.ErrHelp is returned as is when -h was asked for. validateOnly
// reports the -validate flag: check the configuration and exit.
func Load(cfg Config, name string, args []string, env func(string) (string, bool), output io.Writer) (validateOnly bool, err error) {
	l := NewLoader(name, env, output)
	cfg.Register(l)
	l.fs.BoolVar(&validateOnly, "validate", false, "validate the configuration and exit")
	if err := l.Parse(args); errors.Is(err, flag.ErrHelp) {
		return false, err
	} else if err != nil {
		return false, errors.Join(err, cfg.Validate())
	}
	return validateOnly, cfg.Validate()
}

// LoadOrExit is Load for a main, over args (os.Args[1:] less any subcommand) and the
// environment: it exits 0 after -h or after a valid -validate, and prints every problem
// and exits 2 on a bad setting.
func LoadOrExit(cfg Config, name string, args []string) {
	validateOnly, err := Load(cfg, name, args, os.LookupEnv, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "%s: invalid configuration:\n%v\n", name, err)
		os.Exit(2)
	case validateOnly:
		fmt.Fprintf(os.Stderr, "%s: configuration is valid\n", name)
		os.Exit(0)
	}
}
