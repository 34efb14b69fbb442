// Command frail is a plugin for the tests of storage faults and
// readiness. What it does is set by files in its data dir, which a test
// writes and removes while it runs:
//
//   - corrupt: Configure reports corrupt storage (sdk.ErrStorageCorrupt)
//     with the file's content as its detail.
//   - refuse: Configure fails with the file's content, as a store that
//     cannot open for a full disk would; the host retries it.
//   - crash: Configure logs the file's content at error level, then the
//     process panics with it, as a storage engine that panics on a damaged
//     page would.
//   - health: its content, "degraded" or "not_ready", is the plugin's
//     health; without it the plugin is ready.
//
// It declares itself single-instance, as a plugin that locks its data
// files does.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/plughost/plughost/sdk"
)

func main() {
	var dataDir atomic.Pointer[string]
	read := func(name string) (string, bool) {
		dir := dataDir.Load()
		if dir == nil {
			return "", false
		}
		b, err := os.ReadFile(filepath.Join(*dir, name))
		return strings.TrimSpace(string(b)), err == nil
	}
	mux := sdk.NewMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "frail")
	})
	err := sdk.Serve(sdk.Plugin{
		Name:           "frail",
		Version:        "0.0.1",
		Routes:         mux,
		SingleInstance: true,
		Configure: func(_ context.Context, rt *sdk.Runtime) error {
			dataDir.Store(&rt.DataDir)
			if detail, ok := read("corrupt"); ok {
				return fmt.Errorf("%w: %s", sdk.ErrStorageCorrupt, detail)
			}
			if detail, ok := read("refuse"); ok {
				return fmt.Errorf("open store: %s", detail)
			}
			if detail, ok := read("crash"); ok {
				rt.Logger.Error("open store failed", "error", detail)
				// A panic outside the hook, which the SDK cannot recover:
				// the process dies while the host waits for Configure.
				go func() { panic("frail: " + detail) }()
				select {}
			}
			return nil
		},
		Health: func(context.Context) sdk.Health {
			switch h, _ := read("health"); h {
			case "degraded":
				return sdk.Health{Status: sdk.StatusDegraded, Reason: "told to be degraded"}
			case "not_ready":
				return sdk.Health{Status: sdk.StatusNotReady, Reason: "told to be not ready"}
			}
			return sdk.Health{Status: sdk.StatusReady}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
