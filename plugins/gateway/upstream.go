package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/gateway/internal/h1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/breaker"
)

// Errors of an upstream call.
var (
	// errUpstreamDown: the upstream could not be reached, or answered
	// 5xx on every try.
	errUpstreamDown = errors.New("upstream unavailable")
	// errUpstreamTimeout: the request's deadline passed during the call.
	errUpstreamTimeout = errors.New("upstream did not answer within the request's deadline")
	// errUpstreamAnswer: the upstream answered with what the gateway
	// cannot relay: a body cut short before its length, or a 101
	// Switching Protocols nobody asked for.
	errUpstreamAnswer = errors.New("upstream sent a broken answer")
	// errUpstreamStream: the upstream answered a stream of events, which
	// the gateway, reading each answer whole, cannot relay. It is no
	// failure of the upstream, and trying again would only repeat it.
	errUpstreamStream = errors.New("upstream answered a stream (text/event-stream), which the gateway does not relay")
)

// upstreamStatusError is an answer that counts as a failure of the
// upstream: 502, 503 or 504.
type upstreamStatusError struct{ code int }

func (e *upstreamStatusError) Error() string { return "upstream answered " + strconv.Itoa(e.code) }

// upstream is one upstream at run time.
type upstream struct {
	upstreamSettings
	breaker *breaker.Breaker
	// seconds is gateway_upstream_seconds{upstream}, looked up once.
	seconds prometheus.Observer
	call    func(ctx context.Context, req *http.Request) (*http.Response, error)
}

// hopByHop are the headers of one connection that a proxy does not pass
// on (RFC 9110 section 7.6.1), with the gateway's own X-Api-Key. They are
// in canonical form, so that dropHopByHop deletes them without
// canonicalizing them again for every request.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "X-Api-Key"}

// dropHopByHop deletes from h the hop-by-hop headers, those its
// Connection header names, and their lookalikes (see dropLookalikes).
func dropHopByHop(h http.Header) {
	for _, f := range h["Connection"] {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		delete(h, name)
	}
	dropLookalikes(h, hopByHop)
}

// dropLookalikes deletes from h every name with an underscore that, each
// '_' read as '-', equals one of names but for case. CGI, WSGI, PHP and
// Rack read X-Api-Key and X_Api_Key alike, as HTTP_X_API_KEY, so such a
// lookalike would reach them as the header the gateway dropped or set.
func dropLookalikes(h http.Header, names []string) {
	for k := range h {
		if strings.IndexByte(k, '_') < 0 {
			continue // most names: no lookalike, and no allocation
		}
		dashed := strings.ReplaceAll(k, "_", "-")
		for _, name := range names {
			if strings.EqualFold(dashed, name) {
				delete(h, k)
				break
			}
		}
	}
}

// outbound is a request ready to send upstream, any number of times.
type outbound struct {
	method string
	path   string // relative to the upstream: its mount, or its URL's path
	query  string
	header http.Header
	body   []byte
}

// idempotent reports whether the method may be retried (RFC 9110
// section 9.2.2).
func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// request builds the *http.Request of one try.
func (u *upstream) request(ctx context.Context, o *outbound) (*http.Request, error) {
	target := &url.URL{Path: o.path, RawQuery: o.query}
	if u.url != nil {
		t := *u.url
		t.Path = strings.TrimSuffix(u.url.Path, "/") + o.path
		t.RawPath = ""
		t.RawQuery = o.query
		target = &t
	}
	var req *http.Request
	if len(o.body) == 0 {
		// What NewRequestWithContext makes of a request without a body,
		// without parsing a URL only to replace it.
		req = (&http.Request{Method: o.method, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Body: http.NoBody}).WithContext(ctx)
	} else {
		// The URL is set after, rather than printed for NewRequest to
		// parse back into the same URL.
		var err error
		req, err = http.NewRequestWithContext(ctx, o.method, "", bytes.NewReader(o.body))
		if err != nil {
			return nil, err
		}
	}
	req.URL, req.Host = target, target.Host
	req.Header = o.header
	if u.plugin != "" {
		// A RoundTripper must leave the request as it is; the host's
		// Call makes no such promise, and a retry sends the header again.
		req.Header = o.header.Clone()
	}
	req.ContentLength = int64(len(o.body))
	return req, nil
}

