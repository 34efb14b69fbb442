// Command mailbox is the plughost mailbox plugin: durable topics of
// messages that consumers receive with a visibility timeout and a receipt,
// then ack, nack, extend or terminate; a message delivered max_attempts
// times moves to TOPIC.dlq, from which redrive moves it back. Sends may
// carry an Idempotency-Key, deduplicated for dedup_window. Every change is
// written through the SDK's group committer (sdk/durable) into the
// plugin's store (sdk/store) and answered only once it is fdatasynced:
// at-least-once delivery across kill -9. See docs/plugins/mailbox.md.
//
// Run as "mailbox check [-repair] DATA_DIR", it verifies a stopped
// mailbox's store offline instead of serving; as "mailbox mint ...", it
// mints a capability token (auth.go).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/store"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the check subcommand, or serves the plugin until the host
// closes the connection, and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "mint" {
		return runMint(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "check" {
		return store.CheckCommand{Name: "mailbox", File: storeFile, Options: storeOpts}.Run(args[1:], stdout, stderr)
	}
	tuneGC(os.Getenv)
	if err := sdk.Serve(definition()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// The garbage collector's settings when the environment sets none. The
// mailbox's live heap is small (the store, in its file, holds the
// messages) while every message allocates its decoded payload and
// buffers, so at GOGC=100 the collector ran so often that it cost about
// a third of the CPU per message (BenchmarkThroughput); gcPercent trades
// a few times the small live heap for that. gcMemoryLimit bounds what
// that trade may cost: past it the collector runs as often as it must.
const (
	gcPercent     = 400
	gcMemoryLimit = 128 << 20
)

// tuneGC applies gcPercent and gcMemoryLimit, each unless getenv says the
// operator set GOGC or GOMEMLIMIT. It returns what restores the settings
// it changed.
func tuneGC(getenv func(string) string) (restore func()) {
	restore = func() {}
	if getenv("GOGC") == "" {
		old := debug.SetGCPercent(gcPercent)
		restore = func() { debug.SetGCPercent(old) }
	}
	if getenv("GOMEMLIMIT") == "" {
		old, prev := debug.SetMemoryLimit(gcMemoryLimit), restore
		restore = func() { prev(); debug.SetMemoryLimit(old) }
	}
	return restore
}
