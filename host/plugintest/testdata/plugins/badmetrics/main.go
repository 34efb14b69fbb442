// Command badmetrics is a faulty plugin for the kit's own tests: it
// registers a metric under the host's reserved prefix and a counter
// without the _total suffix.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk"
)

func main() {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	err := sdk.Serve(sdk.Plugin{
		Name:    "badmetrics",
		Version: "0.0.1",
		Routes:  mux,
		Configure: func(_ context.Context, rt *sdk.Runtime) error {
			reserved := prometheus.NewCounter(prometheus.CounterOpts{Name: "plughost_requests_total", Help: "Impersonates the host."})
			unsuffixed := prometheus.NewCounter(prometheus.CounterOpts{Name: "badmetrics_handled", Help: "A counter without _total."})
			unsuffixed.Inc()
			rt.Registerer.MustRegister(reserved, unsuffixed)
			return nil
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
