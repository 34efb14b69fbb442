// Package storetest holds what tests of a plugin built on package store
// need and its plugins must not: moving a store into states that only a
// crash or a damaged file leaves, and naming where its log ends. It is
// for tests only; it must not be imported by a plugin's production code.
package storetest

import (
	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/internal/testhook"
)

// LogEnd returns the base name of the write-ahead log file that d's next
// record goes to, and where in it: the end of its last record.
func LogEnd(d *store.DB) (string, int64) { return testhook.LogEnd(d) }

// Rotate starts d's write-ahead log's next generation, as a checkpoint
// does first, and leaves the last one's groups out of the bbolt file, as
// a checkpoint that has not committed yet does: the state a crash in the
// middle of a checkpoint leaves.
func Rotate(d *store.DB) error { return testhook.Rotate(d) }

// ForeignRecord returns a whole log record of generation gen that puts
// key "foreign" in bucket 0, as another store's log would hold.
func ForeignRecord(gen uint64) []byte { return testhook.ForeignRecord(gen) }
