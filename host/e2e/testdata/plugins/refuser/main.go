// Command refuser is a plugin for the end-to-end upgrade tests: it
// describes itself as a single-instance plugin, as the wallet does, and
// refuses every config, as a new build whose Configure fails would. An
// upgrade to it gets past Describe, so the host stops the running process
// first, and must then bring the previous binary back.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {})
	err := sdk.Serve(sdk.Plugin{
		Name:           "refuser",
		Version:        "0.0.1",
		Routes:         mux,
		SingleInstance: true,
		Configure: func(context.Context, *sdk.Runtime) error {
			return &sdk.ConfigError{Message: "this build refuses every config"}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
