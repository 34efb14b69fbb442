// Package route is the one definition of a plugin's routes that the host
// and the SDK share: a route's declaration (method, pattern, streaming,
// timeout, body limit), the rules a declaration must follow, and the Table that matches
// a request's method and path to the route that serves it, or tells a
// missing path (404) from a method the path does not allow (405).
//
// Plugins declare routes through sdk.Mux, which builds a Table; the host
// builds a Table from the routes a plugin reports in Describe and forwards
// only the requests it matches. Both match the same way, with net/http's
// ServeMux pattern syntax and precedence.
//
// It must not depend on the host, on any plugin, or on the protobuf
// contract; sdk/wire converts between Routes and their protobuf form.
package route

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Route declares one route a plugin serves.
type Route struct {
	// Method is an HTTP method such as "GET"; empty matches any method.
	Method string
	// Pattern is a net/http ServeMux path pattern relative to the mount
	// point, starting with "/": "/{$}" is the mount itself, "/items/{id}"
	// a wildcard segment and "/static/" a subtree.
	Pattern string
	// Streaming routes may write their response in chunks with
	// http.Flusher (long polls, server-sent events). They get no default
	// deadline; they end when the handler returns or the caller goes away.
	Streaming bool
	// Timeout overrides the host's request_timeout for this route; zero
	// keeps the host's.
	Timeout time.Duration
	// NoBody routes take no request body, whatever their method: the host
	// answers a request that carries one 413 before the plugin sees it,
	// as it does for GET and HEAD.
	NoBody bool
	// MaxBody is the route's own request body limit in bytes, at most
	// MaxBodyCeiling; zero keeps its plugin's. The host answers a body
	// over it 413 before it reads it, and caps it at the max_body_bytes
	// of the plugin's block when the operator sets one.
	MaxBody int64
	// Inline routes run their handler on the data-plane connection's
	// reader rather than hand it to a worker goroutine (sdk.Inline). It
	// is the plugin's own: the host neither sees nor needs it.
	Inline bool
}

// MaxBodyCeiling is the largest request body limit the host allows, for
// a route (Route.MaxBody) as for its config's max_body_bytes: 32 MiB.
// The host holds each body whole before it forwards it.
const MaxBodyCeiling = 32 << 20

// String returns the route as a ServeMux pattern: "GET /items/{id}", or
// the bare pattern when any method matches.
func (r Route) String() string {
	if r.Method == "" {
		return r.Pattern
	}
	return r.Method + " " + r.Pattern
}

// Errors Match returns when no route serves a request.
var (
	// ErrNotFound means no route's pattern matches the path.
	ErrNotFound = errors.New("no route matches the path")
	// ErrMethodNotAllowed means routes match the path, but none allows
	// the method.
	ErrMethodNotAllowed = errors.New("the path does not allow the method")
)

// MethodError is Match's error for a path whose routes do not allow the
// method: errors.Is(err, ErrMethodNotAllowed) holds for it.
type MethodError struct {
	// Allow lists the methods the path's routes allow, as a 405's Allow
	// header names them: "GET, HEAD, POST" (a GET route serves HEAD too).
	Allow string
}

func (e *MethodError) Error() string {
	return fmt.Sprintf("%v; it allows %s", ErrMethodNotAllowed, e.Allow)
}

// Is reports whether target is ErrMethodNotAllowed.
func (e *MethodError) Is(target error) bool { return target == ErrMethodNotAllowed }

// methodRE matches an RFC 9110 token, which is what an HTTP method is.
var methodRE = regexp.MustCompile("^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$")

// Parse splits a ServeMux-style pattern, "[METHOD ]/path", into a Route
// with no options. It does not check the path pattern itself; Table.Add
// does.
func Parse(pattern string) (Route, error) {
	if strings.HasPrefix(pattern, "/") {
		return Route{Pattern: pattern}, nil
	}
	i := strings.IndexAny(pattern, " \t")
	if i < 0 {
		return Route{}, fmt.Errorf("route %q: pattern must start with / or with a method and a space", pattern)
	}
	return Route{Method: pattern[:i], Pattern: strings.TrimLeft(pattern[i+1:], " \t")}, nil
}

// Table matches requests to declared routes. The zero value is an empty
// table. Add every route before the first Match; Match and Routes are then
// safe for concurrent use.
type Table struct {
	mux    *http.ServeMux
	routes []Route
}

// entry is a declared route as the ServeMux's handler value, so that a
// match finds its route without a second lookup.
type entry struct {
	route Route
	h     http.Handler
}

// ServeHTTP serves the route's handler; a route added without one is never
// served, only matched.
func (e *entry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.h == nil {
		http.NotFound(w, r)
		return
	}
	e.h.ServeHTTP(w, r)
}

