package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Defaults that a zero Policy field stands for.
const (
	// DefaultInitial is the first delay when Policy.Initial is zero.
	DefaultInitial = 100 * time.Millisecond
	// DefaultMax is the cap when Policy.Max is zero.
	DefaultMax = 30 * time.Second
	// DefaultMultiplier is the growth factor when Policy.Multiplier is <= 1.
	DefaultMultiplier = 2.0
	// DefaultJitter is the jitter fraction when Policy.Jitter is zero.
	DefaultJitter = 0.2
)

// Policy describes an exponential backoff. The zero Policy is usable and
// means 100ms, doubling, capped at 30s, with 20% jitter.
type Policy struct {
	Initial    time.Duration // first delay; default 100ms when zero
	Max        time.Duration // cap; default 30s when zero
	Multiplier float64       // default 2 when <= 1
	Jitter     float64       // fraction in [0,1]: delay is drawn uniformly from [d*(1-Jitter), d]; default 0.2 when zero; negative means no jitter
}

// withDefaults fills the zero fields of p and clamps the rest to sane ranges,
// so that Delay never has to special-case them.
func (p Policy) withDefaults() Policy {
	if p.Initial <= 0 {
		p.Initial = DefaultInitial
	}
	if p.Max <= 0 {
		p.Max = DefaultMax
	}
	if p.Initial > p.Max {
		p.Initial = p.Max
	}
	if !(p.Multiplier > 1) || math.IsInf(p.Multiplier, 0) { // also catches NaN
		p.Multiplier = DefaultMultiplier
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = DefaultJitter
	case p.Jitter < 0 || math.IsNaN(p.Jitter):
		p.Jitter = 0
	case p.Jitter > 1:
		p.Jitter = 1
	}
	return p
}

// Delay returns the delay before retry number attempt, counting from 0.
// Attempt 0 waits about Initial, and each later attempt waits Multiplier
// times longer, up to Max. With jitter the delay is drawn uniformly from
// [d*(1-Jitter), d], so it never exceeds Max. A negative attempt counts as 0,
// and huge attempts do not overflow: they wait about Max. Delay is safe for
// concurrent use.
func (p Policy) Delay(attempt int) time.Duration {
	p = p.withDefaults()
	attempt = max(attempt, 0)

	// Work in float64 and compare before converting back: Initial*Multiplier^n
	// overflows int64 long before attempt gets large, and float64(Max) can
	// round up past math.MaxInt64.
	d := p.Max
	if f := float64(p.Initial) * math.Pow(p.Multiplier, float64(attempt)); f < float64(p.Max) {
		d = time.Duration(f)
	}
	if p.Jitter > 0 {
		d -= time.Duration(float64(d) * p.Jitter * rand.Float64())
	}
	return d
}

// Backoff counts the attempts of one retry loop over a Policy. The zero
// Backoff is ready to use with the default Policy. A Backoff is not safe for
// concurrent use; give each loop its own.
type Backoff struct {
	// Policy computes each delay. It may be changed between calls.
	Policy Policy

	attempt int
}

// Next returns the delay for the current attempt and then counts it.
func (b *Backoff) Next() time.Duration {
	d := b.Policy.Delay(b.attempt)
	if b.attempt < math.MaxInt {
		b.attempt++
	}
	return d
}

// Reset starts the count again from attempt 0, typically after a success.
func (b *Backoff) Reset() {
	b.attempt = 0
}

// Attempt returns how many delays Next has handed out since the last Reset.
func (b *Backoff) Attempt() int {
	return b.attempt
}

// Sleep waits for d or until ctx is done, whichever comes first. It returns
// nil after a full wait and ctx.Err() otherwise, including when ctx is
// already done on entry. A d <= 0 does not wait. Sleep stops its timer before
// returning, so an early return leaves nothing running.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
