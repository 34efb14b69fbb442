// Command rewarder is the plughost rewarder plugin: per epoch, it seals
// a pool and its contributions, computes each recipient's reward as a
// pure function with a conservation check (the rewards add up to the
// pool exactly), writes byte-identical artifacts (run.json and its
// BLAKE3 commitment), and settles the rewards through the wallet plugin
// (Runtime.Host.Call) from a transactional outbox with deterministic
// Idempotency-Keys, so that no retry or restart pays twice. An epoch
// whose checks fail is quarantined until the operator asks for a retry.
// State lives in the plugin's store (sdk/store), written through the
// SDK's group committer (sdk/durable). See docs/plugins/rewarder.md.
//
// Run as "rewarder check [-repair] DATA_DIR", it verifies a stopped
// rewarder's store offline instead of serving.
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
	if len(args) > 0 && args[0] == "check" {
		return store.CheckCommand{Name: "rewarder", File: storeFile, Options: storeOpts}.Run(args[1:], stdout, stderr)
	}
	if err := sdk.Serve(definition()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