// forward sends o to u, retrying an idempotent request that failed with
// jittered backoff while the next try can still start before ctx's
// deadline. It returns the upstream's response, whose body the caller
// closes, or an error wrapping errUpstreamDown, errUpstreamTimeout or
// breaker.ErrOpen.
func (g *gateway) forward(ctx context.Context, u *upstream, o *outbound) (*http.Response, error) {
	tries := 1
	if idempotent(o.method) {
		tries = g.s.maxTries
	}
	b := backoff.Backoff{Policy: backoff.Policy{Initial: g.s.backoff, Max: g.s.backoffCap, Jitter: 0.5}}
	for try := 1; ; try++ {
		resp, err := g.try(ctx, u, o)
		if err == nil {
			return resp, nil
		}
		var se *upstreamStatusError
		last := try >= tries || errors.Is(err, breaker.ErrOpen) || errors.Is(err, errUpstreamStream) || ctx.Err() != nil
		if !last {
			delay := b.Next()
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= delay {
				last = true
			} else {
				g.m.retries.Inc()
				if resp != nil {
					resp.Body.Close()
				}
				if backoff.Sleep(ctx, delay) == nil {
					continue
				}
				resp, last = nil, true
			}
		}
		if resp != nil && errors.As(err, &se) {
			// The last try's 5xx goes to the client as it is.
			return resp, nil
		}
		return nil, g.classify(ctx, err)
	}
}

// try makes one call through u's breaker, the answer's body read whole
// (readAnswer). A 502, 503 or 504 counts as a failure and comes back as
// the response with an *upstreamStatusError.
func (g *gateway) try(ctx context.Context, u *upstream, o *outbound) (*http.Response, error) {
	var resp *http.Response
	start := time.Now()
	err := u.breaker.Do(ctx, func(ctx context.Context) error {
		req, err := u.request(ctx, o)
		if err != nil {
			return fmt.Errorf("%w: %w", breaker.ErrNotCounted, err)
		}
		resp, err = u.call(ctx, req)
		if err != nil {
			return err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// The gateway never passes Upgrade on, so nobody asked:
			// the client would wait on a protocol it never chose.
			resp.Body.Close()
			resp = nil
			return fmt.Errorf("%w: it switched protocols unasked", errUpstreamAnswer)
		}
		if eventStream(resp.Header) {
			resp.Body.Close()
			resp = nil
			return fmt.Errorf("%w: %w", breaker.ErrNotCounted, errUpstreamStream)
		}
		if err := readAnswer(ctx, resp); err != nil {
			resp = nil
			return err
		}
		switch resp.StatusCode {
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return &upstreamStatusError{code: resp.StatusCode}
		}
		return nil
	})
	if !errors.Is(err, breaker.ErrOpen) {
		u.seconds.Observe(time.Since(start).Seconds())
	}
	return resp, err
}

// eventStream reports whether h's Content-Type is text/event-stream: an
// answer that goes on as long as its upstream has events, which reading
// it whole would wait for until the request's deadline.
func eventStream(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// readAnswer reads resp's body whole into a pooled buffer, which becomes
// its body. Nothing of an answer goes to the client before all of it is
// in, so an answer cut short before its Content-Length is a failed call
// (errUpstreamAnswer), retried or answered 502, never relayed as a
// shorter answer that looks complete. A caller who left is not the
// upstream's failure: that comes back as the context's error.
func readAnswer(ctx context.Context, resp *http.Response) error {
	buf := answerBufs.Get().(*bytes.Buffer)
	_, err := buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		(&answer{buf}).Close()
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err()
		}
		return fmt.Errorf("%w: read its body: %w", errUpstreamAnswer, err)
	}
	resp.Body = &answer{buf}
	return nil
}

// answer is an upstream's body read whole. Close gives its buffer back.
type answer struct{ *bytes.Buffer }

// maxPooledAnswer bounds the buffers answerBufs keeps: a rare large
// answer's is left to the collector.
const maxPooledAnswer = 1 << 20

// answerBufs holds readAnswer's buffers.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (a *answer) Close() error {
	if a.Buffer != nil && a.Cap() <= maxPooledAnswer {
		a.Reset()
		answerBufs.Put(a.Buffer)
	}
	a.Buffer = nil
	return nil
}

