package webhook

import "context"

// Claim claims up to n due deliveries as Run does, and reports how many it got: a test's
// way to ask whether any delivery is claimable without waiting for a loop.
func (d *Deliverer) Claim(ctx context.Context, n int) (int, error) {
	jobs, err := d.claim(ctx, n)
	return len(jobs), err
}

// CheckAddress is the check of every address the client dials ("ip:port").
var CheckAddress = checkAddress
