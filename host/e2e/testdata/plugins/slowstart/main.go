// Command slowstart is a plugin for the end-to-end lifecycle tests: its
// Configure takes as long as its config's start_delay, as a plugin that
// opens a large store would, so a replacement of it stays in progress
// while a test signals the host. GET /sleep?ms=N answers after N ms or
// when the request is cancelled.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/plughost/plughost/sdk"
)

type config struct {
	StartDelay sdk.Duration `json:"start_delay"`
}

func main() {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			fmt.Fprintln(w, "slept")
		case <-r.Context().Done():
		}
	}, sdk.Timeout(time.Minute))
	err := sdk.Serve(sdk.Plugin{
		Name:    "slowstart",
		Version: "0.0.1",
		Routes:  mux,
		Config: sdk.Schema{Attrs: []sdk.Attr{
			{Name: "start_delay", Type: sdk.TypeDuration, Default: "0s", Description: "how long Configure takes"},
		}},
		Configure: func(ctx context.Context, rt *sdk.Runtime) error {
			var c config
			if err := rt.DecodeConfig(&c); err != nil {
				return err
			}
			d := time.Duration(c.StartDelay)
			fmt.Fprintf(os.Stderr, "slowstart configuring: pid %d, start_delay %s\n", os.Getpid(), d)
			select {
			case <-time.After(d):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