// classify turns a failed call into one of forward's errors, counting
// timeouts by the step that timed out: connect (the dial), write (a
// network write) or read (everything else, waiting for the answer
// included).
func (g *gateway) classify(ctx context.Context, err error) error {
	if errors.Is(err, breaker.ErrOpen) {
		return fmt.Errorf("%w: %w", errUpstreamDown, err)
	}
	var op *net.OpError
	isOp := errors.As(err, &op)
	// The host may cancel the request at its deadline a moment before
	// the plugin's own copy of the deadline fires: a passed deadline is a
	// timeout whichever came first.
	dl, hasDeadline := ctx.Deadline()
	late := hasDeadline && !time.Now().Before(dl)
	if !late && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(ctx.Err(), context.DeadlineExceeded) && !(isOp && op.Timeout()) {
		if errors.Is(err, errUpstreamAnswer) || errors.Is(err, errUpstreamStream) {
			return err
		}
		return fmt.Errorf("%w: %w", errUpstreamDown, err)
	}
	step := "read"
	switch {
	case isOp && op.Op == "dial":
		step = "connect"
	case isOp && op.Op == "write":
		step = "write"
	}
	g.m.ioTimeouts.WithLabelValues(step).Inc()
	return fmt.Errorf("%w: %w", errUpstreamTimeout, err)
}

// newUpstream builds u's client: the host for a plugin, a pooled
// net/http client for a URL. Neither has a timeout of its own: every
// call carries the request's deadline in its context.
func newUpstream(us upstreamSettings, host sdk.Host, transport http.RoundTripper, bs breaker.Settings) *upstream {
	u := &upstream{upstreamSettings: us}
	bs.Name = us.name
	u.breaker = breaker.New(bs)
	if us.plugin != "" {
		u.call = func(ctx context.Context, req *http.Request) (*http.Response, error) {
			if host == nil {
				return nil, errors.New("no host to call plugins through")
			}
			return host.Call(ctx, us.plugin, req)
		}
		return u
	}
	// The transport itself, not an http.Client: a redirect is the
	// client's to follow, not the gateway's, and there is no cookie jar or
	// client timeout, so the Client would only copy the request's headers
	// and URL for redirects it never follows.
	u.call = func(_ context.Context, req *http.Request) (*http.Response, error) { return transport.RoundTrip(req) }
	return u
}

// maxIdlePerUpstream bounds the idle connections kept to one upstream
// host: Envoy's default max_connections of a cluster. Below it the pool
// keeps as many as the calls it had in flight at once, which the workers
// bound with the scheduler and the host's max_inflight without it (the
// single-tenant bypass, exempt routes), so that a steady load reuses its
// connections rather than closing and dialling them; idleTimeout
// closes what a peak left.
const maxIdlePerUpstream = 1024

// dialer dials the url upstreams.
var dialer = &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}

// idleTimeout closes an upstream connection left idle that long.
const idleTimeout = 60 * time.Second

// transport is the connection pool of the url upstreams: h1's for
// http://, where the request's goroutine writes the request and reads the
// answer itself, and net/http's for https://, for TLS and HTTP/2.
type transport struct {
	plain *h1.Client
	tls   *http.Transport
}

func newTransport() *transport {
	return &transport{
		plain: &h1.Client{Dial: dialer.DialContext, MaxIdlePerHost: maxIdlePerUpstream, IdleTimeout: idleTimeout},
		tls: &http.Transport{
			Proxy:                 nil, // the gateway is the proxy
			DialContext:           dialer.DialContext,
			MaxIdleConns:          0, // no bound across upstreams: each has its own
			MaxIdleConnsPerHost:   maxIdlePerUpstream,
			IdleConnTimeout:       idleTimeout,
			TLSHandshakeTimeout:   5 * time.Second,
			ExpectContinueTimeout: time.Second,
			ForceAttemptHTTP2:     true,
			DisableCompression:    true, // pass the upstream's encoding through untouched
		},
	}
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" {
		return t.plain.RoundTrip(req)
	}
	return t.tls.RoundTrip(req)
}

// CloseIdleConnections closes both pools' idle connections.
func (t *transport) CloseIdleConnections() {
	t.plain.CloseIdleConnections()
	t.tls.CloseIdleConnections()
}
