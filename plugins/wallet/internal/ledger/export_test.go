package ledger

import (
	"os"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/storetest"
)

// LogEnd returns the suffix of the write-ahead log file the next record
// goes to (after the ledger's path), and where in it: the end of its
// last record.
func LogEnd(l *Ledger) (string, int64) {
	name, off := storetest.LogEnd(l.db)
	for _, suffix := range []string{".wal.1", ".wal"} {
		if len(name) > len(suffix) && name[len(name)-len(suffix):] == suffix {
			return suffix, off
		}
	}
	return name, off
}

// Rotate starts the write-ahead log's next generation, as a checkpoint
// does first, and leaves the last one's groups out of the bbolt file, as
// a checkpoint that has not committed yet does.
func Rotate(l *Ledger) {
	if err := storetest.Rotate(l.db); err != nil {
		panic(err)
	}
}

// SetLogSync makes the write-ahead log call sync instead of fdatasync.
func SetLogSync(l *Ledger, sync func(*os.File) error) { l.hooks.SetSync(sync) }

// WithOpenFile returns opts with the bbolt file opened by open.
func WithOpenFile(opts Options, open func(string, int, os.FileMode) (*os.File, error)) Options {
	opts.Hooks = &store.Hooks{OpenFile: open, MmapSize: mmapOf(opts)}
	return opts
}

// ForeignRecord returns a whole log record of generation gen, as another
// ledger's log would hold.
func ForeignRecord(gen uint64) []byte { return storetest.ForeignRecord(gen) }

// WithMmapSize returns opts with bbolt's initial memory map of size
// bytes, so that a checkpoint that grows the file past it remaps.
func WithMmapSize(opts Options, size int) Options {
	h := &store.Hooks{MmapSize: size}
	if opts.Hooks != nil {
		h.OpenFile = opts.Hooks.OpenFile
	}
	opts.Hooks = h
	return opts
}

func mmapOf(opts Options) int {
	if opts.Hooks == nil {
		return 0
	}
	return opts.Hooks.MmapSize
}
