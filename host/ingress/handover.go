package ingress

import (
	"context"
	"errors"
	"time"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/supervisor"
)

// maxResends bounds how often one request is sent again after a process
// refused it unrun; each refusal means a process began to drain after
// the request chose it, so more than one in a row is already rare.
const maxResends = 3

// hold is a handover in progress for one plugin (Hold).
type hold struct {
	done    chan struct{} // closed by release
	until   time.Time
	max     int64
	waiting int64 // under Ingress.mu
}

// Hold makes the requests for the plugin named name that find it without
// a ready process wait, instead of getting 503 at once, until release is
// called or until the time until. At most max requests wait at once; the
// others, and those still waiting at until, get 503 plugin_unavailable
// with Retry-After, counted in plughost_hold_rejections_total. The host
// holds a plugin while it replaces a process that cannot overlap with its
// successor (sdk.Plugin.SingleInstance), and releases it once the new
// process is in the routing table (Update) or the old one is back.
// release is safe to call more than once. A second Hold of the same name
// replaces the first.
func (g *Ingress) Hold(name string, until time.Time, max int) (release func()) {
	h := &hold{done: make(chan struct{}), until: until, max: int64(max)}
	g.mu.Lock()
	if g.holds == nil {
		g.holds = map[string]*hold{}
	}
	g.holds[name] = h
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.holds[name] == h {
			delete(g.holds, name)
		}
		select {
		case <-h.done:
		default:
			close(h.done)
		}
	}
}

// holding reports whether a handover holds the plugin named name now:
// its requests wait for the new process and will be served, so its
// readiness stays up (readyz) until the hold is released or expires.
func (g *Ingress) holding(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.holds[name]
	return h != nil && time.Now().Before(h.until)
}

// errHoldFull and errHoldExpired say why a held request got no process.
var (
	errHoldFull    = errors.New("too many requests are waiting for the plugin's replacement")
	errHoldExpired = errors.New("the plugin's replacement took longer than the requests may wait")
)

// await returns the plugin's current entry and ready endpoint. When it
// has none and a handover holds it, await waits for the handover first.
// The endpoint is nil when none is ready, with errHoldFull or
// errHoldExpired when the wait was the reason.
func (g *Ingress) await(ctx context.Context, e *entry) (*entry, *supervisor.Endpoint, error) {
	name := e.target.Name()
	cur := func() (*entry, *supervisor.Endpoint) {
		if c := g.table.Load().byName[name]; c != nil {
			e = c
		}
		return e, e.target.Endpoint()
	}
	if e, ep := cur(); ep != nil {
		return e, ep, nil
	}
	g.mu.Lock()
	h := g.holds[name]
	if h == nil {
		g.mu.Unlock()
		// A hold is released only after the routing table has the new
		// process: one that went meanwhile left it there.
		e, ep := cur()
		return e, ep, nil
	}
	if h.waiting >= h.max {
		g.mu.Unlock()
		e.metrics.held.reject.Inc()
		return e, nil, errHoldFull
	}
	h.waiting++
	g.mu.Unlock()
	e.metrics.held.depth.Inc()
	t := time.NewTimer(time.Until(h.until))
	var err error
	select {
	case <-h.done:
	case <-t.C:
		err = errHoldExpired
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.Stop()
	g.mu.Lock()
	h.waiting--
	g.mu.Unlock()
	e.metrics.held.depth.Dec()
	e, ep := cur()
	if ep == nil && errors.Is(err, errHoldExpired) {
		e.metrics.held.reject.Inc()
	}
	return e, ep, err
}

// resend sends req again while the process it went to refused it unrun
// (dataplane.ErrRefused: the process began to drain after the request
// chose it), to the plugin's current process, waiting for one while a
// handover holds the plugin. It moves the call count (StartCall) from
// one endpoint to the next, and returns the endpoint of the last attempt
// with its outcome.
func (g *Ingress) resend(ctx context.Context, e *entry, ep *supervisor.Endpoint, req *dataplane.Request,
	resp *dataplane.Response, err error) (*supervisor.Endpoint, *dataplane.Response, error) {
	for range maxResends {
		if !errors.Is(err, dataplane.ErrRefused) {
			break
		}
		// Refused unrun, the request owes the old process nothing: let
		// go of it before waiting, since a single-instance plugin's
		// replacement starts only once the old process has stopped, and
		// that waits for the calls counted on it.
		ep.EndCall()
		_, next, _ := g.await(ctx, e)
		if next == nil || next == ep {
			ep.StartCall() // the caller's deferred EndCall balances it
			break
		}
		next.StartCall()
		ep = next
		resp, err = ep.RoundTrip(ctx, req)
	}
	return ep, resp, err
}
