package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/plughost/plughost/sdk/store"
)

// appendOld appends the record of ws, the index-th of generation gen, in
// the log format of the release before the store, to b.
func appendOld(b []byte, gen uint64, index uint32, ws []store.Write) []byte {
	body := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, gen), index)
	for _, w := range ws {
		op := byte(w.Bucket)
		if w.Delete {
			op |= oldDelete
		}
		body = binary.AppendUvarint(append(body, op), uint64(len(w.Key)))
		body = append(body, w.Key...)
		if !w.Delete {
			body = binary.AppendUvarint(body, uint64(len(w.Value)))
			body = append(body, w.Value...)
		}
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
	return append(b, body...)
}

var oldGroup = []store.Write{
	{Bucket: bAccounts, Key: []byte("alice"), Value: make([]byte, 16)},
	{Bucket: bIdem, Key: []byte("k"), Delete: true},
	{Bucket: bMeta, Key: []byte("seq"), Value: []byte{0, 0, 0, 0, 0, 0, 0, 2}},
}

// TestOldRunStops checks where a run of the old log ends for each kind
// of damage, and that a record of the run's generation after where it
// stops is refused as damage.
func TestOldRunStops(t *testing.T) {
	one := appendOld(nil, 3, 0, oldGroup)
	two := appendOld(bytes.Clone(one), 3, 1, oldGroup)
	flipped := bytes.Clone(two)
	flipped[len(flipped)-1] ^= 1
	// A start record of the store's log: bucket 0x7f, which the old log
	// never had.
	start := appendOld(nil, 3, 0, []store.Write{{Bucket: 0x7f, Key: []byte{0, 0, 0, 5}, Value: make([]byte, 11)}})
	for _, tc := range []struct {
		name   string
		data   []byte
		groups int
		err    string
	}{
		{"whole", two, 2, ""},
		{"torn tail", two[:len(two)-3], 1, ""},
		{"flipped bit", flipped, 1, ""},
		{"older generation", appendOld(nil, 2, 0, oldGroup), 0, ""},
		{"skipped index", appendOld(bytes.Clone(one), 3, 2, oldGroup), 1, ""},
		{"bad entry under a valid checksum", appendOld(nil, 3, 0, []store.Write{{Bucket: oldBuckets, Key: []byte("x")}}), 0, "do not decode"},
		{"start record in a log without them", start, 0, "do not decode"},
		{"damaged record before a later one", append(flipped, appendOld(nil, 3, 2, oldGroup)...), 0, "record 2 of the same generation follows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := oldRun("w.db.wal", tc.data, 3)
			if len(got) != tc.groups || (err == nil) != (tc.err == "") || err != nil && (!strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrCorrupt)) {
				t.Errorf("oldRun = %d groups, %v; want %d groups, error %q", len(got), err, tc.groups, tc.err)
			}
		})
	}
}

// FuzzOldRun feeds oldRun arbitrary log files: it must not panic, and
// what it returns must encode back to a log that reads the same.
func FuzzOldRun(f *testing.F) {
	const gen = 7
	log := appendOld(appendOld(nil, gen, 0, oldGroup), gen, 1, oldGroup[:1])
	f.Add(log)
	f.Add(log[:len(log)-1])
	f.Add(append(bytes.Clone(log), 0, 0, 0, 0, 0))
	f.Add(appendOld(nil, gen+1, 0, oldGroup))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := oldRun("w.db.wal", data, gen)
		if err != nil {
			return
		}
		var again []byte
		for i, g := range got {
			again = appendOld(again, gen, uint32(i), g)
		}
		back, err := oldRun("w.db.wal", again, gen)
		if err != nil {
			t.Fatalf("re-encoded log: %v", err)
		}
		if diff := cmp.Diff(got, back); diff != "" {
			t.Fatalf("re-encoded log reads differently (-first +second):\n%s", diff)
		}
	})
}

// TestReadOldLog checks which files the old log is read from, by
// format, and what is refused: a missing log of a file not closed
// cleanly, a log that starts past the file's generations.
func TestReadOldLog(t *testing.T) {
	g5 := appendOld(nil, 5, 0, oldGroup)
	g6 := appendOld(nil, 6, 0, oldGroup[:1])
	for _, tc := range []struct {
		name    string
		old     oldFile
		wal     []byte // nil: no such file
		wal1    []byte
		writes  int
		problem string
	}{
		{"closed cleanly", oldFile{format: 2}, g5, g6, 0, ""},
		{"format 3, the log in one file", oldFile{format: 3, gen: 5}, g5, nil, 3, ""},
		{"format 4, both generations", oldFile{format: 4, gen: 5}, g6, g5, 4, ""},
		{"format 4, the next generation not begun", oldFile{format: 4, gen: 5}, appendOld(nil, 4, 0, oldGroup), g5, 3, ""},
		{"format 4, a log file missing", oldFile{format: 4, gen: 5}, nil, g5, 0, "missing"},
		{"format 3, the log missing", oldFile{format: 3, gen: 5}, nil, nil, 0, "missing"},
		{"a log newer than the file", oldFile{format: 4, gen: 3}, g6, g5, 0, "older than its log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "wallet.db")
			for suffix, data := range map[string][]byte{".wal": tc.wal, ".wal.1": tc.wal1} {
				if data != nil {
					if err := os.WriteFile(path+suffix, data, 0o600); err != nil {
						t.Fatal(err)
					}
				}
			}
			groups, err := readOldLog(path, tc.old)
			n := 0
			for _, g := range groups {
				n += len(g)
			}
			if n != tc.writes || (err == nil) != (tc.problem == "") || err != nil && (!strings.Contains(err.Error(), tc.problem) || !errors.Is(err, ErrCorrupt)) {
				t.Errorf("readOldLog = %d writes, %v; want %d, error %q", n, err, tc.writes, tc.problem)
			}
		})
	}
}
