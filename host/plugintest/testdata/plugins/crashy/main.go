// Command crashy is a faulty plugin for the kit's own tests: a malformed
// JSON body makes it panic in a goroutine, which the SDK cannot recover,
// so the process dies.
package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	mux := sdk.NewMux()
	mux.HandleFunc("POST /items", func(w http.ResponseWriter, r *http.Request) {
		var item struct{ Name string }
		if err := json.NewDecoder(r.Body).Decode(&item); err != nil {
			done := make(chan struct{})
			go func() {
				defer close(done)
				panic("crashy: cannot handle " + err.Error())
			}()
			<-done
		}
		fmt.Fprintln(w, "stored")
	})
	err := sdk.Serve(sdk.Plugin{
		Name:    "crashy",
		Version: "0.0.1",
		Routes:  mux,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
