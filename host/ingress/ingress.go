// Package ingress is the host's HTTP front door: it matches each request to
// a plugin's declared routes under its mount, enforces the body cap, the
// per-plugin in-flight cap and deadlines, forwards the request over the
// plugin's data plane and writes the answer. It also serves /healthz and
// /readyz and the Host service plugins call back through. It never starts
// or stops plugins.
package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/textproto"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/route"
	"github.com/plughost/plughost/sdk/wire"
)

// Limits are the ingress limits from the host config.
type Limits struct {
	MaxBodyBytes   int64
	RequestTimeout time.Duration
	// BodyTimeout bounds the arrival of a request body, from the moment
	// the ingress starts reading it; 0 leaves the server's read timeout.
	BodyTimeout time.Duration
	// WriteTimeout is the server's write timeout. The answer to a request
	// with a body has it from when the body is read or refused, not from
	// the request's head. Routes whose deadline is longer, and streaming
	// routes, get their connection's write deadline moved so the server
	// does not cut their responses.
	WriteTimeout time.Duration
	StreamLimits
}

// Target is a plugin the ingress routes to.
type Target interface {
	Name() string
	Spec() supervisor.Spec
	Endpoint() *supervisor.Endpoint
	Manifest() *pluginv1.DescribeResponse
	Status() supervisor.Status
}

// Ingress routes HTTP requests to plugins. Create it with New; it is safe
// for concurrent use.
type Ingress struct {
	pluginv1.UnimplementedHostServer

	logger  hclog.Logger
	metrics *metrics.Host
	limits  atomic.Pointer[Limits]

	table    atomic.Pointer[table]
	draining atomic.Bool

	mu       sync.Mutex
	inflight map[string]*atomic.Int64 // per plugin name; survives rebuilds
	bodies   map[string]*bodyBudget   // per plugin name; survives rebuilds
	warns    map[string]*logLimiter   // per plugin name; survives rebuilds
	holds    map[string]*hold         // handovers in progress, by plugin name (Hold)
	// bodyLogs holds, by plugin name, the route body limits last logged
	// (logBodyLimits), so that each is logged once, not per Update.
	bodyLogs map[string]string
	nextID   atomic.Uint64
	streams  streams
	// hidden is the cookie no plugin gets (HideCookie).
	hidden string
}

// New returns an Ingress with no plugins.
func New(logger hclog.Logger, m *metrics.Host, limits Limits) *Ingress {
	g := &Ingress{logger: logger, metrics: m, inflight: map[string]*atomic.Int64{}, warns: map[string]*logLimiter{},
		bodies: map[string]*bodyBudget{}}
	g.limits.Store(&limits)
	g.table.Store(&table{byName: map[string]*entry{}})
	return g
}

// HideCookie removes the cookie name from every request's Cookie header
// before a plugin gets it: the admin listener's session cookie, which a
// browser sends to every port of the host it was set for, ingress
// included, and with which a plugin could act as the operator. Call it
// before the ingress serves.
func (g *Ingress) HideCookie(name string) { g.hidden = name }

// SetLimits replaces the limits for requests that arrive from now on.
func (g *Ingress) SetLimits(l Limits) { g.limits.Store(&l) }

// table is an immutable routing table, swapped whole on changes.
type table struct {
	entries []*entry // sorted by mount, longest first
	byName  map[string]*entry
}

type entry struct {
	target   Target
	mount    string
	routes   *route.Table // nil until the plugin has described itself
	inflight *atomic.Int64
	max      int64
	metrics  *pluginMetrics
	warn     *logLimiter // failed calls
	bodies   *bodyBudget
	streams  *streamEntry
	// maxBody is the plugin block's body limit, 0 for the host's
	// (bodyLimit).
	maxBody int64
}

// pluginMetrics holds one plugin's metric series, looked up when the table
// is built rather than per request: WithLabelValues hashes its labels and
// takes a lock, a measurable share of the ingress's own cost. A removed
// plugin leaves the table before metrics.Host.Forget deletes its series,
// and a plugin added again gets a new entry, so no cached series is stale.
type pluginMetrics struct {
	name     string
	requests *prometheus.CounterVec
	duration prometheus.Observer
	inflight prometheus.Gauge
	busy     prometheus.Counter
	aborted  prometheus.Counter
	// bodyBytes is what request bodies hold in the host (bodyBudget).
	bodyBytes prometheus.Gauge
	held      struct {
		depth  prometheus.Gauge
		reject prometheus.Counter
	}

	mu    sync.Mutex                                 // serialises additions to codes
	codes atomic.Pointer[map[int]prometheus.Counter] // copied on write; at most ~900 codes
}

