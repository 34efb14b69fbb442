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
	if err := sdk.Serve(definition()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
