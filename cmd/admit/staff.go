package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/metergate/metergate/internal/cli"
	"github.com/metergate/metergate/internal/config"
	"github.com/metergate/metergate/internal/staff"
)

// staffCommand is `admit staff`: add (-create NAME -role ROLE, printing the token once),
// revoke (-revoke ID) or list (-list) the staff members who may use the admin API.
var staffCommand = cli.Command{Name: "staff", Summary: "add, revoke or list staff members (named admin API credentials with a role)",
	Run: func(args []string) int {
		var cfg config.Staff
		config.LoadOrExit(&cfg, "admit staff", args)
		log := cfg.Log.Logger(os.Stderr).With("service", "admit", "command", "staff")
		if err := runStaff(context.Background(), cfg); err != nil {
			log.Error("admit staff failed", "err", err)
			return 1
		}
		return 0
	}}

// cliActor is who the audit trail says made a change through admit staff.
const cliActor = "admit staff"

func runStaff(ctx context.Context, cfg config.Staff) error {
	pool, err := cfg.Postgres.Open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	s := staff.NewStore(pool)
	out := json.NewEncoder(os.Stdout)
	switch {
	case cfg.Create != "":
		m, token, err := s.Create(ctx, cfg.Create, staff.Role(cfg.Role), cliActor)
		if err != nil {
			return err
		}
		if err := audit(ctx, s, "-create", m); err != nil {
			return err
		}
		return out.Encode(struct {
			staff.Member
			Token string `json:"token"`
		}{m, token})
	case cfg.Revoke != "":
		if err := s.Revoke(ctx, cfg.Revoke, cliActor); err != nil {
			return err
		}
		if err := audit(ctx, s, "-revoke", map[string]string{"id": cfg.Revoke}); err != nil {
			return err
		}
		fmt.Printf("revoked %s\n", cfg.Revoke)
		return nil
	default:
		all, err := s.List(ctx)
		if err != nil {
			return err
		}
		return out.Encode(all)
	}
}

// audit records a change made through admit staff in the audit log, as the admin API's
// writes are: the CLI acts as an admin (it holds the database's credentials).
func audit(ctx context.Context, s *staff.Store, action string, after any) error {
	raw, err := json.Marshal(after)
	if err != nil {
		return err
	}
	_, err = s.Record(ctx, staff.Entry{Actor: cliActor, Role: staff.Admin, Method: "CLI", Route: "admit staff " + action,
		Path: "admit staff " + action, Status: 0, After: raw})
	return err
}