func newPluginMetrics(m *metrics.Host, name string) *pluginMetrics {
	pm := &pluginMetrics{
		name:     name,
		requests: m.Requests,
		duration: m.RequestDuration.WithLabelValues(name),
		inflight: m.Inflight.WithLabelValues(name),
		busy:     m.BusyRejections.WithLabelValues(name),
		aborted:  m.DrainAborted.WithLabelValues(name),

		bodyBytes: m.BodyBytes.WithLabelValues(name),
	}
	pm.held.depth = m.HeldRequests.WithLabelValues(name)
	pm.held.reject = m.HoldRejections.WithLabelValues(name)
	pm.codes.Store(&map[int]prometheus.Counter{})
	return pm
}

// answered counts one request answered with code, and its duration.
func (pm *pluginMetrics) answered(code int, d time.Duration) {
	pm.requestsFor(code).Inc()
	pm.duration.Observe(d.Seconds())
}

// requestsFor returns the requests counter for code. Codes are bounded
// (the ingress answers 100 to 999 and its own 499), so the cache is too.
func (pm *pluginMetrics) requestsFor(code int) prometheus.Counter {
	if c, ok := (*pm.codes.Load())[code]; ok {
		return c
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	old := *pm.codes.Load()
	if c, ok := old[code]; ok {
		return c
	}
	c := pm.requests.WithLabelValues(pm.name, strconv.Itoa(code))
	next := make(map[int]prometheus.Counter, len(old)+1)
	maps.Copy(next, old)
	next[code] = c
	pm.codes.Store(&next)
	return c
}

// Update rebuilds the routing table from the current plugins. Call it when
// plugins are added or removed or a manifest changes.
func (g *Ingress) Update(targets []Target) {
	t := &table{byName: make(map[string]*entry, len(targets))}
	for _, tg := range targets {
		spec := tg.Spec()
		// Creating the series here also shows them at zero, so dashboards
		// and alerts see the plugin before its first request.
		e := &entry{target: tg, mount: spec.Mount, inflight: g.counter(spec.Name), max: int64(spec.MaxInflight),
			metrics: newPluginMetrics(g.metrics, spec.Name), warn: g.limiter(spec.Name), bodies: g.budget(spec.Name),
			maxBody: spec.MaxBodyBytes}
		g.initStreams(e, spec.Name, spec.MaxStreams)
		if m := tg.Manifest(); m != nil {
			e.routes = g.buildRoutes(spec.Name, m)
			g.logBodyLimits(spec.Name, m, e.routes, e.maxBody)
		}
		t.entries = append(t.entries, e)
		t.byName[spec.Name] = e
	}
	sort.Slice(t.entries, func(i, j int) bool { return len(t.entries[i].mount) > len(t.entries[j].mount) })
	g.table.Store(t)
}

func (g *Ingress) budget(name string) *bodyBudget {
	g.mu.Lock()
	defer g.mu.Unlock()
	b, ok := g.bodies[name]
	if !ok {
		b = &bodyBudget{}
		g.bodies[name] = b
	}
	return b
}

func (g *Ingress) limiter(name string) *logLimiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	l, ok := g.warns[name]
	if !ok {
		l = &logLimiter{}
		g.warns[name] = l
	}
	return l
}

func (g *Ingress) counter(name string) *atomic.Int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.inflight[name]
	if !ok {
		c = &atomic.Int64{}
		g.inflight[name] = c
	}
	return c
}

// buildRoutes builds a plugin's route table from its manifest. The host
// does not trust the plugin: a route it cannot use is logged and left out,
// and the others still serve.
func (g *Ingress) buildRoutes(name string, m *pluginv1.DescribeResponse) *route.Table {
	t := &route.Table{}
	for _, r := range wire.RoutesFromProto(m.GetRoutes()) {
		if err := t.Add(r); err != nil {
			g.logger.Error("plugin declared an unusable route; ignoring it", "plugin", name, "route", r.String(), "error", err)
		}
	}
	return t
}

// SetDraining makes /readyz answer 503 from now on.
func (g *Ingress) SetDraining() { g.draining.Store(true) }

