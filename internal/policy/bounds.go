package policy

import "time"

// MaxAmount is the largest amount of any unit anywhere: a request's units, a limit, a quota,
// a price, a grant. Counters and balances are read as Lua numbers (doubles) in the admission
// script, exact up to 2^53; with every amount at most 10^15 a counter stays exact for
// thousands of requests past any quota, and the script refuses a request that would take
// one past 2^53 - 1 (lua/admit.lua, MAX_COUNTER).
const MaxAmount = 1_000_000_000_000_000

// MaxBucketWindow bounds a token bucket's window, Burst / RatePerS (the time it takes to
// fill from empty), or its WindowS when written as Limit per WindowS: admission turns it
// into µs (10^9 s is 10^15 µs) and keeps each bucket's theoretical arrival time, Redis
// TIME in µs (about 1.8 × 10^15) plus at most a window, exact in Lua's doubles (below
// 2^53). About 31.7 years.
const MaxBucketWindow = 1_000_000_000 * time.Second
