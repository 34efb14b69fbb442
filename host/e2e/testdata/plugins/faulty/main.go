// Command faulty is a plugin for the end-to-end tests: it panics, prints to
// stdout and stderr, streams, and can be told to stop answering health
// checks.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/plughost/plughost/sdk"
)

// The body limits of POST /echo/small and POST /echo/large.
const (
	smallBody = 1 << 10
	largeBody = 256 << 10
)

func main() {
	var sick atomic.Bool
	// failing is how many of the next health checks hang; healthy counts
	// the health checks answered at once.
	var failing, healthy atomic.Int64
	mux := sdk.NewMux()
	mux.HandleFunc("GET /panic", func(http.ResponseWriter, *http.Request) {
		panic("faulty: deliberate panic")
	})
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	// hop answers with headers about a connection the plugin does not
	// have, beside one of its own.
	mux.HandleFunc("GET /hop", func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h.Set("Connection", "x-named, close")
		h.Set("X-Named", "1")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Upgrade", "h2c")
		h.Set("Trailer", "X-Trailing")
		h.Set("Proxy-Authenticate", "Basic")
		h.Set("X-Kept", "1")
		fmt.Fprintln(w, "hop")
	})
	// cookies answers the request's Cookie headers, one a line.
	mux.HandleFunc("GET /cookies", func(w http.ResponseWriter, r *http.Request) {
		for _, v := range r.Header.Values("Cookie") {
			fmt.Fprintln(w, v)
		}
	})
	// sized answers HEAD as a proxy does: the length of the GET's body,
	// and no body.
	mux.HandleFunc("HEAD /sized", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "42")
	})
	// code answers status c (default 200) and the body "coded", after an
	// interim 103 when early is set.
	mux.HandleFunc("GET /code", func(w http.ResponseWriter, r *http.Request) {
		c, err := strconv.Atoi(r.URL.Query().Get("c"))
		if err != nil {
			c = http.StatusOK
		}
		if r.URL.Query().Has("early") {
			w.Header().Set("Link", "</x>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		}
		w.WriteHeader(c)
		fmt.Fprint(w, "coded")
	})
	mux.HandleFunc("GET /print", func(w http.ResponseWriter, r *http.Request) {
		msg := r.URL.Query().Get("msg")
		fmt.Println("stdout:", msg)
		fmt.Fprintln(os.Stderr, "stderr:", msg)
		fmt.Fprintln(w, "printed")
	})
	echo := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}
	mux.HandleFunc("POST /echo", echo)
	// The same, with body limits of their own (sdk.MaxBody): below and
	// above the host's in the tests.
	mux.HandleFunc("POST /echo/small", echo, sdk.MaxBody(smallBody))
	mux.HandleFunc("POST /echo/large", echo, sdk.MaxBody(largeBody))
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(20 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}, sdk.Streaming())
	// POST /sick wedges every later health check; POST /sick?checks=N
	// only the next N, so the plugin then recovers.
	mux.HandleFunc("POST /sick", func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query().Get("checks"); q != "" {
			n, err := strconv.ParseInt(q, 10, 64)
			if err != nil || n < 1 {
				sdk.WriteError(w, http.StatusBadRequest, "bad_request", "checks must be a positive integer")
				return
			}
			failing.Store(n)
			fmt.Fprintln(w, "sick for", n, "checks")
			return
		}
		sick.Store(true)
		fmt.Fprintln(w, "sick")
	})
	// POST /poke takes no body (sdk.NoBody): the host refuses one.
	mux.HandleFunc("POST /poke", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "poked")
	}, sdk.NoBody())
	mux.HandleFunc("GET /healthy", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, healthy.Load())
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "faulty",
		Version: "0.0.1",
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "label", Type: sdk.TypeString, Default: "faulty"},
			{Name: "limit", Type: sdk.TypeNumber, Default: 3},
		}},
		Routes: mux,
		Health: func(ctx context.Context) sdk.Health {
			if sick.Load() || takeOne(&failing) {
				// Hang past the host's health timeout, as a wedged plugin
				// would, and a while past this call's own deadline: an
				// answer sent as it passes can reach the host before the
				// host's timer fires, and count as a success.
				<-ctx.Done()
				<-time.After(time.Second)
				return sdk.Health{Status: sdk.StatusReady}
			}
			healthy.Add(1)
			return sdk.Health{Status: sdk.StatusReady}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// takeOne takes one from n if it is positive, and reports whether it did.
func takeOne(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}
