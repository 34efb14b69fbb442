// Command wallet is the plughost wallet plugin: accounts holding balances
// in integer minor units, moved by issue, transfer, burn and all-or-nothing
// batch operations that carry per-account nonces and Idempotency-Keys. It
// keeps its ledger in a bbolt file with a write-ahead log in front of it,
// in the plugin's data directory, and answers 200 only once an
// operation's receipt is fdatasynced in the log; committer goroutines
// group many operations into each log record. Reads come from
// snapshots at most staleness_window old, and committed receipts stream as
// server-sent events. See docs/plugins/wallet.md.
package main

import (
	"fmt"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves the plugin until the host closes the connection.
func run() error {
	return sdk.Serve(definition())
}
