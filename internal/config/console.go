package config

import (
	"fmt"
	"time"

	"github.com/metergate/metergate/internal/console"
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
