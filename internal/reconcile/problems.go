package reconcile

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/metergate/metergate/internal/credit"
	"github.com/metergate/metergate/internal/keyspace"
	"github.com/metergate/metergate/internal/policy"
)

// One account's bad data (a counter that is not an integer, a billable total past what a
// counter holds, a correction Redis refuses) is a Problem: reported, skipped, and every
// other account is still checked and corrected.

// ProblemKind says what was wrong with one account's data.
type ProblemKind string

// The kinds of problem.
const (
	// BadCounter is a Redis counter that is not an integer within ±keyspace.MaxCounter
	// (e.g. "1.38e+19", "abc", a value past int64), or a key of another type.
	BadCounter ProblemKind = "bad_counter"
	// BadTotal is a billable total past keyspace.MaxCounter: no counter can hold it.
	BadTotal ProblemKind = "bad_total"
	// CorrectionFailed is a correction Redis refused (e.g. INCRBY on a bad counter); the
	// row stays pending and the next run tries it again.
	CorrectionFailed ProblemKind = "correction_failed"
	// CreditFailed is a credit correction or restore Redis refused.
	CreditFailed ProblemKind = "credit_failed"
	// PlanGrantFailed is a plan's recurring grant that could not be issued to an account.
	PlanGrantFailed ProblemKind = "plan_grant_failed"
)

// Problem is one account's data that a run or verify could not use: what, where, and the
// raw value read. It is logged as a warning with the same attributes.
type Problem struct {
	Kind         ProblemKind `json:"kind"`
	Org          string      `json:"org,omitempty"`
	Account      string      `json:"account,omitempty"`
	Unit         policy.Unit `json:"unit,omitempty"`
	Period       string      `json:"period,omitempty"`
	Key          string      `json:"key,omitempty"`
	Value        string      `json:"value,omitempty"` // the raw value read (at most maxRawValue bytes)
	AdjustmentID int64       `json:"adjustment_id,omitempty"`
	GrantID      string      `json:"grant_id,omitempty"`
	Error        string      `json:"error"`
}

func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(string(p.Kind))
	for _, f := range []string{p.Org, p.Account, string(p.Unit), p.Period} {
		if f != "" {
			b.WriteString(" " + f)
		}
	}
	if p.AdjustmentID != 0 {
		fmt.Fprintf(&b, " adjustment %d", p.AdjustmentID)
	}
	if p.GrantID != "" {
		b.WriteString(" grant " + p.GrantID)
	}
	if p.Key != "" {
		b.WriteString(" key " + p.Key)
	}
	if p.Value != "" {
		fmt.Fprintf(&b, " value %q", p.Value)
	}
	return b.String() + ": " + p.Error
}

// attrs are the problem's log attributes.
func (p Problem) attrs() []any {
	a := []any{"kind", string(p.Kind), "org", p.Org, "account", p.Account, "unit", string(p.Unit), "period", p.Period,
		"key", p.Key, "value", p.Value, "err", p.Error}
	if p.AdjustmentID != 0 {
		a = append(a, "adjustment_id", p.AdjustmentID)
	}
	if p.GrantID != "" {
		a = append(a, "grant_id", p.GrantID)
	}
	return a
}

// ErrProblems is returned, with the summary, when a run finished for every account but
// some accounts' data could not be used or corrected (Summary.Problems lists them).
var ErrProblems = errors.New("some accounts could not be reconciled")

// maxRawValue bounds the raw value a problem quotes: a key may hold megabytes.
const maxRawValue = 64

func rawValue(s string) string {
	if len(s) > maxRawValue {
		return s[:maxRawValue] + "…"
	}
	return s
}

// parseCounter reads a quota counter's value: an integer within ±keyspace.MaxCounter (the
// largest a counter takes; admission never passes it).
func parseCounter(raw string) (int64, error) {
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not an integer within int64")
	}
	if v > keyspace.MaxCounter || v < -keyspace.MaxCounter {
		return 0, fmt.Errorf("past the largest counter value %d", int64(keyspace.MaxCounter))
	}
	return v, nil
}

// parseTotal reads a billable total (a numeric sum as text): an integer from 0 to
// keyspace.MaxCounter.
func parseTotal(raw string) (int64, error) {
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || v > keyspace.MaxCounter {
		return 0, fmt.Errorf("billable total past the largest counter value %d", int64(keyspace.MaxCounter))
	}
	return v, nil
}

// perAccount tells an error about one account's data, which is reported while the run goes
// on, from one about the run (a connection lost, the context done), which stops it: a
// reply of Redis refusing a value or a type ("ERR value is not an integer or out of
// range", "ERR increment or decrement would overflow", WRONGTYPE), PostgreSQL refusing a
// value (data exception, integrity violation), or a grant refused as invalid.
func perAccount(err error) bool {
	if errors.Is(err, redis.Nil) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		return strings.HasPrefix(msg, "ERR ") || strings.HasPrefix(msg, "WRONGTYPE ")
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "22") || strings.HasPrefix(pe.Code, "23")
	}
	var ie *credit.InvalidError
	return errors.As(err, &ie)
}

// problem adds p to the summary and logs it.
func (s *Summary) problem(o Options, p Problem) {
	o.Log.Warn("reconcile skipped an account's bad data", p.attrs()...)
	s.Problems = append(s.Problems, p)
}
