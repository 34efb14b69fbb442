// Command forgetful is a faulty plugin for the kit's own tests: it
// acknowledges writes it keeps only in memory, so a kill -9 loses them.
package main

import (
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/plughost/plughost/sdk"
)

func main() {
	var mu sync.Mutex
	items := map[string]bool{}
	mux := sdk.NewMux()
	mux.HandleFunc("PUT /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		items[r.PathValue("id")] = true // memory only: the fault under test
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := items[r.PathValue("id")]
		mu.Unlock()
		if !ok {
			sdk.WriteError(w, http.StatusNotFound, "not_found", "no such item")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	if err := sdk.Serve(sdk.Plugin{Name: "forgetful", Version: "0.0.1", Routes: mux}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
