// Package ingress is the host's HTTP front door: it matches each request to
// a plugin's declared routes under its mount, enforces the body cap, the
// per-plugin in-flight cap and deadlines, forwards the request over gRPC and
// writes the answer. It also serves /healthz and /readyz and the Host
// service plugins call back through. It never starts or stops plugins.
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
	// WriteTimeout is the server's write timeout. Routes whose deadline is
	// longer, and streaming routes, get their connection's write deadline
	// moved so the server does not cut their responses.
	WriteTimeout time.Duration
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
	nextID   atomic.Uint64
}

// New returns an Ingress with no plugins.
func New(logger hclog.Logger, m *metrics.Host, limits Limits) *Ingress {
	g := &Ingress{logger: logger, metrics: m, inflight: map[string]*atomic.Int64{}}
	g.limits.Store(&limits)
	g.table.Store(&table{byName: map[string]*entry{}})
	return g
}

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
	}
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
			metrics: newPluginMetrics(g.metrics, spec.Name)}
		if m := tg.Manifest(); m != nil {
			e.routes = g.buildRoutes(spec.Name, m)
		}
		t.entries = append(t.entries, e)
		t.byName[spec.Name] = e
	}
	sort.Slice(t.entries, func(i, j int) bool { return len(t.entries[i].mount) > len(t.entries[j].mount) })
	g.table.Store(t)
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
	t := g.table.Load()
	e, rest := t.match(r.URL.Path)
	if e == nil {
		writeError(w, http.StatusNotFound, "not_found", "no plugin is mounted at this path")
		return
	}
	start := time.Now()
	code := g.forward(w, r, e, rest)
	e.metrics.answered(code, time.Since(start))
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

// forward answers one request for plugin entry e and returns the status code.
func (g *Ingress) forward(w http.ResponseWriter, r *http.Request, e *entry, rest string) int {
	name := e.target.Name()
	ep := e.target.Endpoint()
	if ep == nil || e.routes == nil {
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable",
			fmt.Sprintf("plugin %q is %s", name, e.target.Status().State))
	}
	rt, pattern, err := e.routes.Match(r.Method, rest)
	if err != nil {
		if errors.Is(err, route.ErrMethodNotAllowed) {
			return writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed here", r.Method))
		}
		return writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("plugin %q has no route for %s %s", name, r.Method, rest))
	}
	limits := g.limits.Load()
	if r.ContentLength > limits.MaxBodyBytes {
		return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body is %d bytes; the limit is %d", r.ContentLength, limits.MaxBodyBytes))
	}
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
	// Until the answer is read: a drain must not stop the process first.
	ep.StartCall()
	defer ep.EndCall()

	body, err := readBody(w, r, limits.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return writeError(w, http.StatusRequestEntityTooLarge, "body_too_large",
				fmt.Sprintf("request body exceeds the limit of %d bytes", limits.MaxBodyBytes))
		}
		return writeError(w, http.StatusBadRequest, "bad_body", "could not read the request body: "+err.Error())
	}
	req := &dataplane.Request{
		Method:     r.Method,
		Path:       rest,
		RawQuery:   r.URL.RawQuery,
		Header:     forwardHeader(r.Header),
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
	if rt.Streaming {
		// A stream lasts as long as its handler; the server's write
		// timeout would cut it. Each write still fails if the client
		// stops reading: the plugin then runs out of credit, and the
		// client's going away ends ctx.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Time{})
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
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	resp, err := ep.RoundTrip(ctx, req)
	if dl, ok := ctx.Deadline(); err == nil && !rt.Streaming && ok && !time.Now().Before(dl) {
		// The answer raced the deadline, and is most likely the handler
		// reacting to it; the contract is 504 whether or not it answered.
		resp.Close()
		clear(w.Header()) // the plugin's, put there by RoundTrip
		err = context.DeadlineExceeded
	}
	if err != nil {
		return g.failed(ctx, w, e, ep, err)
	}
	return g.answer(w, e, ep, resp, rt.Streaming)
}

// answer writes a plugin's response: the head, then the body as it comes,
// flushed piece by piece on a streaming route. A body that fails after
// the head is out can only be cut short.
func (g *Ingress) answer(w http.ResponseWriter, e *entry, ep *supervisor.Endpoint, resp *dataplane.Response, streaming bool) int {
	defer resp.Close()
	if resp.Size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(resp.Size, 10))
	}
	code := resp.Status
	if code < 100 || code > 999 {
		code = http.StatusBadGateway
	}
	w.WriteHeader(code)
	var rc *http.ResponseController
	if streaming {
		rc = http.NewResponseController(w)
		_ = rc.Flush()
	}
	for {
		piece, err := resp.Next()
		if err == io.EOF {
			return code
		}
		if err != nil {
			if ep.Aborted() {
				e.metrics.aborted.Inc()
			}
			panic(http.ErrAbortHandler)
		}
		if _, err := w.Write(piece); err != nil {
			return code // the client went away
		}
		if streaming {
			_ = rc.Flush()
		}
	}
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
	default:
		g.logger.Warn("plugin call failed", "plugin", name, "error", err)
		return writeError(w, http.StatusServiceUnavailable, "plugin_unavailable",
			fmt.Sprintf("plugin %q could not be reached", name))
	}
}

func (g *Ingress) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return id
	}
	return strconv.FormatUint(g.nextID.Add(1), 36)
}

// readBody reads r's body, at most limit bytes; a longer one fails with an
// *http.MaxBytesError.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		// Most requests have no body: skip the reader and io.ReadAll's
		// first buffer.
		return nil, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
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
// without the hop-by-hop ones and any the Connection header names. Most
// requests have none of those, and get h itself.
func forwardHeader(h http.Header) http.Header {
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
	t := g.table.Load()
	body := readyBody{Ready: true, Draining: g.draining.Load(), Plugins: []readyPlugin{}}
	if body.Draining {
		body.Ready = false
	}
	for _, e := range t.byName {
		st := e.target.Status()
		serving := e.target.Endpoint() != nil
		body.Plugins = append(body.Plugins, readyPlugin{Name: st.Name, State: st.State, Health: st.Health, Ready: serving})
		if st.Required && !serving {
			body.Ready = false
		}
	}
	sort.Slice(body.Plugins, func(i, j int) bool { return body.Plugins[i].Name < body.Plugins[j].Name })
	code := http.StatusOK
	if !body.Ready {
		code = http.StatusServiceUnavailable
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

// forwardCall is forward for Host.Call, where a response cut short after its
// head is a failed call rather than a cut connection.
func (g *Ingress) forwardCall(w *bufferWriter, r *http.Request, e *entry, rest string) (code int, err error) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			code, err = http.StatusBadGateway, status.Error(codes.Aborted, "the target plugin cut its response short")
		}
	}()
	return g.forward(w, r, e, rest), nil
}

// bufferWriter collects a response for Call.
type bufferWriter struct {
	header http.Header
	code   int
	body   []byte
}

func newBufferWriter() *bufferWriter { return &bufferWriter{header: http.Header{}} }

func (b *bufferWriter) Header() http.Header { return b.header }
func (b *bufferWriter) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *bufferWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
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
