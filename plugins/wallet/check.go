package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// exitError is an error with the exit status it calls for: 1 for damage
// found or not repaired, 2 for a usage error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// checkLockTimeout is how long the check waits for the ledger's file
// lock, which a running wallet holds.
const checkLockTimeout = 200 * time.Millisecond

// runCheck is "wallet check [-repair] DATA_DIR": it verifies the ledger
// in DATA_DIR offline (ledger.Check) and prints one line per problem and
// a summary; with -repair it cuts a damaged log back to its last good
// record and prints what that dropped.
func runCheck(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("wallet check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	repair := fs.Bool("repair", false, "cut a damaged write-ahead log back to its last good record; this loses the acknowledged operations it reports")
	dataDir := fs.String("data-dir", "", "the wallet's data directory (or give it as the argument)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: wallet check [-repair] DATA_DIR")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return &exitError{2, err}
	}
	dir := *dataDir
	switch {
	case dir == "" && fs.NArg() == 1:
		dir = fs.Arg(0)
	case dir == "" || fs.NArg() != 0:
		fs.Usage()
		return &exitError{2, errors.New("wallet check: give one data directory")}
	}
	path := filepath.Join(dir, "wallet.db")
	opts := ledger.Options{LockTimeout: checkLockTimeout}
	check := ledger.Check
	if *repair {
		check = ledger.Repair
	}
	rep, err := check(path, opts)
	if errors.Is(err, ledger.ErrLocked) {
		return &exitError{1, fmt.Errorf("wallet check %s: the wallet is running; stop it first: %w", dir, err)}
	}
	rep.Print(stdout, nil)
	verb := "a repair drops"
	if rep.Repaired {
		verb = "dropped"
	}
	if rep.Drops != nil {
		to := "an unknown last seq"
		if rep.LostTo != 0 {
			to = fmt.Sprintf("seq %d (%s)", rep.LostTo, ledger.TxID(rep.LostTo))
		}
		fmt.Fprintf(stdout, "%s: acknowledged operations from seq %d (%s) to %s, %d of their idempotency keys readable:\n", verb, rep.LostFrom, ledger.TxID(rep.LostFrom), to, len(rep.LostKeys))
		for _, k := range rep.LostKeys {
			fmt.Fprintf(stdout, "  %s\n", k)
		}
	}
	switch {
	case err != nil:
		return &exitError{1, fmt.Errorf("wallet check %s: %w", dir, err)}
	case rep.Repaired:
		fmt.Fprintf(stdout, "%s: repaired; the wallet opens at seq %d\n", dir, rep.Seq)
		return nil
	case rep.OK():
		fmt.Fprintf(stdout, "%s: healthy, seq %d\n", dir, rep.Seq)
		return nil
	case rep.Repairable:
		return &exitError{1, fmt.Errorf("%s: %s in the write-ahead log; restore the data dir from a backup, or run wallet check -repair to drop what is listed above", dir, problems(len(rep.Problems)+rep.Omitted))}
	default:
		return &exitError{1, fmt.Errorf("%s: %s; restore the data dir from a backup", dir, problems(len(rep.Problems)+rep.Omitted))}
	}
}

// problems is "1 problem" or "N problems".
func problems(n int) string {
	if n == 1 {
		return "1 problem"
	}
	return fmt.Sprintf("%d problems", n)
}
