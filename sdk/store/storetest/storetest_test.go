package storetest_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/storetest"
)

// TestCrash runs the crash suite on a workload of two buckets: group i
// puts item i, deletes item i−20 and records i as the last group, so that
// a copy holds a prefix exactly when its last group's window of items is
// there and nothing past it.
func TestCrash(t *testing.T) {
	opts := store.Options{Buckets: []store.Bucket{{Name: "items"}, {Name: "last"}}, CheckpointInterval: time.Hour}
	const window = 20
	item := func(i int) []byte { return fmt.Appendf(nil, "item%06d", i) }
	write := func(tx *store.Tx, i int) error {
		if err := tx.Put(0, item(i), item(i)); err != nil {
			return err
		}
		if i >= window {
			if err := tx.Delete(0, item(i-window)); err != nil {
				return err
			}
		}
		return tx.Put(1, []byte("last"), binary.BigEndian.AppendUint64(nil, uint64(i)))
	}
	checked := 0
	check := func(s *store.Snapshot, acked int) error {
		checked++
		n := 0
		if v := s.Get(1, []byte("last")); v != nil {
			n = int(binary.BigEndian.Uint64(v)) + 1
		}
		if n < acked || n > acked+1 {
			return fmt.Errorf("holds groups 0 to %d, want the %d acknowledged (or one more)", n-1, acked)
		}
		var got []string
		s.Ascend(0, nil, nil, func(k, _ []byte) bool { got = append(got, string(k)); return true })
		var want []string
		for i := max(0, n-window); i < n; i++ {
			want = append(want, string(item(i)))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("last group %d, but items %v, want %v", n-1, got, want)
		}
		return nil
	}
	storetest.Crash(t, opts, 8, write, check)
	if checked != 8 {
		t.Errorf("check ran %d times, want once per copy, 8", checked)
	}
}
