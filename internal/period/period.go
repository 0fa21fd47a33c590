// Package period is the one home of metergate's periods: calendar months (the billing
// period, monthly quotas) and days (daily quotas), in UTC. Their labels ("YYYY-MM",
// "YYYY-MM-DD") name quota counters in Redis and periods in events and in PostgreSQL.
package period

import (
	"fmt"
	"time"
)

// Label layouts.
const (
	MonthLayout = "2006-01"
	DayLayout   = "2006-01-02"
)

// MonthLabel is the label of t's month, "YYYY-MM".
func MonthLabel(t time.Time) string { return t.UTC().Format(MonthLayout) }

// DayLabel is the label of t's day, "YYYY-MM-DD".
func DayLabel(t time.Time) string { return t.UTC().Format(DayLayout) }

// MonthStart is the first instant of t's month.
func MonthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// DayStart is the first instant of t's day.
func DayStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// IsDay reports whether label names a day (else a month).
func IsDay(label string) bool { return len(label) == len(DayLayout) }

// Parse returns the first instant of the month or day label names.
func Parse(label string) (time.Time, error) {
	layout := MonthLayout
	if IsDay(label) {
		layout = DayLayout
	}
	t, err := time.Parse(layout, label)
	if err != nil || len(label) != len(layout) {
		return time.Time{}, fmt.Errorf("period %q: want YYYY-MM or YYYY-MM-DD", label)
	}
	return t, nil
}

// ParseMonth returns the first instant of the month label names ("YYYY-MM" only).
func ParseMonth(label string) (time.Time, error) {
	if IsDay(label) {
		return time.Time{}, fmt.Errorf("period %q: want YYYY-MM", label)
	}
	return Parse(label)
}

// End returns the first instant after the month or day label names.
func End(label string) (time.Time, error) {
	t, err := Parse(label)
	if IsDay(label) {
		return t.AddDate(0, 0, 1), err
	}
	return t.AddDate(0, 1, 0), err
}

// Clock is where metergate reads the time that picks periods: the month an invoice closes,
// reconcile's open periods, admission's period bounds, the meter's partitions ahead. Every
// component takes one as an option; nil is the system clock. Tests inject a fixed time
// with Fixed.
type Clock func() time.Time

// Now is the clock's time: time.Now when c is nil.
func (c Clock) Now() time.Time {
	if c == nil {
		return time.Now()
	}
	return c()
}

// Fixed is a clock stopped at t.
func Fixed(t time.Time) Clock { return func() time.Time { return t } }
