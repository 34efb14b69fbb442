// Package admin serves the host's admin listener: GET /metrics with the
// host's and every plugin's metrics, GET /v1/plugins, GET /v1/status,
// POST /v1/plugins/NAME/restart and /upgrade, POST and DELETE
// /v1/plugins/NAME/faults when the operator enabled fault injection, and
// the status page at GET / with its login and buttons. Its only state is
// the status page's sessions and a minute of samples of the host's
// metrics; it never starts or stops plugins itself, only asks Plugins.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/plughost/plughost/host/supervisor"
	"github.com/plughost/plughost/sdk"
)

// Plugins is what the admin API needs from the host's plugin set.
type Plugins interface {
	// Statuses lists every plugin, sorted by name.
	Statuses() []supervisor.Status
	// Restart replaces the named plugin's process with a new one, in the
	// background; false when there is no such plugin.
	Restart(name string) bool
	// Upgrade checks the named plugin's binary against its sha256 pin,
	// then replaces its process with one of the binary as it is now, in
	// the background. It returns ErrNoPlugin, or an error wrapping
	// ErrChecksum or ErrUnusableBinary.
	Upgrade(name string) error
	// SetFaults replaces the faults at the named plugin's fault points and
	// returns those now set. It returns ErrNoPlugin or ErrNotReady.
	SetFaults(ctx context.Context, name string, faults []Fault) ([]Fault, error)
}

// Fault is a fault at a plugin's named fault point.
type Fault struct {
	Point string        `json:"point"`
	Delay time.Duration `json:"-"`
	Error string        `json:"error,omitempty"`
}

// faultJSON is Fault as the API reads and writes it: delays are Go
// duration strings.
type faultJSON struct {
	Point string `json:"point"`
	Delay string `json:"delay,omitempty"`
	Error string `json:"error,omitempty"`
}

// Errors Plugins.SetFaults returns.
var (
	ErrNoPlugin = errors.New("no such plugin")
	ErrNotReady = errors.New("plugin is not ready")
	// ErrNoFaultPoints means the plugin does not implement SetFaults.
	ErrNoFaultPoints = errors.New("plugin has no fault points")
	// ErrUnknownFaultPoint means the plugin refused a fault at a point it
	// does not declare; the error's text is the plugin's, naming its
	// points.
	ErrUnknownFaultPoint = errors.New("unknown fault point")
	// ErrChecksum means the binary does not match the plugin's pin.
	ErrChecksum = errors.New("plugin binary does not match its sha256 pin")
	// ErrUnusableBinary means the binary is missing or not executable.
	ErrUnusableBinary = errors.New("plugin binary is unusable")
)

// Options configure New.
type Options struct {
	// Token, when not empty, is required as "Authorization: Bearer
	// <token>" on /v1/ requests; /metrics stays open for scrapers.
	Token string
	// Faults enables POST and DELETE /v1/plugins/NAME/faults (the host
	// config's debug { faults = true }); otherwise they answer 403.
	// SetFaultsEnabled changes it later.
	Faults bool
	// Stats is the host's own registry (metrics.Host.Registry), which
	// the status page samples for its rates. Nil means the gatherer
	// given to New, which should then not reach into plugins, as
	// sampling it would call every plugin each SampleEvery.
	Stats prometheus.Gatherer
	// SampleEvery is how often Stats is sampled; 0 means every 5s.
	SampleEvery time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger gets the status page's logins and operator actions; nil
	// logs nothing. The token is never logged.
	Logger hclog.Logger
	// Hosts are the names, besides IP literals and localhost, that a
	// request's Host header may carry (the listen address's host and
	// the host config's admin.hosts). Any other name is refused 421, so
	// that a name an attacker rebinds to the listener's address (DNS
	// rebinding) reaches nothing: the browser would treat the listener
	// as that name's origin, sending the attacker's requests as
	// same-origin.
	Hosts []string
}

// Server is the admin listener's handler. Call Close when done with it.
type Server struct {
	mux     *http.ServeMux
	plugins Plugins
	// token is the admin token, "" for none; SetToken replaces it.
	token    atomic.Pointer[string]
	logger   hclog.Logger
	now      func() time.Time
	rates    *sampler
	sessions *sessions
	guard    *guard
	refused  *refusalLog
	page     *template.Template
	// faults is Options.Faults, as SetFaultsEnabled last set it.
	faults atomic.Bool
	// hosts are Options.Hosts, lowercased.
	hosts map[string]bool
}

