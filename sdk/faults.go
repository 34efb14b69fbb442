package sdk

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// ErrInjected is wrapped by every error Faults.Inject returns for an
// injected failure, so code under test can tell a rehearsal from a real
// fault when it needs to (it usually should not).
var ErrInjected = errors.New("sdk: injected fault")

// Fault is a fault set at a named point: a delay, an error, or both.
type Fault struct {
	// Point names the fault point, e.g. "ledger.commit".
	Point string
	// Delay holds each call at the point this long, or until its context
	// is done or the faults are set again.
	Delay time.Duration
	// Error, when not empty, makes each call at the point fail with it
	// (after Delay).
	Error string
}

// Faults holds the faults an operator has set at run time through the
// host's admin API (POST /v1/plugins/NAME/faults, refused unless the host
// config has debug { faults = true }). Plugins call Inject at their named
// fault points; with no fault set it costs one read lock. The zero value
// and a nil *Faults hold no faults. Safe for concurrent use.
type Faults struct {
	mu sync.RWMutex
	m  map[string]Fault
	// changed is closed, and replaced, by each Set: it releases the
	// calls held by a delay.
	changed chan struct{}
}

// Inject applies the fault set at point, if any: it waits out the delay
// (returning ctx's error if ctx ends first) and then returns the fault's
// error, wrapping ErrInjected. It returns nil when no fault is set. A
// call held by a delay is released when Set changes the faults, and then
// applies what is set at point by then: nothing once the faults are
// cleared, so a test can hold calls for as long as it needs and let them
// go at once.
func (f *Faults) Inject(ctx context.Context, point string) error {
	if f == nil {
		return nil
	}
	f.mu.RLock()
	ft, ok := f.m[point]
	changed := f.changed
	f.mu.RUnlock()
	if !ok {
		return nil
	}
	if ft.Delay > 0 {
		t := time.NewTimer(ft.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
			return f.Inject(ctx, point)
		}
	}
	if ft.Error != "" {
		return fmt.Errorf("%w at %s: %s", ErrInjected, point, ft.Error)
	}
	return nil
}

// Set replaces every fault with list; an empty list clears them all.
// Calls held by a delay are released (see Inject).
func (f *Faults) Set(list []Fault) {
	m := make(map[string]Fault, len(list))
	for _, ft := range list {
		m[ft.Point] = ft
	}
	f.mu.Lock()
	f.m = m
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
	f.mu.Unlock()
}

// List returns the faults set now, sorted by point.
func (f *Faults) List() []Fault {
	if f == nil {
		return nil
	}
	f.mu.RLock()
	out := make([]Fault, 0, len(f.m))
	for _, ft := range f.m {
		out = append(out, ft)
	}
	f.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Point < out[j].Point })
	return out
}
