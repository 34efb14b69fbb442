// Package admin serves the host's admin listener: GET /metrics with the
// host's and every plugin's metrics, GET /v1/plugins,
// POST /v1/plugins/NAME/restart and /upgrade, and POST and DELETE
// /v1/plugins/NAME/faults when the operator enabled fault injection. It
// holds no state of its own.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

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
	Faults bool
}

// New returns the admin handler.
func New(g prometheus.Gatherer, plugins Plugins, opts Options) http.Handler {
	token := opts.Token
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
	}))
	api := http.NewServeMux()
	api.HandleFunc("GET /v1/plugins", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, plugins.Statuses())
	})
	api.HandleFunc("POST /v1/plugins/{name}/restart", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if !plugins.Restart(name) {
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no plugin named "+strconv.Quote(name))
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "restarting", "plugin": name})
	})
	api.HandleFunc("POST /v1/plugins/{name}/upgrade", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		switch err := plugins.Upgrade(name); {
		case errors.Is(err, ErrNoPlugin):
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no plugin named "+strconv.Quote(name))
			return
		case errors.Is(err, ErrChecksum):
			sdk.WriteError(w, http.StatusConflict, "checksum_mismatch", err.Error())
			return
		case err != nil:
			sdk.WriteError(w, http.StatusUnprocessableEntity, "unusable_binary", err.Error())
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "upgrading", "plugin": name})
	})
	faults := func(w http.ResponseWriter, r *http.Request, list []Fault) {
		if !opts.Faults {
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
		var body struct {
			Faults []faultJSON `json:"faults"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil {
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", "body must be {\"faults\":[{\"point\":...,\"delay\":\"2s\",\"error\":...}]}: "+err.Error())
			return
		}
		list := make([]Fault, 0, len(body.Faults))
		for _, f := range body.Faults {
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
	mux.Handle("/v1/", auth(token, api))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		sdk.WriteError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
	})
	return mux
}

func auth(token string, next http.Handler) http.Handler {
	if token == "" {
		return notFoundJSON(next)
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="plughost admin"`)
			sdk.WriteError(w, http.StatusUnauthorized, "unauthorized", "admin API requests need Authorization: Bearer <token>")
			return
		}
		notFoundJSON(next).ServeHTTP(w, r)
	})
}

// notFoundJSON turns ServeMux's plain-text 404 and 405 into JSON errors.
func notFoundJSON(mux http.Handler) http.Handler {
	m := mux.(*http.ServeMux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pat := m.Handler(r); pat == "" {
			if strings.HasSuffix(r.URL.Path, "/restart") || strings.HasSuffix(r.URL.Path, "/upgrade") || strings.HasSuffix(r.URL.Path, "/faults") || r.URL.Path == "/v1/plugins" {
				sdk.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
				return
			}
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
			return
		}
		m.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
