package policy

import "fmt"

// Beyond reports how l, a limit of a node, grants more than bound, the limit of the same
// unit at a node above it: "" when it grants no more. A customer dividing what it bought
// among its teams (the customer API) may give each at most what its own account has:
//   - a rate part at most the bound's rate per second and its burst (a sliding window's
//     rate is its limit over its window, its burst the limit), and a ceiling at most the
//     bound's burst; no rate part is within any bound (the bound's applies above it);
//   - a quota at most the bound's, whatever their periods; no quota is within any bound,
//     an uncapped one (-1) within none but an uncapped bound.
func (l Limit) Beyond(bound Limit) string {
	if bound.HasRate() && l.HasRate() {
		rate, burst := l.capacity()
		bRate, bBurst := bound.capacity()
		switch {
		case rate > bRate:
			return fmt.Sprintf("a rate of %g/s is more than the %g/s above it", rate, bRate)
		case burst > bBurst:
			return fmt.Sprintf("a burst of %d is more than the %d above it", burst, bBurst)
		case l.Ceiling > bBurst:
			return fmt.Sprintf("a ceiling of %d is more than the burst of %d above it", l.Ceiling, bBurst)
		}
	}
	if bound.Quota != nil && l.Quota != nil && *bound.Quota >= 0 && (*l.Quota < 0 || *l.Quota > *bound.Quota) {
		if *l.Quota < 0 {
			return fmt.Sprintf("an uncapped quota is more than the %d (per %s) above it", *bound.Quota, bound.QuotaPeriod)
		}
		return fmt.Sprintf("a quota of %d is more than the %d (per %s) above it", *l.Quota, *bound.Quota, bound.QuotaPeriod)
	}
	return ""
}

// capacity is the rate part as a rate per second and a burst.
func (l Limit) capacity() (perS float64, burst int64) {
	if l.Algorithm == SlidingWindow {
		return float64(l.Limit) / float64(max(l.WindowS, 1)), l.Limit
	}
	return l.RatePerS, l.Burst
}
