// Command registry is the plughost registry plugin: an append-only log of
// artifacts, each committed once a quorum of configured approvers has
// signed its digest. One committer appends each entry to a BLAKE3 hash
// chain and a Merkle tree and moves HEAD{version,hash} by compare-and-set,
// through the SDK's group committer (sdk/durable) into the plugin's store
// (sdk/store): an approval is answered only once its commit is
// fdatasynced. Signed checkpoints (C2SP tlog-checkpoint as a signed note)
// cover the tree, inclusion and consistency proofs verify with
// golang.org/x/mod/sumdb/tlog, retention prunes entry data only below a
// checkpoint, a deep verifier re-checks the chain, and readers follow
// commits over a resumable stream. See docs/plugins/registry.md.
//
// Run as "registry check [-repair] DATA_DIR", it verifies a stopped
// registry's store offline instead of serving.
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
		return store.CheckCommand{Name: "registry", File: storeFile, Options: storeOpts}.Run(args[1:], stdout, stderr)
	}
	if err := sdk.Serve(definition()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
