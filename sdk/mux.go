package sdk

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/plughost/plughost/sdk/route"
)

// Mux is a plugin's router: each route is declared once, where its handler
// is registered. Plugin.Routes holds it; the SDK reports its routes to the
// host in Describe and serves each request the host forwards with it.
// Patterns follow net/http's ServeMux, relative to the plugin's mount
// point, and so do r.Pattern and r.PathValue in handlers.
//
// Register every route before calling Serve. Unlike ServeMux, Handle does
// not panic on a bad route: Serve (and the plugintest kit) report it as an
// invalid plugin definition naming the route.
type Mux struct {
	table route.Table
	errs  []error
}

// NewMux returns a Mux with no routes.
func NewMux() *Mux { return &Mux{} }

// RouteOption sets a route's options in Mux.Handle.
type RouteOption func(*route.Route)

// Streaming marks a route whose handler may write its response in chunks
// with http.Flusher (long polls, server-sent events). A streaming route
// gets no default deadline; it ends when the handler returns or the caller
// goes away.
func Streaming() RouteOption { return func(r *route.Route) { r.Streaming = true } }

// Timeout gives a route its own deadline instead of the host's
// request_timeout; for a streaming route it bounds the whole stream.
func Timeout(d time.Duration) RouteOption { return func(r *route.Route) { r.Timeout = d } }

// NoBody declares that a route takes no request body, whatever its
// method (GET and HEAD routes take none anyway): the host answers a
// request to it that carries a body with 413 body_too_large before the
// handler runs, so the body holds no memory in the host or the plugin.
// Use it for a POST, PUT or DELETE whose handler reads nothing from
// the body, such as POST /reset.
func NoBody() RouteOption { return func(r *route.Route) { r.NoBody = true } }

// MaxBody gives a route its own request body limit of n bytes, at most
// 32 MiB (route.MaxBodyCeiling), instead of its plugin's (the
// max_body_bytes of its plugin block, or else of the host's limits
// block, 1 MiB by default). The host answers a request whose
// Content-Length is over it 413 body_too_large before it reads the body,
// and cuts a chunked body at it. Use it for a route that takes large
// uploads while the plugin's other routes keep the host's limit; the
// operator still has the last word: a max_body_bytes in the plugin's
// block caps it. MaxBody(0) keeps the plugin's limit; Serve reports a
// negative n, one over the ceiling, or MaxBody with NoBody as an invalid
// route.
func MaxBody(n int64) RouteOption { return func(r *route.Route) { r.MaxBody = n } }

// Inline runs a route's handler on the reader of the data-plane
// connection the request came on, instead of handing the request to a
// worker goroutine: one goroutine hand-off less per request, for a
// handler that answers from memory at once (a greeting, a cached read, a
// health answer). While it runs, no other request on its connection is
// read, so it must not block: no network or disk I/O, no waiting on a
// lock another request holds, on a group commit or on other requests. A
// request whose body comes in more than one frame (over 64 KiB) and a
// streaming route are handed to a worker anyway, and so is the sending of
// a response larger than the response window (256 KiB), whose credit
// comes in frames the reader must be free to read.
func Inline() RouteOption { return func(r *route.Route) { r.Inline = true } }

// Handle declares the route pattern, "[METHOD ]/path" as in ServeMux, and
// serves it with h. Without a method the route matches every method.
func (m *Mux) Handle(pattern string, h http.Handler, opts ...RouteOption) {
	r, err := route.Parse(pattern)
	if err == nil && h == nil {
		err = fmt.Errorf("route %q: handler is nil", pattern)
	}
	if err == nil {
		for _, o := range opts {
			o(&r)
		}
		err = m.table.Handle(r, h)
	}
	if err != nil {
		m.errs = append(m.errs, err)
	}
}

// HandleFunc is Handle for a handler function.
func (m *Mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request), opts ...RouteOption) {
	var hh http.Handler
	if h != nil {
		hh = http.HandlerFunc(h)
	}
	m.Handle(pattern, hh, opts...)
}

// Routes returns the declared routes, in the order they were registered.
func (m *Mux) Routes() []route.Route { return m.table.Routes() }

// ServeHTTP serves r with the handler of the route it matches. A request
// that matches none gets ServeMux's own 404 or 405; the host forwards only
// requests that match.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.table.ServeHTTP(w, r) }

// err reports the routes Handle refused, and a Mux without routes.
func (m *Mux) err() error {
	if len(m.errs) > 0 {
		return errors.Join(m.errs...)
	}
	if m.table.Len() == 0 {
		return errors.New("no routes")
	}
	return nil
}
