// Command flood is a plugin for the tests of the host's limit on plugin
// output. Once configured it writes to its output in a tight loop, until
// it exits: with FLOOD=stdout (the default) numbered lines to stdout, with
// FLOOD=log records of its logger, which reach the host on stderr, and
// with FLOOD=rawlog the same records from a logger of its own, as a
// plugin not built with the SDK writes them, which the SDK does not
// limit.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "flood")
	})
	var once sync.Once
	return sdk.Serve(sdk.Plugin{
		Name:    "flood",
		Version: "0.0.1",
		Routes:  mux,
		Configure: func(_ context.Context, rt *sdk.Runtime) error {
			once.Do(func() {
				switch os.Getenv("FLOOD") {
				case "log":
					go func() {
						for i := 0; ; i++ {
							rt.Logger.Info("flood record", "n", i)
						}
					}()
					return
				case "rawlog":
					// The process's stderr: os.Stderr is a stream to the
					// host once sdk.Serve runs.
					logger := hclog.New(&hclog.LoggerOptions{
						Name: "flood", Level: hclog.Trace, Output: os.NewFile(2, "stderr"), JSONFormat: true,
					})
					go func() {
						for i := 0; ; i++ {
							logger.Info("flood record", "n", i)
						}
					}()
					return
				}
				// os.Stdout is the stream to the host once sdk.Serve runs.
				out := os.Stdout
				go func() {
					for i := 0; ; i++ {
						fmt.Fprintf(out, "flood line %d of a plugin that writes to stdout in a tight loop\n", i)
					}
				}()
			})
			return nil
		},
	})
}
