// Package admin serves the host's admin listener: GET /metrics with the
// host's and every plugin's metrics, GET /v1/plugins and
// POST /v1/plugins/NAME/restart. It holds no state of its own.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/plughost/plughost/host/supervisor"
)

// Plugins is what the admin API needs from the host's plugin set.
type Plugins interface {
	// Statuses lists every plugin, sorted by name.
	Statuses() []supervisor.Status
	// Restart drains and restarts the named plugin; false when there is no
	// such plugin.
	Restart(name string) bool
}

// New returns the admin handler. When token is not empty, /v1/ requests
// need "Authorization: Bearer <token>"; /metrics stays open for scrapers.
func New(g prometheus.Gatherer, plugins Plugins, token string) http.Handler {
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
			writeError(w, http.StatusNotFound, "not_found", "no plugin named "+strconv.Quote(name))
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "restarting", "plugin": name})
	})
	mux.Handle("/v1/", auth(token, api))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
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
			writeError(w, http.StatusUnauthorized, "unauthorized", "admin API requests need Authorization: Bearer <token>")
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
			if strings.HasSuffix(r.URL.Path, "/restart") || r.URL.Path == "/v1/plugins" {
				writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed here")
				return
			}
			writeError(w, http.StatusNotFound, "not_found", "no admin endpoint at "+r.URL.Path)
			return
		}
		m.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, code int, errCode, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]string{"code": errCode, "message": msg}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
