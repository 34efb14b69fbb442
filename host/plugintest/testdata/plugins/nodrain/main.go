// Command nodrain is a faulty plugin for the kit's own tests: its Drain
// hook ignores its deadline and its /work handler ignores cancellation.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/plughost/plughost/sdk"
)

func main() {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /work", func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(200 * time.Millisecond)
		fmt.Fprintln(w, "done")
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "nodrain",
		Version: "0.0.1",
		Routes:  mux,
		Drain: func(context.Context) error {
			time.Sleep(time.Minute) // ignores ctx: the fault under test
			return nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
