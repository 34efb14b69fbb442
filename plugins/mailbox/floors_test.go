package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// TestFloors pins where a receive may seek in the visibility index: it
// must find every message a receive without floors would, whatever the
// receives before it took.
func TestFloors(t *testing.T) {
	ms := time.Millisecond
	t.Run("a key written below the floor lowers it", func(t *testing.T) {
		q := newQueue(t, rules{})
		q.send("t", "a")
		q.now = q.now.Add(10 * ms)
		if got := q.recv("t", 10, time.Hour); len(got) != 1 {
			t.Fatalf("recv = %v, want a", payloads(got))
		}
		q.now = q.now.Add(10 * ms)
		if got := q.recv("t", 10, time.Hour); len(got) != 0 { // raises the floor past now
			t.Fatalf("recv = %v, want nothing", payloads(got))
		}
		q.now = q.now.Add(-15 * ms) // the wall clock steps back
		q.send("t", "b")
		if got := payloads(q.recv("t", 10, time.Hour)); len(got) != 1 || got[0] != "b" {
			t.Errorf("recv after a send below the floor = %v, want [b]", got)
		}
	})
	t.Run("a receive that stops at max_messages leaves the floor at its last key", func(t *testing.T) {
		q := newQueue(t, rules{})
		q.send("t", "a")
		q.send("t", "b") // the same millisecond as a
		q.now = q.now.Add(5 * ms)
		for _, want := range []string{"a", "b"} {
			if got := payloads(q.recv("t", 1, time.Hour)); len(got) != 1 || got[0] != want {
				t.Fatalf("recv = %v, want [%s]", got, want)
			}
		}
	})
	t.Run("a failed group makes them forget", func(t *testing.T) {
		hooks := &store.Hooks{}
		opts := storeOpts
		opts.Hooks = hooks
		db, err := store.Open(filepath.Join(t.TempDir(), storeFile), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		q := newQueue(t, rules{})
		q.db = db
		q.send("t", "a")
		q.now = q.now.Add(5 * ms)
		errDisk := errors.New("disk error")
		failed := false // the group's fdatasync fails, not its erasure's
		hooks.SetSync(func(f *os.File) error {
			if failed {
				return f.Sync()
			}
			failed = true
			return errDisk
		})
		if _, err := q.r.commit(db, q.now, []op{{kind: opRecv, topic: "t", max: 10, visibility: time.Hour}}); !errors.Is(err, errDisk) {
			t.Fatalf("commit with a failing fdatasync = %v, want %v", err, errDisk)
		}
		hooks.SetSync(nil)
		if got := payloads(q.recv("t", 10, time.Hour)); len(got) != 1 || got[0] != "a" {
			t.Errorf("recv after a failed receive = %v, want [a]", got)
		}
	})
}
