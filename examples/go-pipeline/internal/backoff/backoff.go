// Package backoff computes retry delays: full jitter over a capped exponential,
// delay = rand(0, min(cap, base·2^(attempt-1))).
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy is a capped exponential with full jitter.
type Policy struct {
	Base time.Duration
	Cap  time.Duration
	// Rand returns a float in [0, 1); nil uses math/rand/v2.
	Rand func() float64
}

// Ceiling is the upper bound of the delay before the given attempt's retry
// (attempt counts from 1).
func (p Policy) Ceiling(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	ceiling := p.Base
	for i := 1; i < attempt && ceiling < p.Cap; i++ {
		ceiling *= 2
	}
	return min(ceiling, p.Cap)
}

// Delay draws the delay after the given failed attempt.
func (p Policy) Delay(attempt int) time.Duration {
	r := p.Rand
	if r == nil {
		r = rand.Float64
	}
	return time.Duration(r() * float64(p.Ceiling(attempt)))
}