// ServeHTTP implements http.Handler.
func (g *Ingress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	case "/readyz":
		g.readyz(w)
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, "/readyz/"); ok {
		g.readyPlugin(w, name)
		return
	}
	if bad := checkRequest(r); bad != nil {
		// The client's fault, and anyone can send it: no log above debug.
		g.logger.Debug("refused a malformed request", "reason", bad.message, "remote", r.RemoteAddr)
		hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
		if hasBody {
			w.Header().Set("Connection", "close")
		}
		writeError(w, bad.status, bad.code, bad.message)
		if hasBody {
			linger(w, r.Body)
		}
		return
	}
	t := g.table.Load()
	e, rest := t.match(r.URL.Path)
	if e == nil {
		if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusNotFound, "not_found", "no plugin is mounted at this path")
			linger(w, r.Body)
			return
		}
		writeError(w, http.StatusNotFound, "not_found", "no plugin is mounted at this path")
		return
	}
	var body *trackedBody
	if r.Body != nil && r.Body != http.NoBody {
		wb := &withBody{body: trackedBody{ReadCloser: r.Body}}
		body = &wb.body
		r.Body = body
		wb.w = earlyAnswer{ResponseWriter: w, body: body}
		w = &wb.w
	}
	start := time.Now()
	code, cut := g.forward(w, r, e, rest)
	e.metrics.answered(code, time.Since(start))
	if cut {
		// The head is out; all that is left is to cut the response short,
		// which net/http does for this panic without logging it.
		panic(http.ErrAbortHandler)
	}
	if body != nil && !body.done && code >= 400 {
		// Answered before the body arrived (413, 404, 429, ...).
		linger(w, body.ReadCloser)
	}
}

// Direct reports whether the front may serve a request without a body
// for path itself (Front): any but one to a plugin route that streams,
// whose answer needs net/http's flushing and deadlines as it goes.
func (g *Ingress) Direct(method, path string) bool {
	e, rest := g.table.Load().match(path)
	if e == nil || e.routes == nil {
		return true
	}
	rt, _, err := e.routes.Match(method, rest)
	return err != nil || !rt.Streaming
}

// match finds the plugin whose mount is a path prefix of p on a segment
// boundary, and returns p relative to that mount.
func (t *table) match(p string) (*entry, string) {
	for _, e := range t.entries {
		if rest, ok := strings.CutPrefix(p, e.mount); ok && (rest == "" || rest[0] == '/') {
			if rest == "" {
				rest = "/"
			}
			return e, rest
		}
	}
	return nil, ""
}

// forward answers one request for plugin entry e and returns the status
// code, and whether the response must be cut short: it failed after its
// head was written.
func (g *Ingress) forward(w http.ResponseWriter, r *http.Request, e *entry, rest string) (code int, cut bool) {
	code = g.forwardTo(w, r, e, rest, &cut)
	return code, cut
}

