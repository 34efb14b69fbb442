package sdk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrInjected is wrapped by every error Faults.Inject returns for an
// injected failure, so code under test can tell a rehearsal from a real
// fault when it needs to (it usually should not).
var ErrInjected = errors.New("sdk: injected fault")

// ErrUnknownPoint is wrapped by the error Faults.Set returns for a fault
// at a point the plugin has not declared: set there, it would never be
// reached, and a rehearsal would pass without the failure it meant to
// cause.
var ErrUnknownPoint = errors.New("sdk: unknown fault point")

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
// config has debug { faults = true }). Plugins declare their fault points
// with Declare and call Inject at them; with no fault set Inject costs one
// read lock. The zero value and a nil *Faults hold no faults and no
// points. Safe for concurrent use.
type Faults struct {
	mu     sync.RWMutex
	m      map[string]Fault
	points map[string]struct{}
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

// Declare adds points to the fault points Set accepts. A plugin declares
// every point it calls Inject at, in Configure, before it serves. The
// durable kit declares its commit point itself.
func (f *Faults) Declare(points ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.points == nil {
		f.points = make(map[string]struct{}, len(points))
	}
	for _, p := range points {
		f.points[p] = struct{}{}
	}
}

// Points returns the declared fault points, sorted.
func (f *Faults) Points() []string {
	if f == nil {
		return nil
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]string, 0, len(f.points))
	for p := range f.points {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Set replaces every fault with list; an empty list clears them all.
// Calls held by a delay are released (see Inject). A fault at a point
// not declared refuses the whole list, leaving the faults as they were,
// with an error that wraps ErrUnknownPoint and names the declared points.
func (f *Faults) Set(list []Fault) error {
	m := make(map[string]Fault, len(list))
	for _, ft := range list {
		m[ft.Point] = ft
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ft := range list {
		if _, ok := f.points[ft.Point]; !ok {
			return f.unknown(ft.Point)
		}
	}
	f.m = m
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
	return nil
}

// unknown is Set's error for point; f.mu is held.
func (f *Faults) unknown(point string) error {
	if len(f.points) == 0 {
		return fmt.Errorf("%w %q: this plugin declares no fault points", ErrUnknownPoint, point)
	}
	names := make([]string, 0, len(f.points))
	for p := range f.points {
		names = append(names, strconv.Quote(p))
	}
	slices.Sort(names)
	return fmt.Errorf("%w %q: this plugin's fault points are %s", ErrUnknownPoint, point, strings.Join(names, ", "))
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