// New returns the admin handler. It starts a goroutine that samples
// opts.Stats every opts.SampleEvery; call Close to stop it.
func New(g prometheus.Gatherer, plugins Plugins, opts Options) *Server {
	token := opts.Token
	if opts.Stats == nil {
		opts.Stats = g
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	s := &Server{
		plugins:  plugins,
		logger:   opts.Logger,
		now:      opts.Now,
		rates:    newSampler(opts.Stats, opts.Now, opts.SampleEvery, rateWindow),
		sessions: newSessions(opts.Now),
		guard:    newGuard(opts.Now),
		refused:  newRefusalLog(opts.Logger, opts.Now),
		page:     pageTemplate,
		hosts:    map[string]bool{"localhost": true},
	}
	s.token.Store(&token)
	for _, h := range opts.Hosts {
		s.hosts[strings.ToLower(h)] = true
	}
	s.faults.Store(opts.Faults)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
	}))
	api := http.NewServeMux()
	api.HandleFunc("GET /v1/plugins", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, plugins.Statuses())
	})
	api.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.overview())
	})
	api.HandleFunc("POST /v1/plugins/{name}/restart", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if e := restart(plugins, name); e != nil {
			sdk.WriteError(w, e.status, e.code, e.message)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "restarting", "plugin": name})
	})
	api.HandleFunc("POST /v1/plugins/{name}/upgrade", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if e := upgrade(plugins, name); e != nil {
			sdk.WriteError(w, e.status, e.code, e.message)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "upgrading", "plugin": name})
	})
	faults := func(w http.ResponseWriter, r *http.Request, list []Fault) {
		if !s.faults.Load() {
			sdk.WriteError(w, http.StatusForbidden, "faults_disabled", "fault injection is off; enable it with debug { faults = true } in the host config")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		name := r.PathValue("name")
		set, err := plugins.SetFaults(ctx, name, list)
		switch {
		case errors.Is(err, ErrNoPlugin):
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no plugin named "+strconv.Quote(name))
			return
		case errors.Is(err, ErrNoFaultPoints):
			sdk.WriteError(w, http.StatusNotImplemented, "no_fault_points", fmt.Sprintf("plugin %q serves no fault points (it does not implement SetFaults)", name))
			return
		case errors.Is(err, ErrUnknownFaultPoint):
			sdk.WriteError(w, http.StatusBadRequest, "unknown_fault_point", fmt.Sprintf("plugin %q: %v", name, err))
			return
		case errors.Is(err, ErrNotReady):
			sdk.WriteError(w, http.StatusServiceUnavailable, "plugin_unavailable", fmt.Sprintf("plugin %q is not ready", name))
			return
		case err != nil:
			sdk.WriteError(w, http.StatusBadGateway, "plugin_error", err.Error())
			return
		}
		out := make([]faultJSON, 0, len(set))
		for _, f := range set {
			fj := faultJSON{Point: f.Point, Error: f.Error}
			if f.Delay > 0 {
				fj.Delay = f.Delay.String()
			}
			out = append(out, fj)
		}
		writeJSON(w, http.StatusOK, map[string]any{"plugin": name, "faults": out})
	}
	api.HandleFunc("POST /v1/plugins/{name}/faults", func(w http.ResponseWriter, r *http.Request) {
		// The body is checked whatever the debug setting: a malformed
		// request is the client's error (400), not a refusal (403).
		// A null, or a body without its list, would clear every fault,
		// which only DELETE or an empty list is meant to do.
		var body *struct {
			Faults *[]faultJSON `json:"faults"`
		}
		const shape = "body must be {\"faults\":[{\"point\":...,\"delay\":\"2s\",\"error\":...}]}"
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", shape+": "+err.Error())
			return
		}
		if body == nil || body.Faults == nil {
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", shape+", with a list of faults (an empty one clears them)")
			return
		}
		if _, err := dec.Token(); err != io.EOF {
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", shape+", and nothing after it")
			return
		}
		list := make([]Fault, 0, len(*body.Faults))
		for _, f := range *body.Faults {
			if f.Point == "" {
				sdk.WriteError(w, http.StatusBadRequest, "bad_request", "every fault needs a point")
				return
			}
			var d time.Duration
			if f.Delay != "" {
				var err error
				if d, err = time.ParseDuration(f.Delay); err != nil || d < time.Millisecond {
					sdk.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("fault %q: delay must be a duration of at least 1ms, such as \"2s\"", f.Point))
					return
				}
			}
			if d == 0 && f.Error == "" {
				sdk.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("fault %q: set a delay, an error or both", f.Point))
				return
			}
			list = append(list, Fault{Point: f.Point, Delay: d, Error: f.Error})
		}
		faults(w, r, list)
	})
	api.HandleFunc("DELETE /v1/plugins/{name}/faults", func(w http.ResponseWriter, r *http.Request) {
		faults(w, r, nil)
	})
	// The API takes a bearer token, which a browser never adds to
	// another origin's request; without one configured, the check of
	// the request's origin is what keeps a page the operator has open
	// from restarting plugins.
	cop := s.crossOrigin()
	mux.Handle("/v1/", cop.Handler(s.auth(api)))
	s.pageRoutes(mux, cop)
	mux.HandleFunc("/", notFound)
	// Without it, ServeMux would redirect /v1 to /v1/ itself, in HTML.
	mux.HandleFunc("/v1", notFound)
	s.mux = mux
	return s
}