// Add declares r. It returns an error, and leaves the table as it was, when
// r is unusable: a pattern that does not start with "/", a negative
// timeout, a body limit that is negative, over MaxBodyCeiling or set on
// a NoBody route, a method that is not an HTTP token, a pattern net/http's
// ServeMux rejects, or one that conflicts with a route already added.
func (t *Table) Add(r Route) error { return t.add(r, nil) }

// Handle declares r, served by h when a request matches it, for
// ServeHTTP. It fails as Add does.
func (t *Table) Handle(r Route, h http.Handler) error { return t.add(r, h) }

func (t *Table) add(r Route, h http.Handler) (err error) {
	if !strings.HasPrefix(r.Pattern, "/") {
		return fmt.Errorf("route %q: pattern must start with /", r.Pattern)
	}
	if r.Timeout < 0 {
		return fmt.Errorf("route %q: negative timeout", r.Pattern)
	}
	if r.Timeout > 0 && r.Timeout%time.Millisecond != 0 {
		// Timeouts travel in whole milliseconds; rounding one away
		// (500µs would become the host's default) would surprise.
		return fmt.Errorf("route %q: timeout %v is not a whole number of milliseconds", r.Pattern, r.Timeout)
	}
	switch {
	case r.MaxBody < 0:
		return fmt.Errorf("route %q: negative body limit", r.Pattern)
	case r.MaxBody > MaxBodyCeiling:
		return fmt.Errorf("route %q: body limit %d is over the host's ceiling of %d bytes", r.Pattern, r.MaxBody, MaxBodyCeiling)
	case r.MaxBody > 0 && r.NoBody:
		return fmt.Errorf("route %q: a body limit on a route that takes no body", r.Pattern)
	}
	// ServeMux reads "GE T /x" as method GE and host "T ": a route that
	// never matches rather than an error.
	if r.Method != "" && !methodRE.MatchString(r.Method) {
		return fmt.Errorf("route %q: method %q is not an HTTP token", r.Pattern, r.Method)
	}
	if t.mux == nil {
		t.mux = http.NewServeMux()
	}
	pat := r.String()
	defer func() {
		// ServeMux panics on a bad or conflicting pattern, and registers
		// nothing.
		if v := recover(); v != nil {
			err = fmt.Errorf("route %q: %v", pat, v)
		}
	}()
	t.mux.Handle(pat, &entry{route: r, h: h})
	t.routes = append(t.routes, r)
	return nil
}

// Routes returns the declared routes in the order they were added.
func (t *Table) Routes() []Route { return append([]Route(nil), t.routes...) }

// Len returns how many routes are declared.
func (t *Table) Len() int { return len(t.routes) }

// Match returns the route that serves method and path, with its pattern as
// ServeMux writes it ("GET /items/{id}"), or ErrNotFound, or a
// *MethodError (ErrMethodNotAllowed) naming the methods the path allows.
// path is relative to the mount point. The route is the table's own; do
// not modify it.
func (t *Table) Match(method, path string) (*Route, string, error) {
	if t.mux == nil {
		return nil, "", ErrNotFound
	}
	l := lookupPool.Get().(*lookupRequest)
	defer l.release()
	l.r.Method, l.u.Path = method, path
	h, pat := t.mux.Handler(&l.r)
	if e, ok := h.(*entry); ok && pat != "" {
		return &e.route, pat, nil
	}
	// ServeMux answers 405 itself; detect it without writing.
	rec := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(rec, &l.r)
	if rec.code == http.StatusMethodNotAllowed {
		// ServeMux's 405 names the methods, from the same patterns.
		return nil, "", &MethodError{Allow: rec.header.Get("Allow")}
	}
	return nil, "", ErrNotFound
}

// ServeHTTP serves r with the handler of the route it matches, setting
// r.Pattern and the path values as ServeMux does. A request no route
// matches gets ServeMux's own 404 or 405.
func (t *Table) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if t.mux == nil {
		http.NotFound(w, r)
		return
	}
	t.mux.ServeHTTP(w, r)
}

// lookupRequest is the request Match matches: ServeMux matches only an
// *http.Request, and allocating one with its URL on every request was a
// measurable share of the host ingress's allocations. ServeMux.Handler
// reads the request and keeps nothing of it, so one can be reused.
type lookupRequest struct {
	r http.Request
	u url.URL
}

var lookupPool = sync.Pool{New: func() any {
	l := &lookupRequest{}
	l.r.URL = &l.u
	return l
}}

func (l *lookupRequest) release() {
	l.r.Method, l.u.Path = "", ""
	lookupPool.Put(l)
}

// statusRecorder keeps the status of ServeMux's own answer and drops the
// rest.
type statusRecorder struct {
	header http.Header
	code   int
}

func (s *statusRecorder) Header() http.Header         { return s.header }
func (s *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (s *statusRecorder) WriteHeader(code int)        { s.code = code }
