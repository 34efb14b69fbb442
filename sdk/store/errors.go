package store

import (
	"errors"
	"fmt"

	"github.com/plughost/plughost/sdk"
)

// Errors of the store. CorruptError is the one for damaged files.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store closed")
	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = errors.New("store file locked")
	// ErrFailed is wrapped by every write once a disk error has left the
	// files in a state the store cannot vouch for (DB.Err). Reopen
	// recovers from the write-ahead log, once the disk allows it.
	ErrFailed = errors.New("store failed: reopen it to recover")
	// ErrOutcomeUnknown is wrapped by the error of a group that may or may
	// not have been committed: its log record could be neither written
	// for sure nor erased. A recovery may replay it.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrCorrupt is wrapped by *CorruptError: stored data failed a
	// checksum or a structural check. It is sdk.ErrStorageCorrupt, so a
	// Configure hook that returns Open's error has the host show the
	// plugin failed with the error's message instead of restarting it.
	ErrCorrupt = sdk.ErrStorageCorrupt
	// ErrNotStore is wrapped by the error of Open and Check for a bbolt
	// file that the store did not write: it has buckets but not the
	// store's own. It is no damage: a plugin's files from before it
	// used the store, say, which the plugin converts with Import.
	ErrNotStore = errors.New("not a store file")
	// ErrKeyRequired is returned by Tx.Put and Tx.Delete for an empty
	// key.
	ErrKeyRequired = errors.New("store: key required")
	// ErrKeyTooLarge is returned by Tx.Put and Tx.Delete for a key
	// longer than MaxKeySize.
	ErrKeyTooLarge = errors.New("store: key too large")
	// ErrValueTooLarge is returned by Tx.Put for a value longer than
	// MaxValueSize.
	ErrValueTooLarge = errors.New("store: value too large")
	// ErrNoBucket is wrapped by the error of a Tx write to a bucket
	// number that Options.Buckets does not have.
	ErrNoBucket = errors.New("store: no such bucket")
)

// CorruptError reports damaged storage: a log record or a stored value
// that fails its checksum, a log that cannot belong to the file, a page
// that cannot be read. The store refuses to open such files, and once it
// meets one while running it refuses every write (DB.Err).
type CorruptError struct {
	// File is the damaged file's base name.
	File string
	// Where says where in it: "record 17 at offset 20", "bucket accounts
	// key \"a\"", "page 12".
	Where string
	// Problem is what is wrong: "checksum mismatch".
	Problem string
	// Remedy is what an operator can do.
	Remedy string
}

func (e *CorruptError) Error() string {
	msg := "storage corrupt: " + e.File
	if e.Where != "" {
		msg += " " + e.Where
	}
	msg += ": " + e.Problem
	if e.Remedy != "" {
		msg += "; " + e.Remedy
	}
	return msg
}

// Is reports whether target is ErrCorrupt.
func (e *CorruptError) Is(target error) bool {
	return target == ErrCorrupt
}

// remedy is what a CorruptError tells the operator by default.
const remedy = "restore the data dir from a backup, or run the plugin's check command with -repair to cut the log back to its last good record"

func corruptf(file, where, problem string, args ...any) *CorruptError {
	return &CorruptError{File: file, Where: where, Problem: fmt.Sprintf(problem, args...), Remedy: remedy}
}

// fileCorruptf reports damage in the bbolt file, which a repair of the
// log cannot cut away.
func fileCorruptf(file, where, problem string, args ...any) *CorruptError {
	return &CorruptError{File: file, Where: where, Problem: fmt.Sprintf(problem, args...), Remedy: "restore the data dir from a backup"}
}
