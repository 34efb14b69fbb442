// Command envdump is a plugin for the catalog tests: it reports the
// environment it was started with, so that the tests can check the host
// passes on only the variables it allows. GET /env answers the variables
// as a JSON array of "NAME=value" strings; Configure prints each name to
// stdout, where the host's log capture picks it up.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"

	"github.com/plughost/plughost/sdk"
)

func main() {
	env := os.Environ()
	sort.Strings(env)
	mux := sdk.NewMux()
	mux.HandleFunc("GET /env", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(env)
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "envdump",
		Version: "0.0.1",
		Routes:  mux,
		Configure: func(context.Context, *sdk.Runtime) error {
			for _, kv := range env {
				name, _, _ := strings.Cut(kv, "=")
				fmt.Println("envdump: name", name)
			}
			fmt.Println("envdump: done")
			return nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
