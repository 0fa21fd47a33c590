package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

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

// prefix puts section before each of errs and joins them.
func prefix(section string, errs []error) error {
	for i, err := range errs {
		errs[i] = fmt.Errorf("%s: %w", section, err)
	}
	return errors.Join(errs...)
}