// forwardTo is forward, setting *cut.
func (g *Ingress) forwardTo(w http.ResponseWriter, r *http.Request, e *entry, rest string, cut *bool) int {
	name := e.target.Name()
	ep := e.target.Endpoint()
	if ep == nil {
		// While the plugin is replaced, wait for its new process (Hold).
		var err error
		if e, ep, err = g.await(r.Context(), e); err != nil && ep == nil {
			return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable",
				fmt.Sprintf("plugin %q is being replaced: %v", name, err))
		}
	}
	if ep == nil || e.routes == nil {
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable", unavailable(e))
	}
	rt, pattern, err := e.routes.Match(r.Method, rest)
	if err != nil {
		if me := (*route.MethodError)(nil); errors.As(err, &me) {
			w.Header().Set("Allow", me.Allow)
			return writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed here", r.Method))
		}
		return writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("plugin %q has no route for %s %s", name, r.Method, rest))
	}
	limits := g.limits.Load()
	maxBody := bodyLimit(rt.MaxBody, e.maxBody, limits.MaxBodyBytes)
	if !TakesBody(r.Method, rt.NoBody) {
		maxBody = 0
	}
	if r.ContentLength > maxBody {
		if maxBody == 0 {
			return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", noBodyMessage(r.Method, pattern, rt.NoBody))
		}
		return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body is %d bytes; the limit is %d", r.ContentLength, maxBody))
	}
	// The body arrives before the request takes an in-flight slot, so a
	// slow client holds memory it has sent, not a slot: under its own
	// deadline, and within the plugin's share of memory for bodies.
	if r.Body != nil && r.Body != http.NoBody && limits.BodyTimeout > 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(limits.BodyTimeout))
	}
	bound := bodyBound(e.max, bodyLimit(0, e.maxBody, limits.MaxBodyBytes), maxBody)
	var body [][]byte
	if r.Body != nil && r.Body != http.NoBody {
		// Most requests have none, and need no charge.
		charge := e.bodies.newCharge(r.RemoteAddr, e.metrics.bodyBytes)
		defer charge.release()
		body, err = receiveBody(w, r, maxBody, charge, bound, clientShare(bound, maxBody))
	}
	if r.Body != nil && r.Body != http.NoBody && limits.WriteTimeout > 0 {
		// The server's write deadline runs from the request's head, and
		// the body may have taken most of it to arrive: the answer,
		// whether the plugin's or a refusal of the body, gets the whole
		// write timeout from now, as an answer to a request without a
		// body gets it from its head.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(limits.WriteTimeout))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			if maxBody == 0 {
				return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", noBodyMessage(r.Method, pattern, rt.NoBody))
			}
			return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large",
				fmt.Sprintf("request body exceeds the limit of %d bytes", maxBody))
		case errors.Is(err, os.ErrDeadlineExceeded):
			w.Header().Set("Connection", "close")
			return writeError(w, http.StatusRequestTimeout, "body_timeout",
				fmt.Sprintf("the request body did not arrive within %v", limits.BodyTimeout))
		case errors.Is(err, errBodyBudget):
			e.metrics.busy.Inc()
			return writeError(w, http.StatusTooManyRequests, "busy",
				fmt.Sprintf("plugin %q holds its limit of %d bytes of request bodies", name, bound))
		case errors.Is(err, errClientShare):
			e.metrics.busy.Inc()
			return writeError(w, http.StatusTooManyRequests, "busy",
				fmt.Sprintf("this client's request bodies to plugin %q hold their share of %d bytes", name, clientShare(bound, maxBody)))
		}
		return writeError(w, http.StatusBadRequest, "bad_body", "could not read the request body: "+err.Error())
	}
	if body != nil {
		// The plugin may have been replaced while the body arrived: wait
		// for its new process as a request arriving now would.
		var ne *entry
		if ne, ep, _ = g.await(r.Context(), e); ep == nil {
			return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable", unavailable(ne))
		}
		e = ne
	}
	if rt.Streaming {
		release, code := g.admitStream(w, r, e, limits)
		if release == nil {
			return code
		}
		defer release()
	} else {
		if n := e.inflight.Add(1); e.max > 0 && n > e.max {
			e.inflight.Add(-1)
			e.metrics.busy.Inc()
			return writeError(w, http.StatusTooManyRequests, "busy",
				fmt.Sprintf("plugin %q is at its limit of %d concurrent requests", name, e.max))
		}
		e.metrics.inflight.Inc()
		defer func() {
			e.inflight.Add(-1)
			e.metrics.inflight.Dec()
		}()
	}
	// Until the answer is read: a drain must not stop the process first.
	// A resend moves the count to the process it resends to.
	ep.StartCall()
	defer func() { ep.EndCall() }()

	// The Request is the data plane's only until RoundTrip (or a resend)
	// returns: it comes from a pool, and goes back cleared.
	req := dataplaneRequests.Get().(*dataplane.Request)
	defer func() {
		*req = dataplane.Request{}
		dataplaneRequests.Put(req)
	}()
	*req = dataplane.Request{
		Method:     r.Method,
		Path:       rest,
		RawQuery:   r.URL.RawQuery,
		Header:     forwardHeader(r.Header, g.hidden),
		Body:       body,
		RemoteAddr: r.RemoteAddr,
		Host:       r.Host,
		Pattern:    pattern,
		RequestID:  g.requestID(r),
		Streaming:  rt.Streaming,
		// The plugin's headers go straight into the answer.
		ResponseHeader: w.Header(),
	}
	ctx := r.Context()
	timeout := rt.Timeout
	var st *stream
	if rt.Streaming {
		// A stream lasts as long as its handler; the server's write
		// timeout would cut it. Each write still fails if the client
		// stops reading: the plugin then runs out of credit, and the
		// client's going away ends ctx.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
		var stop func()
		ctx, st, stop = startStream(ctx, e, limits)
		defer stop()
		req.Window = uint32(limits.StreamBuffer)
	} else {
		if timeout <= 0 {
			timeout = limits.RequestTimeout
		}
		if limits.WriteTimeout > 0 && timeout >= limits.WriteTimeout {
			// Leave the plugin its whole deadline and the host time to
			// answer after it (a 504, or a 503 when a drain deadline
			// cuts it short).
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout + limits.WriteTimeout))
		}
	}
	switch {
	case timeout > 0 && rt.Streaming:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	case timeout > 0:
		// The transport enforces it, with no timer of its own.
		req.Deadline = time.Now().Add(timeout)
	}
	resp, err := ep.RoundTrip(ctx, req)
	if errors.Is(err, dataplane.ErrRefused) {
		ep, resp, err = g.resend(ctx, e, ep, req, resp, err)
	}
	dl, ok := ctx.Deadline()
	if !req.Deadline.IsZero() && (!ok || req.Deadline.Before(dl)) {
		dl, ok = req.Deadline, true
	}
	if err == nil && !rt.Streaming && ok && !time.Now().Before(dl) {
		// The answer raced the deadline, and is most likely the handler
		// reacting to it; the contract is 504 whether or not it answered.
		resp.Close()
		clear(w.Header()) // the plugin's, put there by RoundTrip
		err = context.DeadlineExceeded
	}
	if err != nil {
		// Whatever of the plugin's headers RoundTrip left, the host's own
		// Connection: close stands (it was cleared with them above).
		dropHopHeaders(w.Header())
		ownHopHeaders(w.Header(), r)
		return g.failed(ctx, w, e, ep, err)
	}
	if st != nil {
		code, c := g.answerStream(ctx, w, r, e, ep, resp, st)
		*cut = c
		return code
	}
	code, c := g.answer(w, r, e, ep, resp)
	*cut = c
	return code
}

