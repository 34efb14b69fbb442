// Command bodies is a plugin for the end-to-end data-plane tests: it sums
// large request bodies, sends large responses, streams until its client
// goes away (counting the streams it saw cancelled), and dies on purpose
// in the middle of a request body or a response stream.
package main

import (
	"crypto/sha256"
	"encoding/hex"
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

func main() {
	var canceled atomic.Int64
	mux := sdk.NewMux()
	// POST /sum answers the body's length and sha256.
	mux.HandleFunc("POST /sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"bytes": n, "sha256": hex.EncodeToString(h.Sum(nil))})
	})
	// GET /blob?n=N answers N bytes of a repeating pattern.
	mux.HandleFunc("GET /blob", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		_, _ = w.Write(pattern(n))
	})
	// GET /ticks streams a numbered event every 10 ms until the client goes
	// away.
	mux.HandleFunc("GET /ticks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(10 * time.Millisecond):
			case <-r.Context().Done():
				canceled.Add(1)
				return
			}
		}
	}, sdk.Streaming())
	// GET /canceled answers how many /ticks streams ended by cancellation.
	mux.HandleFunc("GET /canceled", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, canceled.Load())
	})
	// GET /die-mid-stream sends a first event, then the process exits.
	mux.HandleFunc("GET /die-mid-stream", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond) // let the event leave before the exit
		os.Exit(3)
	}, sdk.Streaming())
	// POST /die-mid-body reads a first piece of the body, then the process
	// exits.
	mux.HandleFunc("POST /die-mid-body", func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadFull(r.Body, make([]byte, 1024))
		os.Exit(3)
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "bodies",
		Version: "0.0.1",
		Routes:  mux,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// pattern returns n bytes of "0123456789abcdef" repeated, which a test can
// check without holding a copy.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "0123456789abcdef"[i%16]
	}
	return b
}
