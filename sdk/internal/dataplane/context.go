package dataplane

import (
	"context"
	"sync"
	"time"
)

// requestContext is a request's context: it ends with a Cancel frame
// (cancel), the end of the connection (its parent) or its deadline. It is
// context.WithDeadline(parent, deadline) (WithCancel without a deadline),
// made only once something asks for Done or Value: most handlers never
// do, and the timer, the parent's bookkeeping and the allocations of a
// context per request showed in the plugin's CPU profile. Until then Err
// says what that context's Err would: cancelled, the parent's error, or
// past the deadline.
type requestContext struct {
	parent   context.Context
	deadline time.Time // zero for none

	mu    sync.Mutex
	inner context.Context // nil until armed
	stop  context.CancelFunc
	err   error // what cancel, called before it was armed, ended it with
}

// arm returns the context proper, making it on the first call.
func (c *requestContext) arm() context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		if c.deadline.IsZero() {
			c.inner, c.stop = context.WithCancel(c.parent)
		} else {
			c.inner, c.stop = context.WithDeadline(c.parent, c.deadline)
		}
		if c.err != nil {
			c.stop()
		}
	}
	return c.inner
}

// cancel ends the request's context; the request's end must call it.
func (c *requestContext) cancel() {
	c.mu.Lock()
	stop := c.stop
	if stop == nil && c.err == nil {
		// As the timer would have, had it been set: a deadline that
		// passed first ends the context with its own error.
		c.err = context.Canceled
		if err := c.unarmedErr(); err != nil {
			c.err = err
		}
	}
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (c *requestContext) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *requestContext) Done() <-chan struct{} { return c.arm().Done() }

func (c *requestContext) Value(key any) any { return c.arm().Value(key) }

func (c *requestContext) Err() error {
	c.mu.Lock()
	inner, err := c.inner, c.err
	c.mu.Unlock()
	switch {
	case inner != nil:
		return inner.Err()
	case err != nil:
		return err
	}
	return c.unarmedErr()
}

// unarmedErr is Err before the context is armed or cancelled.
func (c *requestContext) unarmedErr() error {
	if err := c.parent.Err(); err != nil {
		return err
	}
	if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}