var dataplaneRequests = sync.Pool{New: func() any { return new(dataplane.Request) }}

// TakesBody reports whether the ingress passes a request body on for a
// request of method to a route: not for GET and HEAD, nor for a route
// that says so (noBody, from sdk.NoBody). Forwarding one would hold
// memory on both sides for nothing; the ingress answers it 413.
func TakesBody(method string, noBody bool) bool {
	return method != http.MethodGet && method != http.MethodHead && !noBody
}

// noBodyMessage is the message of the 413 for a body sent to a request
// that takes none: its method's, or its route's (sdk.NoBody).
func noBodyMessage(method, pattern string, route bool) string {
	if route && method != http.MethodGet && method != http.MethodHead {
		// pattern is ServeMux's: with the route's method ("POST /poke"),
		// or without one for a route of any method.
		if strings.HasPrefix(pattern, "/") {
			pattern = method + " " + pattern
		}
		return fmt.Sprintf("%s takes no body; the limit is 0 bytes", pattern)
	}
	return fmt.Sprintf("%s requests take no body; the limit is 0 bytes", method)
}

// answer writes a plugin's response on an ordinary route: the head, then
// the body as it comes. It returns the status, and whether the response
// must be cut short: its body failed after the head was out. The length
// is the body's, but for an answer to HEAD without one: its
// Content-Length, if the plugin set one, says how long the GET's would
// be, as net/http sends it.
func (g *Ingress) answer(w http.ResponseWriter, r *http.Request, e *entry, ep *supervisor.Endpoint, resp *dataplane.Response) (int, bool) {
	defer resp.Close()
	if !finalStatus(resp.Status) {
		return badStatus(w, r, e, resp.Status), false
	}
	dropHopHeaders(w.Header())
	ownHopHeaders(w.Header(), r)
	headLength := r.Method == http.MethodHead && resp.Size == 0 && w.Header().Get("Content-Length") != ""
	if resp.Size >= 0 && !headLength {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.Size, 10))
	}
	code := resp.Status
	w.WriteHeader(code)
	for {
		piece, err := resp.Next()
		if err == io.EOF {
			return code, false
		}
		if err != nil {
			if ep.Aborted() {
				e.metrics.aborted.Inc()
			}
			return code, true
		}
		if _, err := w.Write(piece); err != nil {
			return code, false // the client went away
		}
	}
}

