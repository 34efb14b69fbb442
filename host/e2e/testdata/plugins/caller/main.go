// Command caller is a plugin for the end-to-end tests: it calls another
// plugin's routes through the host's Host service (across the go-plugin
// broker) and serves a slow route without a route timeout of its own, so
// that the host's request_timeout applies to it.
//
//	GET /call?plugin=P&path=/X           calls P's GET /X and relays its answer
//	GET /call-sleep?ms=N&timeout_ms=T    calls the target's /sleep?ms=N with a T ms deadline
//	GET /slow?ms=N                       answers after N ms or when the request is cancelled
//	GET /cancelled                       how many /slow requests saw their context end
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/plughost/plughost/sdk"
)

type config struct {
	Target string `json:"target"`
}

type caller struct {
	host      atomic.Pointer[sdk.Host]
	target    atomic.Pointer[string]
	cancelled atomic.Int64
}

func main() {
	c := &caller{}
	mux := sdk.NewMux()
	mux.HandleFunc("GET /call", c.call)
	mux.HandleFunc("GET /call-sleep", c.callSleep)
	mux.HandleFunc("GET /slow", c.slow)
	mux.HandleFunc("GET /cancelled", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]int64{"cancelled": c.cancelled.Load()})
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "caller",
		Version: "0.0.1",
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "target", Type: sdk.TypeString, Default: "hello", Description: "the plugin /call-sleep calls"},
		}},
		Routes:    mux,
		Configure: c.configure,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func (c *caller) configure(_ context.Context, rt *sdk.Runtime) error {
	var cfg config
	if err := rt.DecodeConfig(&cfg); err != nil {
		return err
	}
	c.target.Store(&cfg.Target)
	c.host.Store(&rt.Host)
	return nil
}

// call relays another plugin's answer: its status, content type and body.
func (c *caller) call(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	target, path := q.Get("plugin"), q.Get("path")
	if target == "" {
		target = *c.target.Load()
	}
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, path, nil)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	resp, err := (*c.host.Load()).Call(r.Context(), target, req)
	if err != nil {
		writeJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// callSleep calls the target's /sleep with its own, shorter deadline and
// reports what came back and how long it took.
func (c *caller) callSleep(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	timeout, err := strconv.Atoi(q.Get("timeout_ms"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "timeout_ms: " + err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(timeout)*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/sleep?ms="+q.Get("ms"), nil)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	start := time.Now()
	out := map[string]any{}
	resp, err := (*c.host.Load()).Call(ctx, *c.target.Load(), req)
	if err != nil {
		out["error"] = err.Error()
	} else {
		_ = resp.Body.Close()
		out["status"] = resp.StatusCode
	}
	out["elapsed_ms"] = time.Since(start).Milliseconds()
	writeJSON(w, http.StatusOK, out)
}

func (c *caller) slow(w http.ResponseWriter, r *http.Request) {
	ms, err := strconv.Atoi(r.URL.Query().Get("ms"))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "ms: " + err.Error()})
		return
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		writeJSON(w, http.StatusOK, map[string]int{"slept_ms": ms})
	case <-r.Context().Done():
		c.cancelled.Add(1)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": r.Context().Err().Error()})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
