package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// fillDisk makes the writes to f fail as on a full disk: it points f's
// descriptor at /dev/full, whose writes fail with ENOSPC, and returns
// the function that gives f its own file back (the disk has room
// again). A memory map of f is not affected: reads go on.
func fillDisk(t *testing.T, f *os.File) (free func()) {
	t.Helper()
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	fd := int(f.Fd())
	saved, err := syscall.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup3(int(full.Fd()), fd, syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	freed := false
	free = func() {
		if freed {
			return
		}
		freed = true
		if err := syscall.Dup3(saved, fd, syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		_ = syscall.Close(saved)
	}
	t.Cleanup(free)
	return free
}

// TestReopenAfterENOSPC fills the disk under a running store, once under
// a checkpoint's bbolt commit and once under a group's log append (whose
// erase then fails too): the store fails (ErrFailed) and refuses writes,
// readers go on answering what was acknowledged, and once the disk has
// room Reopen recovers every acknowledged group and takes writes again.
// The group whose append met the full disk was not acknowledged and is
// not there.
func TestReopenAfterENOSPC(t *testing.T) {
	for _, where := range []string{"checkpoint", "log append"} {
		t.Run(where, func(t *testing.T) {
			var boltFile *os.File
			opts := Options{Buckets: []Bucket{{Name: "kv"}}, CheckpointInterval: time.Hour, Hooks: &Hooks{
				OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
					f, err := os.OpenFile(name, flag, perm)
					boltFile = f
					return f, err
				},
			}}
			path := filepath.Join(t.TempDir(), "s.db")
			d, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			put := func(i int) error {
				return d.Update(func(tx *Tx) error { return tx.Put(0, kvKey(i), scannedValue(i)) })
			}
			has := func(what string, n int) {
				t.Helper()
				err := d.View(func(s *Snapshot) error {
					got := readKVs(s, 0, nil, nil, false, 0)
					if len(got) != n {
						return fmt.Errorf("%d keys, want %d", len(got), n)
					}
					for i, kv := range got {
						if kv[0] != string(kvKey(i)) || kv[1] != string(scannedValue(i)) {
							return fmt.Errorf("key %d = %q, want %s", i, kv, kvKey(i))
						}
					}
					return nil
				})
				if err != nil {
					t.Errorf("%s: View = %v, want groups 0 to %d", what, err, n-1)
				}
			}
			for i := range 10 {
				if err := put(i); err != nil {
					t.Fatal(err)
				}
			}
			var free func()
			switch where {
			case "checkpoint":
				free = fillDisk(t, boltFile)
				if err := d.Checkpoint(); !errors.Is(err, ErrFailed) {
					t.Fatalf("Checkpoint on a full disk = %v, want ErrFailed", err)
				}
			case "log append":
				d.wmu.Lock()
				f := d.log.f
				d.wmu.Unlock()
				free = fillDisk(t, f)
				err := put(10)
				if !errors.Is(err, ErrFailed) || !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("Update on a full disk, whose record cannot be erased = %v, want ErrFailed, ErrOutcomeUnknown and ENOSPC", err)
				}
			}
			if err := d.Err(); !errors.Is(err, ErrFailed) {
				t.Errorf("Err() after the full disk = %v, want ErrFailed", err)
			}
			if err := put(11); !errors.Is(err, ErrFailed) {
				t.Errorf("Update after the store failed = %v, want ErrFailed", err)
			}
			has("while failed", 10)
			free()
			if err := d.Reopen(); err != nil {
				t.Fatalf("Reopen once the disk has room = %v, want nil", err)
			}
			if err := d.Err(); err != nil {
				t.Errorf("Err() after Reopen = %v, want nil", err)
			}
			has("after Reopen", 10)
			if err := put(10); err != nil {
				t.Fatalf("Update after Reopen = %v", err)
			}
			if err := d.Checkpoint(); err != nil {
				t.Fatalf("Checkpoint after Reopen = %v", err)
			}
			if err := put(11); err != nil {
				t.Fatal(err)
			}
			has("after writes", 12)
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if d, err = Open(path, Options{Buckets: opts.Buckets}); err != nil {
				t.Fatal(err)
			}
			has("after Close and Open", 12)
		})
	}
}