// finalStatus reports whether code is one a plugin may answer with: a
// final HTTP status, 200 to 999 (net/http's writer takes 3 digits). A
// 1xx is interim, and the host, which relays whole answers, never sends
// one of a plugin's; a 101 would tell the client, or a proxy before the
// host, that the connection now speaks another protocol, while the host
// goes on reading HTTP/1.1 on it.
func finalStatus(code int) bool { return code >= 200 && code <= 999 }

// badStatus answers a plugin's answer whose status finalStatus refuses:
// 502 bad_status, in place of the plugin's headers and body.
func badStatus(w http.ResponseWriter, r *http.Request, e *entry, code int) int {
	clear(w.Header()) // the plugin's
	ownHopHeaders(w.Header(), r)
	return writeError(w, http.StatusBadGateway, "bad_status",
		fmt.Sprintf("plugin %q answered status %d, which is not a final HTTP status", e.target.Name(), code))
}

// unavailable says why the plugin of e has no process to send a request
// to. It never gives "ready" as the reason: a ready plugin the host
// cannot use is one that reports itself not ready, or one it cannot
// reach. The plugin's own reason stays on the admin API, since anyone
// can read this answer.
func unavailable(e *entry) string {
	name := e.target.Name()
	st := e.target.Status()
	switch {
	case st.State == supervisor.StateReady && st.Health == "not_ready":
		return fmt.Sprintf("plugin %q reports itself not ready; it is sent no requests until it is", name)
	case st.State == supervisor.StateReady:
		return fmt.Sprintf("plugin %q could not be reached: it has no process to take requests", name)
	}
	return fmt.Sprintf("plugin %q is %s", name, st.State)
}

// failed maps a request that got no answer to an HTTP answer.
func (g *Ingress) failed(ctx context.Context, w http.ResponseWriter, e *entry, ep *supervisor.Endpoint, err error) int {
	name := e.target.Name()
	switch {
	case ep.Aborted():
		e.metrics.aborted.Inc()
		return writeError(w, http.StatusServiceUnavailable, "drain_aborted",
			fmt.Sprintf("plugin %q was stopped at its drain deadline before it answered", name))
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return writeError(w, http.StatusGatewayTimeout, "timeout", fmt.Sprintf("plugin %q did not answer before the deadline", name))
	case errors.Is(ctx.Err(), context.Canceled):
		// The client went away; nobody reads this.
		return writeError(w, 499, "client_closed", "client closed the request")
	case errors.Is(err, dataplane.ErrRefused):
		// Draining with no process to take over: a stop, not a failure.
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable",
			fmt.Sprintf("plugin %q is draining", name))
	case errors.Is(err, dataplane.ErrAborted):
		// The plugin's choice (its handler aborted), not a failure to
		// reach it.
		g.logger.Debug("plugin aborted its response", "plugin", name, "error", err)
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable",
			fmt.Sprintf("plugin %q aborted its response", name))
	default:
		if ok, suppressed := e.warn.allow(time.Now()); ok {
			g.logger.Warn("plugin call failed", "plugin", name, "error", err, "suppressed", suppressed)
		}
		msg := fmt.Sprintf("plugin %q could not be reached", name)
		if errors.Is(err, dataplane.ErrUnavailable) {
			msg += ": its data-plane connections are closed"
		}
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable", msg)
	}
}

func (g *Ingress) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return id
	}
	return strconv.FormatUint(g.nextID.Add(1), 36)
}

// hopHeaders are the hop-by-hop headers (RFC 9110 section 7.6.1, and the
// ones net/http/httputil.ReverseProxy drops): they are about the client's
// connection to the host, not the request, so the host does not forward
// them to a plugin.
var hopHeaders = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// forwardHeader returns the headers of a request as a plugin gets them:
// without the hop-by-hop ones, any the Connection header names, and the
// cookie hidden, if not "". Most requests have none of those, and get h
// itself.
func forwardHeader(h http.Header, hidden string) http.Header {
	if hidden != "" {
		h = withoutCookie(h, hidden)
	}
	var named []string
	for _, v := range h["Connection"] {
		for opt := range strings.SplitSeq(v, ",") {
			if opt = textproto.TrimString(opt); opt != "" {
				named = append(named, http.CanonicalHeaderKey(opt))
			}
		}
	}
	drop := func(k string) bool { return hopHeaders[k] || slices.Contains(named, k) }
	found := false
	for k := range h {
		if found = drop(k); found {
			break
		}
	}
	if !found {
		return h
	}
	out := make(http.Header, len(h))
	for k, v := range h {
		if !drop(k) {
			out[k] = v
		}
	}
	return out
}

