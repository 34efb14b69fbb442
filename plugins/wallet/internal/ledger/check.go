package ledger

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/plughost/plughost/sdk/store"
)

// Report is what Check or Repair found in a ledger's files: the store's
// report (store.Check), with the ledger's invariants and what a repair
// loses in the ledger's terms.
type Report struct {
	store.Report
	// Seq is the last receipt's seq in the state the files hold up to
	// the log's last good record (what Open gives, after a repair if the
	// log is damaged); 0 if the files cannot be read.
	Seq uint64
	// LostFrom and LostTo are the receipt seqs a repair loses: LostFrom
	// is Seq + 1, and LostTo the highest seq in the dropped records that
	// can be read, 0 if none can (then how many are lost is unknown).
	// Both are 0 when the log is whole.
	LostFrom, LostTo uint64
	// LostKeys are the idempotency keys recorded in the dropped records
	// that can be read, sorted.
	LostKeys []string
}

// Check verifies the ledger's files at path offline, without changing
// them: the store's check (bbolt's consistency check, every value's
// checksum, the write-ahead log), then, if those can be read, the
// ledger's invariants (supply = issued − burned = the sum of balances;
// the last receipt is there). It fails with an error wrapping ErrLocked
// while a process holds the ledger (after opts.LockTimeout), and with
// one wrapping store.ErrNotStore for files of the wallet's release
// before the store, which Open converts, or of no ledger.
func Check(path string, opts Options) (Report, error) {
	srep, err := store.Check(path, storeOptions(opts))
	if errors.Is(err, store.ErrNotStore) {
		return Report{}, notStore(path, opts, err)
	}
	if err != nil {
		return Report{}, fmt.Errorf("check ledger: %w", err)
	}
	return explain(path, opts, srep)
}

// Repair cuts a damaged write-ahead log of the ledger back to its last
// good record (store.Repair) and reports what it dropped, in receipts
// and idempotency keys. The dropped operations were acknowledged to
// clients: Repair is for an operator who has no backup to restore. It
// refuses damage that cutting the log cannot repair, and a ledger whose
// invariants would be broken after the cut, with an error wrapping
// ErrCorrupt.
func Repair(path string, opts Options) (Report, error) {
	rep, err := Check(path, opts)
	if err != nil {
		return rep, err
	}
	if rep.OK() {
		return rep, nil
	}
	if !rep.Repairable {
		p := rep.Problems[0]
		return rep, &store.CorruptError{File: p.File, Where: p.Where, Problem: p.What,
			Remedy: "this cannot be repaired by cutting the write-ahead log; restore the data dir from a backup"}
	}
	srep, err := store.Repair(path, storeOptions(opts))
	if err != nil {
		return rep, fmt.Errorf("repair ledger: %w", err)
	}
	rep.Repaired = srep.Repaired
	return rep, nil
}

func storeOptions(opts Options) store.Options {
	return store.Options{Buckets: buckets, LockTimeout: opts.LockTimeout}
}

// explain adds the ledger's invariants and losses to the store's report.
func explain(path string, opts Options, srep store.Report) (Report, error) {
	rep := Report{Report: srep}
	if !srep.OK() && !srep.Repairable {
		return rep, nil // the state cannot be read
	}
	err := store.Inspect(path, storeOptions(opts), func(s *store.Snapshot) (err error) {
		rep.Seq, err = verifySnapshot(s)
		return err
	})
	var ce *store.CorruptError
	switch {
	case errors.As(err, &ce):
		rep.Problems = append(rep.Problems, store.Problem{File: filepath.Base(path), Where: ce.Where, What: ce.Problem})
		rep.Repairable = false
	case err != nil:
		return rep, fmt.Errorf("check ledger: %w", err)
	}
	if srep.Drops == nil {
		return rep, nil
	}
	rep.LostFrom = rep.Seq + 1
	for _, dr := range srep.Drops {
		for _, g := range dr.Groups {
			for _, w := range g {
				switch {
				case w.Bucket == bReceipts && len(w.Key) == 8:
					rep.LostTo = max(rep.LostTo, binary.BigEndian.Uint64(w.Key))
				case w.Bucket == bIdem && !w.Delete:
					rep.LostKeys = append(rep.LostKeys, string(w.Key))
				}
			}
		}
	}
	slices.Sort(rep.LostKeys)
	rep.LostKeys = slices.Compact(rep.LostKeys)
	return rep, nil
}

// notStore says what the file at path, which store.Check found not to be
// a store's (err), is instead: the ledger of the release before the
// store, which Open converts, or no ledger.
func notStore(path string, opts Options, err error) error {
	db, berr := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: cmp.Or(opts.LockTimeout, DefaultLockTimeout)})
	if berr != nil {
		return fmt.Errorf("check ledger: %w", err)
	}
	defer func() { _ = db.Close() }()
	var old oldFile
	if berr = db.View(func(tx *bolt.Tx) (err error) {
		old, err = readOldFile(tx)
		return err
	}); berr != nil {
		return fmt.Errorf("check ledger: %w: %v", err, berr)
	}
	return fmt.Errorf("check ledger: a file of the wallet's release before the store (format %d), which check does not read; start the wallet once to convert it, then check it: %w", old.format, err)
}
