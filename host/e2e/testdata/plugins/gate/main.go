// Command gate is a plugin for the end-to-end streaming test: GET /stream
// sends a first event, then holds the response open until POST /release,
// then sends a last event and ends. A client can therefore only see the
// first event before the end if the host forwards the stream as it comes,
// because the end waits for something the client does after seeing it.
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/plughost/plughost/sdk"
)

func main() {
	release := make(chan struct{}, 1)
	mux := sdk.NewMux()
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
			fmt.Fprint(w, "data: last\n\n")
		case <-r.Context().Done():
		}
	}, sdk.Streaming(), sdk.Timeout(30*time.Second))
	mux.HandleFunc("POST /release", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case release <- struct{}{}:
		default:
		}
		fmt.Fprintln(w, "released")
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "gate",
		Version: "0.0.1",
		Routes:  mux,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