// withoutCookie returns h, or, when one of its Cookie headers holds the
// cookie name, a copy of h whose Cookie headers hold every other cookie
// as sent. h itself is never changed: it is the request's.
func withoutCookie(h http.Header, name string) http.Header {
	found := false
	for _, v := range h["Cookie"] {
		if found = strings.Contains(v, name); found {
			break
		}
	}
	if !found {
		return h
	}
	var kept []string
	for _, v := range h["Cookie"] {
		var parts []string
		for c := range strings.SplitSeq(v, ";") {
			if n, _, _ := strings.Cut(c, "="); textproto.TrimString(n) != name {
				parts = append(parts, textproto.TrimString(c))
			}
		}
		if len(parts) > 0 {
			kept = append(kept, strings.Join(parts, "; "))
		}
	}
	out := h.Clone()
	delete(out, "Cookie")
	if len(kept) > 0 {
		out["Cookie"] = kept
	}
	return out
}

// dropHopHeaders deletes from h, a plugin's answer's headers, the
// hop-by-hop ones and those its Connection header names: they are about a
// connection the plugin does not have (RFC 9110 section 7.6.1), and the
// host frames its answers and keeps its clients' connections itself, as
// a proxy does with its upstream's.
func dropHopHeaders(h http.Header) {
	if kept := forwardHeader(h, ""); len(kept) != len(h) {
		clear(h)
		maps.Copy(h, kept)
	}
}

// ownHopHeaders sets, in h, a plugin's answer's headers once
// dropHopHeaders has run, the host's own hop-by-hop header for r: a
// Connection: close when r's framing asks for it (closeAfter, which
// HookServer set before the plugin's headers replaced it).
func ownHopHeaders(h http.Header, r *http.Request) {
	if closeAfter(r) {
		h.Set("Connection", "close")
	}
}

// stateReplacing is the state /readyz shows for a single-instance plugin
// while the host replaces its process and holds its requests (Hold): it
// counts as ready, since the held requests will be served.
const stateReplacing supervisor.State = "replacing"

type readyBody struct {
	Ready    bool          `json:"ready"`
	Draining bool          `json:"draining"`
	Plugins  []readyPlugin `json:"plugins"`
}

// readyPlugin is what /readyz shows of a plugin. /readyz needs no token,
// so it says whether each plugin serves and nothing an attacker could use
// (pids, binary paths, checksums, versions, errors): those stay on the
// admin API's /v1/plugins.
type readyPlugin struct {
	Name   string           `json:"name"`
	State  supervisor.State `json:"state"`
	Health string           `json:"health,omitempty"`
	// Ready is whether the plugin receives requests: state ready and
	// not reporting not_ready.
	Ready bool `json:"ready"`
}

func (g *Ingress) readyz(w http.ResponseWriter) {
	body := g.readiness()
	code := http.StatusOK
	if !body.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}

// Ready reports whether GET /readyz answers 200: the host is not
// draining, and every required plugin serves (is ready, or is being
// replaced while its requests wait) and, if it is unready_when_degraded,
// does not report itself degraded. The host tells systemd it is ready
// when this turns true.
func (g *Ingress) Ready() bool { return g.readiness().Ready }

// readiness is the body of GET /readyz.
func (g *Ingress) readiness() readyBody {
	t := g.table.Load()
	body := readyBody{Ready: true, Draining: g.draining.Load(), Plugins: []readyPlugin{}}
	if body.Draining {
		body.Ready = false
	}
	for _, e := range t.byName {
		st := e.target.Status()
		serving := e.target.Endpoint() != nil
		if !serving && g.holding(st.Name) {
			// Replaced in turn: its requests wait and will be served.
			serving, st.State, st.Health = true, stateReplacing, ""
		}
		body.Plugins = append(body.Plugins, readyPlugin{Name: st.Name, State: st.State, Health: st.Health, Ready: serving})
		degraded := st.Health == "degraded" && e.target.Spec().UnreadyWhenDegraded
		if st.Required && (!serving || degraded) {
			body.Ready = false
		}
	}
	sort.Slice(body.Plugins, func(i, j int) bool { return body.Plugins[i].Name < body.Plugins[j].Name })
	return body
}

