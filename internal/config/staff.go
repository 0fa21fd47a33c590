package config

import (
	"errors"
	"fmt"

	"github.com/metergate/metergate/internal/staff"
)

// Staff is the configuration of `admit staff`, which adds, revokes and lists staff
// members: PostgreSQL, and one action (flags only: they describe one invocation).
type Staff struct {
	Log      Log
	Postgres Postgres
	Create   string // -create NAME (with -role): add a member, print its token once
	Role     string
	Revoke   string // -revoke ID
	List     bool   // -list
}

// Register adds the settings of admit staff to l.
func (c *Staff) Register(l *Loader) {
	c.Log.Register(l)
	c.Postgres.Register(l)
	l.fs.StringVar(&c.Create, "create", "", "add a staff member of this name (with -role) and print its token, once")
	l.fs.StringVar(&c.Role, "role", "", "with -create: admin, finance, support or viewer")
	l.fs.StringVar(&c.Revoke, "revoke", "", "revoke the staff member of this id (st_…): its token is refused from then on")
	l.fs.BoolVar(&c.List, "list", false, "list the staff members, revoked ones too")
}

// Validate reports a bad database setting, and anything but exactly one action.
func (c Staff) Validate() error {
	var errs []error
	actions := 0
	for _, set := range []bool{c.Create != "", c.Revoke != "", c.List} {
		if set {
			actions++
		}
	}
	if actions != 1 {
		errs = append(errs, errors.New("give one of -create NAME -role ROLE, -revoke ID or -list"))
	}
	if c.Create != "" && !staff.Role(c.Role).Valid() {
		errs = append(errs, fmt.Errorf("-role %q: want one of %v", c.Role, staff.Roles))
	}
	if c.Create == "" && c.Role != "" {
		errs = append(errs, errors.New("-role goes with -create"))
	}
	return errors.Join(append(errs, c.Log.Validate(), c.Postgres.Validate())...)
}