// ServeHTTP serves the admin listener's routes, every answer with
// Cache-Control: no-store and X-Content-Type-Options: nosniff. A
// request whose Host
// header names neither an IP address nor one of the known hosts
// (Options.Hosts) is refused 421. A CONNECT, a target of "*" (an HTTP/2
// preface, or OPTIONS * when the http.Server passes it on: set its
// DisableGeneralOptionsHandler), or a path that is not clean names no
// endpoint: ServeMux would answer it itself, in plain text, with no
// body at all or with a redirect, so it gets the JSON 404 of any other
// unknown endpoint here.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Every answer is about the host now, and some carry a session's
	// cookie: none is to be kept by a cache. None is to be read as
	// another type than it says, JSON as HTML least of all.
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if !s.knownHost(r.Host) {
		s.logger.Warn("admin request for an unknown host refused", "host", r.Host, "remote", r.RemoteAddr)
		sdk.WriteError(w, http.StatusMisdirectedRequest, "unknown_host",
			"the admin listener does not serve "+strconv.Quote(r.Host)+"; use its IP address, localhost, or a name in the host config's admin.hosts")
		return
	}
	if r.Method == http.MethodConnect || r.RequestURI == "*" {
		sdk.WriteError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.RequestURI)
		return
	}
	if p := r.URL.EscapedPath(); p != cleanPath(p) {
		// ServeMux would redirect it to its clean form, in HTML and
		// escaped once more; no client of this API sends one.
		notFound(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// cleanPath is p as ServeMux matches it: rooted, without . or ..
// elements or doubled slashes, keeping a trailing slash.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	np := path.Clean(p)
	if strings.HasSuffix(p, "/") && np != "/" {
		np += "/"
	}
	return np
}

// notFound answers the JSON 404 of a path the admin listener does not
// serve.
func notFound(w http.ResponseWriter, r *http.Request) {
	sdk.WriteError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
}

// knownHost reports whether a Host header of hostport names the admin
// listener: an IP literal, localhost, or one of s.hosts. An empty one,
// which only an HTTP/1.0 client sends and no browser does, is allowed.
func (s *Server) knownHost(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return s.hosts[strings.ToLower(host)]
}

// Close stops the goroutine that samples the host's metrics for the
// status page's rates. The Server still answers afterwards, with the
// rates of the samples it has.
func (s *Server) Close() { s.rates.Close() }

// apiError is an endpoint's refusal, as its JSON error body says it.
type apiError struct {
	status  int
	code    string
	message string
}

// restart asks for the named plugin's restart.
func restart(plugins Plugins, name string) *apiError {
	if !plugins.Restart(name) {
		return &apiError{http.StatusNotFound, "not_found", "no plugin named " + strconv.Quote(name)}
	}
	return nil
}

// upgrade asks for the named plugin's upgrade to the binary at its path.
func upgrade(plugins Plugins, name string) *apiError {
	switch err := plugins.Upgrade(name); {
	case errors.Is(err, ErrNoPlugin):
		return &apiError{http.StatusNotFound, "not_found", "no plugin named " + strconv.Quote(name)}
	case errors.Is(err, ErrChecksum):
		return &apiError{http.StatusConflict, "checksum_mismatch", err.Error()}
	case err != nil:
		return &apiError{http.StatusUnprocessableEntity, "unusable_binary", err.Error()}
	}
	return nil
}

// auth requires the admin token on next's requests, within the wrong
// tokens' allowance of their address (guard).
func (s *Server) auth(next http.Handler) http.Handler {
	if s.tokenNow() == "" {
		// A token is never turned on without a restart (SetToken).
		return notFoundJSON(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, bearer := bearerToken(r.Header.Get("Authorization"))
		ok, wait := false, time.Duration(0)
		if bearer {
			ok, wait = s.guard.check(r, []byte(got), []byte(s.tokenNow()))
		}
		if wait > 0 {
			secs := retryAfter(w, wait)
			s.refused.warn("admin api token refused: too many wrong tokens", r, "method", r.Method, "path", r.URL.Path, "retry_after", secs)
			sdk.WriteError(w, http.StatusTooManyRequests, "too_many_attempts", tooManyGuesses(secs))
			return
		}
		if !ok {
			if bearer {
				// A request without a token is no guess: not logged.
				s.refused.warn("admin api token refused", r, "method", r.Method, "path", r.URL.Path)
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="plughost admin"`)
			sdk.WriteError(w, http.StatusUnauthorized, "unauthorized", "admin API requests need Authorization: Bearer <token>")
			return
		}
		notFoundJSON(next).ServeHTTP(w, r)
	})
}

// bearerToken returns the token of an Authorization header of the
// Bearer scheme, whose name is case-insensitive (RFC 7235 2.1); false
// when the header is of no scheme or another one, which is not a token
// to charge as a wrong one.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimLeft(token, " "), true
}

// notFoundJSON turns ServeMux's plain-text 404 and 405 into JSON errors;
// a 405 keeps the Allow header ServeMux sets from its patterns.
func notFoundJSON(mux http.Handler) http.Handler {
	m := mux.(*http.ServeMux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pat := m.Handler(r); pat == "" {
			// Without a pattern ServeMux only answers 404 or 405.
			rec := &muxAnswer{header: http.Header{}}
			m.ServeHTTP(rec, r)
			if rec.code == http.StatusMethodNotAllowed {
				w.Header().Set("Allow", rec.header.Get("Allow"))
				sdk.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
				return
			}
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
			return
		}
		m.ServeHTTP(w, r)
	})
}

// tokenNow returns the admin token in force, "" for none.
func (s *Server) tokenNow() string { return *s.token.Load() }

// SetToken replaces the admin token with t, as a reload that finds another
// token in the same file does, and ends every status page session, as a
// changed password does. It reports whether it did: a token cannot be
// turned on or off here (that takes a restart), and the same token
// changes nothing.
func (s *Server) SetToken(t string) bool {
	old := s.tokenNow()
	if t == "" || old == "" || t == old {
		return false
	}
	s.token.Store(&t)
	s.sessions.endAll()
	return true
}

// SetFaultsEnabled turns POST and DELETE /v1/plugins/NAME/faults on or
// off, as Options.Faults does at New: a reload of the host config's
// debug.faults. Turning them off leaves the faults already set in place;
// clearing them is the caller's business.
func (s *Server) SetFaultsEnabled(on bool) { s.faults.Store(on) }

// muxAnswer keeps the status and header of ServeMux's own answer and
// drops its body.
type muxAnswer struct {
	header http.Header
	code   int
}

func (a *muxAnswer) Header() http.Header         { return a.header }
func (a *muxAnswer) Write(b []byte) (int, error) { return len(b), nil }
func (a *muxAnswer) WriteHeader(code int)        { a.code = code }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
