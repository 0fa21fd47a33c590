package config

import (
	"fmt"
	"time"

	"github.com/metergate/metergate/internal/console"
	"github.com/metergate/metergate/internal/refusals"
)

// Console is the web console's section of admit (docs/console.md).
type Console struct {
	// Enabled serves the console at /console/.
	Enabled bool
	// InsecureCookies sends the session cookie without Secure: for a console reached over
	// plain HTTP on loopback only.
	InsecureCookies bool
	SessionTTL      time.Duration
}

// Register adds the console's settings to l.
func (c *Console) Register(l *Loader) {
	l.Bool(&c.Enabled, "CONSOLE_ENABLED", true, "serve the web console at /console/ (staff sign in with their tokens)")
	l.Bool(&c.InsecureCookies, "CONSOLE_INSECURE_COOKIES", false, "send the console's session cookie without Secure, for a console on loopback over plain HTTP; never across a network")
	l.Duration(&c.SessionTTL, "CONSOLE_SESSION_TTL", console.DefaultSessionTTL, "how long a console session lasts from its login (5m to 7 days)")
}

// Validate bounds the session's lifetime.
func (c Console) Validate() error {
	var errs []error
	if c.SessionTTL < 5*time.Minute || c.SessionTTL > 7*24*time.Hour {
		errs = append(errs, fmt.Errorf("CONSOLE_SESSION_TTL=%s: want 5m to 168h", c.SessionTTL))
	}
	return prefix("console", errs)
}

// ConsoleConfig returns cfg with the console's settings.
func (c Console) ConsoleConfig(cfg console.Config) console.Config {
	cfg.InsecureCookies, cfg.SessionTTL = c.InsecureCookies, c.SessionTTL
	return cfg
}

// Refusals is admit's refusal log (docs/admission.md, "The refusal log"): what the console
// shows of requests refused by a limit.
type Refusals struct {
	Enabled bool
	PerOrg  int
	Queue   int
	TTL     time.Duration
}

// Register adds the refusal log's settings to l.
func (c *Refusals) Register(l *Loader) {
	l.Bool(&c.Enabled, "ADMIT_REFUSAL_LOG", true, "keep the latest refusals by a limit of each org in Redis, for the console (docs/admission.md, \"The refusal log\")")
	l.Int(&c.PerOrg, "ADMIT_REFUSAL_LOG_PER_ORG", refusals.DefaultPerOrg, "about how many refusals the log keeps per org (10 to 10000)")
	l.Int(&c.Queue, "ADMIT_REFUSAL_LOG_QUEUE", refusals.DefaultQueue, "how many refusals wait for Redis at most; past it they are dropped and counted (100 to 1000000)")
	l.Duration(&c.TTL, "ADMIT_REFUSAL_LOG_TTL", refusals.DefaultTTL, "how long an org's refusals are kept after its latest (1m to 30 days)")
}

// Validate bounds the refusal log, whose memory is orgs × ADMIT_REFUSAL_LOG_PER_ORG entries.
func (c Refusals) Validate() error {
	var errs []error
	if c.PerOrg < 10 || c.PerOrg > 10_000 {
		errs = append(errs, fmt.Errorf("ADMIT_REFUSAL_LOG_PER_ORG=%d: want 10 to 10000", c.PerOrg))
	}
	if c.Queue < 100 || c.Queue > 1_000_000 {
		errs = append(errs, fmt.Errorf("ADMIT_REFUSAL_LOG_QUEUE=%d: want 100 to 1000000", c.Queue))
	}
	if c.TTL < time.Minute || c.TTL > 30*24*time.Hour {
		errs = append(errs, fmt.Errorf("ADMIT_REFUSAL_LOG_TTL=%s: want 1m to 720h", c.TTL))
	}
	return prefix("refusal log", errs)
}

// Options returns o with the refusal log's settings.
func (c Refusals) Options(o refusals.Options) refusals.Options {
	o.PerOrg, o.Queue, o.TTL = c.PerOrg, c.Queue, c.TTL
	return o
}
