package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk"
)

// maxSleep bounds /sleep so one request cannot hold a slot for ever.
const maxSleep = 10 * time.Minute

type config struct {
	Greeting string `json:"greeting"`
}

// hello serves the plugin's routes. Its fields are set once in configure,
// before the first request.
type hello struct {
	greeting atomic.Pointer[string]
	sleeps   prometheus.Counter
	mux      *sdk.Mux
}

func definition() sdk.Plugin {
	h := &hello{mux: sdk.NewMux()}
	g := "hello"
	h.greeting.Store(&g)
	// greet answers from memory at once: it runs on the connection's reader.
	h.mux.HandleFunc("GET /{$}", h.greet, sdk.Inline())
	h.mux.HandleFunc("GET /sleep", h.sleep, sdk.Timeout(maxSleep))
	return sdk.Plugin{
		Name:    "hello",
		Version: "0.1.0",
		Routes:  h.mux,
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "greeting", Type: sdk.TypeString, Default: "hello", Description: "what GET / answers"},
		}},
		Configure: h.configure,
	}
}

func (h *hello) configure(_ context.Context, rt *sdk.Runtime) error {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	if c.Greeting == "" {
		return &sdk.ConfigError{Attribute: "greeting", Message: "must not be empty"}
	}
	h.greeting.Store(&c.Greeting)
	h.sleeps = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hello_sleeps_total",
		Help: "Sleep requests served, whether they finished or were cancelled.",
	})
	return rt.Registerer.Register(h.sleeps)
}

func (h *hello) greet(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"greeting": *h.greeting.Load()})
}

func (h *hello) sleep(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.ParseInt(r.URL.Query().Get("ms"), 10, 64)
	if err != nil || ms < 0 || ms > maxSleep.Milliseconds() {
		sdk.WriteError(w, http.StatusBadRequest, "bad_request", "ms must be an integer from 0 to 600000")
		return
	}
	if h.sleeps != nil {
		h.sleeps.Inc()
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		writeJSON(w, http.StatusOK, map[string]any{"slept_ms": ms})
	case <-r.Context().Done():
		// The caller is gone or its deadline passed; nobody reads this.
		sdk.WriteError(w, http.StatusServiceUnavailable, "cancelled", r.Context().Err().Error())
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
