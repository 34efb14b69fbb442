package store

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// CheckCommand is the offline check of a plugin's store as a subcommand
// of the plugin's binary, "NAME check [-repair] DATA_DIR", so that an
// operator can verify a stopped plugin's files, and cut a damaged log
// back, without writing any code:
//
//	if len(os.Args) > 1 && os.Args[1] == "check" {
//		os.Exit(store.CheckCommand{Name: "notes", File: "notes.db", Options: opts}.Run(os.Args[2:], os.Stdout, os.Stderr))
//	}
//
// It runs Check (Repair with -repair), prints one line per problem, the
// torn tail Open would trim, and what a repair drops or dropped, then a
// summary. Exit status: 0 healthy or repaired, 1 damage found (or not
// repaired) or the plugin running, 2 a usage error. Damaged files never
// crash it.
type CheckCommand struct {
	// Name is the plugin's name, for the usage line and messages.
	Name string
	// File is the store file's name in the data dir ("notes.db").
	File string
	// Options are the store's, as the plugin opens it: Buckets at least.
	// LockTimeout defaults to 200ms, after which the check says that
	// the plugin is running.
	Options Options
	// Dropped, if set, describes the writes of a run of log records a
	// repair drops in the plugin's terms (the operations lost), a line
	// each.
	Dropped func(Drop) []string
	// Verify, if set, checks the plugin's own invariants on the state the
	// files hold (Inspect), when they have no damage a repair cannot
	// cut; its error is printed as a problem.
	Verify func(*Snapshot) error
}

// checkLockTimeout is CheckCommand's default wait for the store's lock.
const checkLockTimeout = 200 * time.Millisecond

// Run runs the command with args (those after "check") and returns its
// exit status.
func (c CheckCommand) Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(c.Name+" check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	repair := fs.Bool("repair", false, "cut a damaged write-ahead log back to its last good record; this loses the acknowledged writes it reports")
	dataDir := fs.String("data-dir", "", "the plugin's data directory (or give it as the argument)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s check [-repair] DATA_DIR\n", c.Name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dir := *dataDir
	switch {
	case dir == "" && fs.NArg() == 1:
		dir = fs.Arg(0)
	case dir == "" || fs.NArg() != 0:
		fs.Usage()
		fmt.Fprintf(stderr, "%s check: give one data directory\n", c.Name)
		return 2
	}
	opts := c.Options
	opts.LockTimeout = cmp.Or(opts.LockTimeout, checkLockTimeout)
	path := filepath.Join(dir, c.File)
	check := Check
	if *repair {
		check = Repair
	}
	rep, err := check(path, opts)
	if errors.Is(err, ErrLocked) {
		fmt.Fprintf(stderr, "%s check %s: the plugin is running; stop it first: %v\n", c.Name, dir, err)
		return 1
	}
	if err != nil && !errors.Is(err, ErrCorrupt) {
		fmt.Fprintf(stderr, "%s check %s: %v\n", c.Name, dir, err)
		return 1
	}
	var verr error
	if c.Verify != nil && err == nil && (rep.OK() || rep.Repaired) {
		if verr = Inspect(path, opts, c.Verify); verr != nil {
			rep.Problems = append(rep.Problems, Problem{File: c.File, What: verr.Error()})
		}
	}
	rep.Print(stdout, c.Dropped)
	n := len(rep.Problems) + rep.Omitted
	switch {
	case rep.Repaired && verr == nil:
		fmt.Fprintf(stdout, "%s: repaired\n", dir)
		return 0
	case n == 0:
		fmt.Fprintf(stdout, "%s: healthy\n", dir)
		return 0
	case rep.Repairable && !rep.Repaired:
		fmt.Fprintf(stderr, "%s: %d problem(s) in the write-ahead log; restore the data dir from a backup, or run %s check -repair to drop what is listed above\n", dir, n, c.Name)
	default:
		fmt.Fprintf(stderr, "%s: %d problem(s); restore the data dir from a backup\n", dir, n)
	}
	return 1
}

// Print writes the report as CheckCommand does, a line per problem, the
// torn tail and each run of records a repair drops (or dropped), with
// dropped's lines, if set, under each run.
func (r Report) Print(w io.Writer, dropped func(Drop) []string) {
	for _, p := range r.Problems {
		fmt.Fprintf(w, "problem: %s\n", p)
	}
	if r.Omitted > 0 {
		fmt.Fprintf(w, "problem: %d more not listed\n", r.Omitted)
	}
	if t := r.Trimmed; t != nil {
		fmt.Fprintf(w, "torn tail: %s record %d at offset %d (%d bytes), never acknowledged; the plugin leaves it out when it opens\n", t.File, t.Record, t.Offset, t.Bytes)
	}
	verb := "a repair drops"
	if r.Repaired {
		verb = "dropped"
	}
	for _, d := range r.Drops {
		fmt.Fprintf(w, "%s: %s records %d to %d of generation %d (%d records, %d bytes from offset %d)\n", verb, d.File, d.First, d.Last, d.Gen, d.Records, d.Bytes, d.Offset)
		if dropped != nil {
			for _, line := range dropped(d) {
				fmt.Fprintf(w, "  %s\n", line)
			}
		}
	}
}
