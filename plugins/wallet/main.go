// Command wallet is the plughost wallet plugin: accounts holding balances
// in integer minor units, moved by issue, transfer, burn and all-or-nothing
// batch operations that carry per-account nonces and Idempotency-Keys. It
// keeps its ledger in a bbolt file with a write-ahead log in front of it,
// in the plugin's data directory, and answers 200 only once an
// operation's receipt is fdatasynced in the log; committer goroutines
// group many operations into each log record. Reads come from
// snapshots at most staleness_window old, and committed receipts stream as
// server-sent events. See docs/plugins/wallet.md.
//
// Run as "wallet check [-repair] DATA_DIR", it verifies a stopped
// wallet's files offline instead of serving (see check.go).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/plughost/plughost/sdk"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		var ex *exitError
		if errors.As(err, &ex) {
			os.Exit(ex.code)
		}
		os.Exit(1)
	}
}

// run runs the check subcommand, or serves the plugin until the host
// closes the connection.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "check" {
		return runCheck(args[1:], stdout, stderr)
	}
	return sdk.Serve(definition())
}
