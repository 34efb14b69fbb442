package dataplane

import (
	"context"
	"time"
)

// sweepEvery is how often the sweeper looks for requests past their
// Request.Deadline: such a request fails at most this long after it.
const sweepEvery = 5 * time.Millisecond

// sweepIdle is how many sweeps that find no request with a Deadline the
// sweeper makes before it parks until the next one is registered.
const sweepIdle = 200

// sweep fails each request whose Request.Deadline has passed, until every
// connection has broken or been closed.
func (t *transport) sweep() {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	idle := 0
	for {
		select {
		case <-tick.C:
		case <-t.done:
			return
		}
		if t.expire(time.Now()) {
			idle = 0
			continue
		}
		if idle++; idle < sweepIdle {
			continue
		}
		// Park; a request registered after the flag is set is either
		// seen by the sweep here or wakes the sweeper.
		t.parked.Store(true)
		if !t.expire(time.Now()) {
			select {
			case <-t.wake:
			case <-t.done:
				return
			}
			tick.Reset(sweepEvery)
		}
		t.parked.Store(false)
		idle = 0
	}
}

// expire fails the requests whose Deadline is before now, and reports
// whether any request has a Deadline.
func (t *transport) expire(now time.Time) (any bool) {
	var late []*call
	for _, c := range t.conns {
		c.mu.Lock()
		for _, cl := range c.calls {
			if cl.deadline.IsZero() {
				continue
			}
			any = true
			if !now.Before(cl.deadline) {
				late = append(late, cl)
			}
		}
		c.mu.Unlock()
	}
	for _, cl := range late {
		cl.mu.Lock()
		if cl.err == nil && !cl.end {
			cl.err = context.DeadlineExceeded
		}
		cl.mu.Unlock()
		select {
		case cl.ready <- struct{}{}:
		default:
		}
	}
	return any
}