// pluginReadiness is the body of GET /readyz/NAME: the plugin's name and
// its readiness, nothing more, since /readyz needs no token.
type pluginReadiness struct {
	Name string `json:"name"`
	// State is the supervisor's state, except for a ready plugin that
	// reports itself "degraded" or "not_ready", which it shows instead.
	State string `json:"state"`
}

// readyPlugin answers GET /readyz/NAME: 200 while the plugin serves and
// is not degraded, 503 otherwise, and 404 for a plugin the host does not
// run.
func (g *Ingress) readyPlugin(w http.ResponseWriter, name string) {
	e, ok := g.table.Load().byName[name]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "no plugin of this name")
		return
	}
	st := e.target.Status()
	body := pluginReadiness{Name: name, State: string(st.State)}
	if st.State == supervisor.StateReady && st.Health != "" {
		body.State = st.Health
	}
	serving := e.target.Endpoint() != nil
	if !serving && g.holding(name) {
		serving, body.State, st.Health = true, string(stateReplacing), ""
	}
	code := http.StatusServiceUnavailable
	if serving && st.Health != "degraded" && !g.draining.Load() {
		code = http.StatusOK
	}
	writeJSON(w, code, body)
}

// Call implements the Host service: one plugin calling another's routes.
func (g *Ingress) Call(ctx context.Context, req *pluginv1.CallRequest) (*pluginv1.HTTPResponse, error) {
	e, ok := g.table.Load().byName[req.GetPlugin()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no plugin named %q", req.GetPlugin())
	}
	pr := req.GetRequest()
	if pr == nil || !strings.HasPrefix(pr.GetPath(), "/") {
		return nil, status.Error(codes.InvalidArgument, "request path must start with /")
	}
	hr, err := http.NewRequestWithContext(ctx, pr.GetMethod(), e.mount+pr.GetPath(), strings.NewReader(string(pr.GetBody())))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bad request: %v", err)
	}
	hr.URL.RawQuery = pr.GetRawQuery()
	wire.HeadersFromProto(hr.Header, pr.GetHeaders())
	hr.RemoteAddr = "plugin"
	rec := newBufferWriter()
	start := time.Now()
	code, err := g.forwardCall(rec, hr, e, pr.GetPath())
	e.metrics.answered(code, time.Since(start))
	if err != nil {
		return nil, err
	}
	return &pluginv1.HTTPResponse{Status: int32(rec.code), Headers: wire.HeadersToProto(rec.header), Body: rec.body}, nil
}

// forwardCall is forward for Host.Call, where a response cut short after
// its head is a failed call rather than a cut connection.
func (g *Ingress) forwardCall(w *bufferWriter, r *http.Request, e *entry, rest string) (int, error) {
	code, cut := g.forward(w, r, e, rest)
	switch {
	case cut:
		return http.StatusBadGateway, status.Error(codes.Aborted, "the target plugin cut its response short")
	case w.overflow:
		return http.StatusBadGateway, status.Errorf(codes.ResourceExhausted, "the target plugin's response exceeds %d bytes", wire.MaxMessageBytes)
	}
	return code, nil
}

// bufferWriter collects a response for Call, up to wire.MaxMessageBytes.
type bufferWriter struct {
	header   http.Header
	code     int
	body     []byte
	overflow bool // a write went past the limit
}

// errBufferFull fails a write past bufferWriter's limit.
var errBufferFull = errors.New("response exceeds the Host service's message limit")

func newBufferWriter() *bufferWriter { return &bufferWriter{header: http.Header{}} }

func (b *bufferWriter) Header() http.Header { return b.header }
func (b *bufferWriter) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *bufferWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if len(b.body)+len(p) > wire.MaxMessageBytes {
		// More than the Host service can send back; the write fails
		// as a gone client's would, and the caller is told.
		b.overflow = true
		return 0, errBufferFull
	}
	b.body = append(b.body, p...)
	return len(p), nil
}
func (b *bufferWriter) Flush() {}

// writeError writes the platform's JSON error and returns code. Like
// every answer the host writes whole, it states its length.
func writeError(w http.ResponseWriter, code int, errCode, msg string) int {
	body := sdk.ErrorBody(errCode, msg, nil)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	sdk.WriteErrorBody(w, code, body)
	return code
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
