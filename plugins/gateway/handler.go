package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/plughost/plughost/plugins/gateway/internal/drr"
	"github.com/plughost/plughost/plugins/gateway/internal/inflate"
	"github.com/plughost/plughost/plugins/gateway/internal/shed"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/breaker"
)

// Errors of the request path, besides those of inflate, drr, tenancy and
// the upstreams.
var (
	errNoRoute       = errors.New("no gateway route matches the path")
	errNotConfigured = errors.New("the gateway is not configured")
	errAborted       = errors.New("the upstream call was cancelled at the drain deadline")
	errShed          = errors.New("the gateway is overloaded and sheds this request; retry later")
	errMethod        = errors.New("the gateway does not forward CONNECT or TRACE")
	errBadPath       = errors.New("the path holds a segment an upstream may read as . or .. (with ;parameters, percent-escaped, or with a backslash)")
)

// serveHTTP is the gateway's one handler. Its steps, in order: the path
// check (dotSegment); the method (no CONNECT or TRACE); the route; the length checks and the decompression
// guard, before any policy runs and before any upstream is dialled; the
// tenant; its token bucket; load shedding; its queue (none with one
// tenant, or on an exempt route); the upstream call.
func (p *gatewayPlugin) serveHTTP(w http.ResponseWriter, r *http.Request) {
	g := p.running.Load()
	if g == nil {
		writeError(w, errNotConfigured)
		return
	}
	g.serve(w, r)
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	if dotSegment(r.URL.Path) {
		writeError(w, errBadPath)
		return
	}
	if r.Method == http.MethodConnect || r.Method == http.MethodTrace {
		// As Envoy and nginx: a tunnel through the gateway would skip
		// its policy, and TRACE echoes the request's headers back.
		w.Header().Set("Allow", allowedMethods)
		writeError(w, errMethod)
		return
	}
	rt, ok := g.match(r.URL.Path)
	if !ok {
		writeError(w, errNoRoute)
		return
	}
	body, err := g.readBody(r)
	if err != nil {
		g.reject(w, err)
		return
	}
	tn, err := g.tenancy.identify(r.Header.Values("X-Api-Key"))
	if err != nil {
		g.m.rejected.WithLabelValues(reasonUnauthorized).Inc()
		writeError(w, err)
		return
	}
	if err := tn.admit(w.Header(), g.now()); err != nil {
		g.m.rejected.WithLabelValues(reasonRate).Inc()
		g.m.requests.WithLabelValues(tn.name, outcomeRateLimited).Inc()
		writeError(w, err)
		return
	}
	if g.sched != nil && !rt.exempt {
		queued, share := g.sched.Queued(tn.name)
		if shed.Shed(g.shedLevelNow(), !safeMethod(r.Method), queued >= share) {
			g.m.rejected.WithLabelValues(reasonShed).Inc()
			g.m.requests.WithLabelValues(tn.name, outcomeShed).Inc()
			writeError(w, errShed)
			return
		}
	}
	o := outboundFor(r, rt, tn.name, body)
	up := g.upstreams[rt.upstream]
	if g.sched == nil || rt.exempt {
		resp, err := g.forward(r.Context(), up, o)
		g.respond(w, tn, resp, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c := &call{g: g, up: up, o: o, ctx: ctx, cancel: cancel, done: make(chan result, 1)}
	if err := g.sched.Submit(tn.name, rt.cost, c); err != nil {
		g.respond(w, tn, nil, err)
		return
	}
	select {
	case res := <-c.done:
		defer res.release()
		g.respond(w, tn, res.resp, res.err)
	case <-r.Context().Done():
		if c.state.CompareAndSwap(callQueued, callAbandoned) {
			// No worker will run it; nobody reads this answer.
			g.m.abandoned.Inc()
			g.respond(w, tn, nil, r.Context().Err())
			return
		}
		// A worker has it, or it left a queue: it answers soon, since
		// its context is done.
		res := <-c.done
		defer res.release()
		g.respond(w, tn, res.resp, res.err)
	}
}

// allowedMethods is the Allow of the gateway's 405: every method but
// CONNECT and TRACE, which it refuses.
const allowedMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"

// dotSegment reports whether path, decoded, holds a segment that an
// upstream may read as "." or "..", and so climb out of a url upstream's
// base path: one that is "." or ".." once percent-decoded (again, for an
// upstream that decodes twice) and cut at its first ';' (the path
// parameters that Tomcat and Spring drop: "..;"), or one that holds a
// backslash, which some servers read as '/' ("..\").
func dotSegment(path string) bool {
	if !strings.ContainsAny(path, `.\%`) {
		return false // most paths: nothing to look at segment by segment
	}
	for seg := range strings.SplitSeq(path, "/") {
		if strings.IndexByte(seg, '%') >= 0 {
			if d, err := url.PathUnescape(seg); err == nil {
				seg = d
			}
		}
		if strings.IndexByte(seg, '\\') >= 0 {
			return true
		}
		seg, _, _ = strings.Cut(seg, ";")
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// safeMethod reports whether method only reads (RFC 9110 section 9.2.1):
// anything else is a write to the shedder.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// match returns the route of the longest prefix of path on a segment
// boundary (Envoy's path_separated_prefix): the path is the prefix, or
// goes on with '/' after it, so that "/s" takes /s and /s/x but not
// /secret. A prefix that ends with '/' takes every path that starts with
// it.
func (g *gateway) match(path string) (routeSettings, bool) {
	for _, rt := range g.s.routes {
		if rest, ok := strings.CutPrefix(path, rt.prefix); ok &&
			(rest == "" || rest[0] == '/' || strings.HasSuffix(rt.prefix, "/")) {
			return rt, true
		}
	}
	return routeSettings{}, false
}

// readBody applies the length checks and the decompression guard, and
// returns the decoded body.
func (g *gateway) readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength > g.s.decode.AbsCap {
		return nil, errBodySize
	}
	codings, err := inflate.Codings(r.Header.Values("Content-Encoding"))
	if err != nil {
		return nil, err
	}
	if len(codings) == 0 && (r.Body == nil || r.Body == http.NoBody) {
		return nil, nil // most GETs: nothing to read, nor a buffer to read into
	}
	b, err := inflate.Decode(r.Body, codings, g.s.decode)
	if len(codings) == 0 && errors.Is(err, inflate.ErrSize) {
		return nil, errBodySize
	}
	return b, err
}

// errBodySize is a body over abs_cap_bytes before any decoding.
var errBodySize = errors.New("the request body is larger than the gateway's abs_cap_bytes")

// reject answers a body the guard refused and counts the reason.
func (g *gateway) reject(w http.ResponseWriter, err error) {
	reason := ""
	switch {
	case errors.Is(err, errBodySize):
		reason = reasonBodySize
	case errors.Is(err, inflate.ErrRatio):
		reason = reasonRatio
	case errors.Is(err, inflate.ErrSize):
		reason = reasonSize
	case errors.Is(err, inflate.ErrEncoding):
		reason = reasonEncoding
	case errors.Is(err, inflate.ErrCorrupt):
		reason = reasonCorrupt
	}
	if reason != "" {
		g.m.rejected.WithLabelValues(reason).Inc()
	}
	writeError(w, err)
}

// gatewayOwned are the request headers, besides the hop-by-hop ones, that
// the gateway sets or rewrites: a client's lookalike of one (X_Gateway_Tenant)
// must not reach the upstream beside the gateway's own.
var gatewayOwned = []string{"X-Gateway-Tenant", "X-Forwarded-For", "Content-Encoding", "Content-Length"}

// outboundFor builds what goes upstream: the path relative to the
// upstream, the client's headers without the hop-by-hop ones, its API
// key and their lookalikes, the decoded body, and who the request came
// from.
func outboundFor(r *http.Request, rt routeSettings, tenant string, body []byte) *outbound {
	path := r.URL.Path
	if rt.strip {
		path = "/" + strings.TrimPrefix(strings.TrimPrefix(path, rt.prefix), "/")
	}
	h := r.Header.Clone()
	dropHopByHop(h)
	dropLookalikes(h, gatewayOwned)
	delete(h, "Content-Encoding") // the body goes decoded
	delete(h, "Content-Length")
	h["X-Gateway-Tenant"] = []string{tenant}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := h.Values("X-Forwarded-For"); len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h.Set("X-Forwarded-For", ip)
	}
	return &outbound{method: r.Method, path: path, query: r.URL.RawQuery, header: h, body: body}
}

// respond answers with the upstream's response, or the error, and counts
// the tenant's outcome.
func (g *gateway) respond(w http.ResponseWriter, tn *tenant, resp *http.Response, err error) {
	if err != nil {
		g.m.requests.WithLabelValues(tn.name, outcomeFor(err)).Inc()
		switch {
		case errors.Is(err, drr.ErrBusy):
			g.m.busy.WithLabelValues("intake").Inc()
		case errors.Is(err, drr.ErrTenantBusy):
			g.m.busy.WithLabelValues("tenant").Inc()
		}
		writeError(w, err)
		return
	}
	defer resp.Body.Close()
	tn.served.Inc()
	// The upstream's Connection names its own headers only, never the
	// gateway's (RateLimit, set by admit): they go before the merge.
	dropHopByHop(resp.Header)
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	if _, ok := h["Content-Type"]; !ok {
		// A proxy does not invent a type: a nil value is net/http's
		// "send none, and do not sniff one", which the SDK's data plane
		// and the host keep.
		h["Content-Type"] = nil
	}
	if resp.Request == nil || resp.Request.Method != http.MethodHead {
		// The host sets it from what is written; an answer to HEAD keeps
		// the upstream's, the length of the GET's body.
		delete(h, "Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	// The body is an answer, read whole (readAnswer): one Write. It fails
	// only when the caller has gone, and then nobody reads this answer.
	_, _ = io.Copy(w, resp.Body)
}

// outcomeFor names the tenant outcome of a failed request.
func outcomeFor(err error) string {
	switch {
	case errors.Is(err, drr.ErrBusy), errors.Is(err, drr.ErrTenantBusy):
		return outcomeQueueFull
	case errors.Is(err, drr.ErrDropped):
		return outcomeDropped
	case errors.Is(err, drr.ErrClosed), errors.Is(err, errAborted):
		return outcomeDraining
	case errors.Is(err, errUpstreamTimeout):
		return outcomeTimeout
	case errors.Is(err, context.Canceled):
		return outcomeCancelled
	}
	return outcomeUnavailable
}

// writeError answers err in the platform's JSON error shape. It is the one
// place where the gateway's errors become HTTP statuses.
func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	var limited *rateLimitedError
	switch {
	case errors.Is(err, errNoRoute):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, errBadPath):
		status, code = http.StatusBadRequest, "bad_path"
	case errors.Is(err, errMethod):
		status, code = http.StatusMethodNotAllowed, "method_not_allowed" // serve set Allow
	case errors.Is(err, errNotConfigured):
		status, code = http.StatusServiceUnavailable, "not_configured"
	case errors.Is(err, errBodySize):
		status, code = http.StatusRequestEntityTooLarge, reasonBodySize
	case errors.Is(err, inflate.ErrRatio):
		status, code = http.StatusRequestEntityTooLarge, reasonRatio
	case errors.Is(err, inflate.ErrSize):
		status, code = http.StatusRequestEntityTooLarge, reasonSize
	case errors.Is(err, inflate.ErrEncoding):
		status, code = http.StatusUnsupportedMediaType, "unsupported_encoding"
	case errors.Is(err, inflate.ErrCorrupt):
		status, code = http.StatusBadRequest, "bad_encoding"
	case errors.Is(err, errUnauthorized):
		status, code = http.StatusUnauthorized, "unauthorized"
	case errors.As(err, &limited):
		status, code = http.StatusTooManyRequests, "rate_limited" // admit set Retry-After
	case errors.Is(err, drr.ErrBusy), errors.Is(err, drr.ErrTenantBusy):
		status, code = http.StatusTooManyRequests, "busy"
	case errors.Is(err, errShed):
		status, code = http.StatusServiceUnavailable, "shedding"
	case errors.Is(err, drr.ErrDropped):
		status, code = http.StatusServiceUnavailable, "dropped"
	case errors.Is(err, drr.ErrClosed), errors.Is(err, errAborted):
		status, code = http.StatusServiceUnavailable, "draining"
	case errors.Is(err, breaker.ErrOpen):
		status, code = http.StatusServiceUnavailable, "upstream_unavailable"
	case errors.Is(err, errUpstreamTimeout):
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
	case errors.Is(err, errUpstreamDown):
		status, code = http.StatusServiceUnavailable, "upstream_unavailable"
	case errors.Is(err, errUpstreamAnswer):
		status, code = http.StatusBadGateway, "upstream_error"
	case errors.Is(err, errUpstreamStream):
		status, code = http.StatusBadGateway, "upstream_stream"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// Nobody reads this: the caller left, or the host answered 504.
		status, code = http.StatusServiceUnavailable, "cancelled"
	}
	sdk.WriteError(w, status, code, err.Error())
}

// A call's states: a worker runs it only if it moves it from queued to
// running first; the handler gives it up only if it moves it from queued
// to abandoned first.
const (
	callQueued int32 = iota
	callRunning
	callAbandoned
)

// call is one request's trip through the scheduler: a drr.Job.
type call struct {
	g  *gateway
	up *upstream
	o  *outbound
	// ctx is the request's, cancelled (cancel) when its handler returns,
	// or at the drain deadline while a worker runs the call.
	ctx    context.Context
	cancel context.CancelFunc
	state  atomic.Int32
	done   chan result // buffered: each call leaves once
}

// result is how a call ended. release, once the response is copied,
// frees what the call held.
type result struct {
	resp *http.Response
	err  error
	stop func() bool // unhooks the call from the drain's abort; nil if it did not run
}

func (r result) release() {
	if r.stop != nil {
		r.stop()
	}
}

// Run calls the upstream on a worker. abort ends the call at the drain
// deadline.
func (c *call) Run(abort context.Context) {
	if !c.state.CompareAndSwap(callQueued, callRunning) {
		return // its caller left while it waited
	}
	stop := context.AfterFunc(abort, c.cancel)
	resp, err := c.g.forward(c.ctx, c.up, c.o)
	if err != nil && abort.Err() != nil {
		err = errors.Join(errAborted, err)
	}
	c.done <- result{resp: resp, err: err, stop: stop}
}

// Cancel answers a call that leaves a queue without running.
func (c *call) Cancel(err error) {
	c.done <- result{err: err}
}
