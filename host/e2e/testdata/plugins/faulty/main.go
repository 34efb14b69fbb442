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

func main() {
	var sick atomic.Bool
	mux := sdk.NewMux()
	mux.HandleFunc("GET /panic", func(http.ResponseWriter, *http.Request) {
		panic("faulty: deliberate panic")
	})
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /print", func(w http.ResponseWriter, r *http.Request) {
		msg := r.URL.Query().Get("msg")
		fmt.Println("stdout:", msg)
		fmt.Fprintln(os.Stderr, "stderr:", msg)
		fmt.Fprintln(w, "printed")
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	})
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
	mux.HandleFunc("POST /sick", func(w http.ResponseWriter, _ *http.Request) {
		sick.Store(true)
		fmt.Fprintln(w, "sick")
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
			if sick.Load() {
				// Hang past the host's health timeout, as a wedged plugin would.
				<-ctx.Done()
			}
			return sdk.Health{Status: sdk.StatusReady}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
