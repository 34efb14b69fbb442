//go:build !linux

package store

import "os"

// fdatasync writes f to disk; off Linux, with fsync.
func fdatasync(f *os.File) error { return f.Sync() }
