// Command mismatch is a faulty plugin for the kit's own tests: its schema
// declares size as a number, but Configure decodes it as a string.
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
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	err := sdk.Serve(sdk.Plugin{
		Name:    "mismatch",
		Version: "0.0.1",
		Config:  sdk.Schema{Attrs: []sdk.Attr{{Name: "size", Type: sdk.TypeNumber, Default: 10}}},
		Routes:  mux,
		Configure: func(_ context.Context, rt *sdk.Runtime) error {
			var c struct {
				Size string `json:"size"`
			}
			return rt.DecodeConfig(&c)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
