//go:build !linux

package store

import "os"

// Fdatasync writes f to disk: what the log does after each append, for
// Hooks that wrap it.
func Fdatasync(f *os.File) error { return fdatasync(f) }

// fdatasync writes f to disk; off Linux, with fsync.
func fdatasync(f *os.File) error { return f.Sync() }
