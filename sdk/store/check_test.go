package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var kvOpts = Options{Buckets: []Bucket{{Name: "kv"}}, CheckpointInterval: time.Hour}

// perGen is how many groups the test store logs in each generation.
const perGen = 10

func kvKey(i int) []byte { return fmt.Appendf(nil, "key%03d", i) }

// twoGenerations returns a store's files as kill -9 would leave them, with
// records in both log files: groups 0 to 9 in generation G (not yet in the
// bbolt file, as during a checkpoint), 10 to 19 in G+1, and, in the bbolt
// file, "cp000" to "cp019" from a checkpoint before.
func twoGenerations(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	put := func(k, v []byte) {
		t.Helper()
		if err := d.Update(func(tx *Tx) error { return tx.Put(0, k, v) }); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		put(fmt.Appendf(nil, "cp%03d", i), fmt.Appendf(nil, "checkpointed value %03d", i))
	}
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * perGen {
		if i == perGen {
			if err := Rotate(d); err != nil {
				t.Fatal(err)
			}
		}
		put(kvKey(i), fmt.Appendf(nil, "value %03d", i))
	}
	return imageOf(t, path)
}

// imageOf copies the store's files at path to a new directory.
func imageOf(t *testing.T, path string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), filepath.Base(path))
	for _, suffix := range []string{"", ".wal", ".wal.1"} {
		data, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to+suffix, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// logFiles returns the suffixes of the files of the older (G) and newer
// (G+1) generations.
func logFiles(t *testing.T, path string) (older, newer string) {
	t.Helper()
	d0, err := os.ReadFile(path + ".wal")
	if err != nil {
		t.Fatal(err)
	}
	d1, err := os.ReadFile(path + ".wal.1")
	if err != nil {
		t.Fatal(err)
	}
	g0, _ := firstGen(d0)
	g1, _ := firstGen(d1)
	if g0 < g1 {
		return ".wal", ".wal.1"
	}
	return ".wal.1", ".wal"
}

// recordOffsets returns where each record of the run at the start of the
// log file at p starts.
func recordOffsets(t *testing.T, p string) []int {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	for off := 0; ; {
		body, ok := nextRecord(data[off:])
		if !ok {
			return offs
		}
		offs = append(offs, off)
		off += walHeader + len(body)
	}
}

func editFile(t *testing.T, p string, fn func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fn(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// keysIn returns which of the logged keys 0 to 19 the store at path holds,
// checking their values.
func keysIn(t *testing.T, path string) []int {
	t.Helper()
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatalf("Open after repair = %v", err)
	}
	defer func() { _ = d.Close() }()
	var have []int
	err = d.View(func(s *Snapshot) error {
		for i := range 2 * perGen {
			v := s.Get(0, kvKey(i))
			if v == nil {
				continue
			}
			if want := fmt.Sprintf("value %03d", i); string(v) != want {
				return fmt.Errorf("key %d = %q, want %q", i, v, want)
			}
			have = append(have, i)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return have
}

// droppedKeys returns the logged keys in the drops' readable groups.
func droppedKeys(drops []Drop) []int {
	var ks []int
	for _, dr := range drops {
		for _, g := range dr.Groups {
			for _, w := range g {
				var i int
				if _, err := fmt.Sscanf(string(w.Key), "key%03d", &i); err == nil {
					ks = append(ks, i)
				}
			}
		}
	}
	return ks
}

func TestCheckHealthy(t *testing.T) {
	path := twoGenerations(t)
	rep, err := Check(path, kvOpts)
	if err != nil || !rep.OK() || rep.Drops != nil || rep.Trimmed != nil {
		t.Fatalf("Check(healthy store) = %+v, %v; want nothing to report", rep, err)
	}
	// Check changed nothing: the store still opens with every group.
	if got := keysIn(t, path); len(got) != 2*perGen {
		t.Errorf("after Check the store holds keys %v, want all 20", got)
	}
	// A Repair of a healthy store does nothing.
	if rep, err := Repair(path, kvOpts); err != nil || rep.Repaired || !rep.OK() {
		t.Errorf("Repair(healthy store) = %+v, %v; want nothing done", rep, err)
	}
}

// TestCheckAndRepairLog damages the log and checks that Check finds it,
// that Open refuses it, and that Repair cuts it so that Open succeeds
// without exactly the records it reports dropped.
func TestCheckAndRepairLog(t *testing.T) {
	for _, tc := range []struct {
		name      string
		damage    func(t *testing.T, path string) string // returns the file damaged
		lost      []int                                  // keys a repair loses
		readable  []int                                  // of those, the ones in readable records
		firstDrop uint32
		records   int // the records Check knows it drops, if not len(lost)
	}{
		{
			name: "flipped byte in the newer generation",
			damage: func(t *testing.T, path string) string {
				_, newer := logFiles(t, path)
				offs := recordOffsets(t, path+newer)
				editFile(t, path+newer, func(b []byte) []byte { b[offs[4]+20] ^= 0xff; return b })
				return newer
			},
			lost: span(14, 20), readable: span(15, 20), firstDrop: 4,
		},
		{
			name: "flipped byte in the older generation",
			damage: func(t *testing.T, path string) string {
				older, _ := logFiles(t, path)
				offs := recordOffsets(t, path+older)
				editFile(t, path+older, func(b []byte) []byte { b[offs[7]+3] ^= 0x01; return b })
				return older
			},
			lost: span(7, 20), readable: append(span(8, 10), span(10, 20)...), firstDrop: 7,
		},
		{
			name: "zeroed range in the newer generation",
			damage: func(t *testing.T, path string) string {
				_, newer := logFiles(t, path)
				offs := recordOffsets(t, path+newer)
				editFile(t, path+newer, func(b []byte) []byte { clear(b[offs[2] : offs[3]+5]); return b })
				return newer
			},
			lost: span(12, 20), readable: span(14, 20), firstDrop: 2,
		},
		{
			name: "truncated older generation",
			damage: func(t *testing.T, path string) string {
				older, _ := logFiles(t, path)
				offs := recordOffsets(t, path+older)
				if err := os.Truncate(path+older, int64(offs[5]+3)); err != nil {
					t.Fatal(err)
				}
				return older
			},
			// Records 6 to 9 left no trace: the drop counts record 5
			// and the next generation's 10.
			lost: span(5, 20), readable: span(10, 20), firstDrop: 5, records: 11,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := twoGenerations(t)
			file := filepath.Base(path) + tc.damage(t, path)
			if _, err := Open(imageOf(t, path), kvOpts); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) {
				t.Fatalf("Open(damaged) = %v, want a corruption naming %s", err, file)
			}
			rep, err := Check(path, kvOpts)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Problems) != 1 || rep.Problems[0].File != file || !rep.Repairable {
				t.Fatalf("Check = %+v, want one repairable problem in %s", rep, file)
			}
			if rep.Drops[0].File != file || rep.Drops[0].First != tc.firstDrop {
				t.Errorf("Check drops %+v, want the cut at record %d of %s", rep.Drops, tc.firstDrop, file)
			}
			records := 0
			for _, dr := range rep.Drops {
				records += dr.Records
			}
			want := tc.records
			if want == 0 {
				want = len(tc.lost)
			}
			if records != want {
				t.Errorf("Check drops %d records, want %d", records, want)
			}
			if diff := cmp.Diff(tc.readable, droppedKeys(rep.Drops)); diff != "" {
				t.Errorf("writes of the dropped records (-want +got):\n%s", diff)
			}
			rrep, err := Repair(path, kvOpts)
			if err != nil || !rrep.Repaired {
				t.Fatalf("Repair = %+v, %v; want it repaired", rrep, err)
			}
			if diff := cmp.Diff(rep.Drops, rrep.Drops); diff != "" {
				t.Errorf("Repair dropped other than Check said (-check +repair):\n%s", diff)
			}
			have := keysIn(t, path)
			var missing []int
			for i := range 2 * perGen {
				if !slices.Contains(have, i) {
					missing = append(missing, i)
				}
			}
			if diff := cmp.Diff(tc.lost, missing); diff != "" {
				t.Errorf("keys lost by the repair (-want +got):\n%s", diff)
			}
			if rep, err := Check(path, kvOpts); err != nil || !rep.OK() {
				t.Errorf("Check after Repair and Open = %+v, %v; want healthy", rep, err)
			}
		})
	}
}

func span(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// TestCheckTornTail checks that a torn last record is reported as
// trimmed, not as a problem, and that Repair leaves it to Open.
func TestCheckTornTail(t *testing.T) {
	path := twoGenerations(t)
	_, newer := logFiles(t, path)
	offs := recordOffsets(t, path+newer)
	if err := os.Truncate(path+newer, int64(offs[len(offs)-1]+5)); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(path, kvOpts)
	if err != nil || !rep.OK() || rep.Trimmed == nil || rep.Trimmed.Record != perGen-1 {
		t.Fatalf("Check(torn tail) = %+v, %v; want no problem and record %d trimmed", rep, err, perGen-1)
	}
	if rep, err := Repair(path, kvOpts); err != nil || rep.Repaired {
		t.Errorf("Repair(torn tail) = %+v, %v; want nothing done", rep, err)
	}
	if got := keysIn(t, path); len(got) != 2*perGen-1 {
		t.Errorf("store after a torn tail holds keys %v, want 0 to 18", got)
	}
}

// TestCheckRefusesUnrepairable damages what cutting the log cannot
// repair: Check finds it, Repair changes nothing and says to restore.
func TestCheckRefusesUnrepairable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
		file   string
		where  string
	}{
		{
			name: "flipped byte in a value",
			damage: func(t *testing.T, path string) {
				editFile(t, path, func(b []byte) []byte {
					i := bytes.Index(b, []byte("checkpointed value 007"))
					if i < 0 {
						t.Fatal("value not found in the file")
					}
					b[i+5] ^= 0x20
					return b
				})
			},
			file: "s.db", where: `bucket kv key "cp007"`,
		},
		{
			name: "both meta pages",
			damage: func(t *testing.T, path string) {
				editFile(t, path, func(b []byte) []byte {
					b[20] ^= 0xff
					b[os.Getpagesize()+20] ^= 0xff
					return b
				})
			},
			file: "s.db", where: "meta pages",
		},
		{
			name: "log from another data dir",
			damage: func(t *testing.T, path string) {
				_, newer := logFiles(t, path)
				editFile(t, path+newer, func([]byte) []byte { return ForeignRecord(12345) })
			},
			where: "record 0 at offset 0",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := twoGenerations(t)
			tc.damage(t, path)
			rep, err := Check(path, kvOpts)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() || rep.Repairable || rep.Problems[0].Where != tc.where || tc.file != "" && rep.Problems[0].File != tc.file {
				t.Fatalf("Check = %+v, want an unrepairable problem at %s", rep, tc.where)
			}
			before := snapshotFiles(t, path)
			if _, err := Repair(path, kvOpts); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "backup") {
				t.Errorf("Repair = %v, want a corruption that says to restore from a backup", err)
			}
			for i, after := range snapshotFiles(t, path) {
				if !bytes.Equal(before[i], after) {
					t.Errorf("Repair changed file %d of an unrepairable store", i)
				}
			}
		})
	}
}

func snapshotFiles(t *testing.T, path string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, suffix := range []string{"", ".wal", ".wal.1"} {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestCheckLocked checks that Check refuses while a store holds the file.
func TestCheckLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close() }()
	opts := kvOpts
	opts.LockTimeout = 50 * time.Millisecond
	if _, err := Check(path, opts); !errors.Is(err, ErrLocked) {
		t.Errorf("Check(open store) = %v, want ErrLocked", err)
	}
}

// FuzzReplayWAL feeds replayWAL arbitrary pairs of log files: it must not
// panic, and what it returns without error must be the run of whole
// records of generation G at the start of its file followed by that of
// G+1, the first ended by a zero header if the second has records, and
// with no record of either generation skipped.
func FuzzReplayWAL(f *testing.F) {
	const gen = 6 // in .wal; gen+1 in .wal.1
	g := []entry{{b: 0, k: []byte("k"), v: []byte("v")}, {b: 1, del: true, k: []byte("d")}}
	var older, newer []byte
	for i := range 3 {
		older = appendRecord(older, gen, uint32(i), g)
		newer = appendRecord(newer, gen+1, uint32(i), g)
	}
	zero := make([]byte, walHeader)
	olderEnded := append(bytes.Clone(older), zero...)
	flipped := bytes.Clone(newer)
	flipped[walHeader+20] ^= 1
	f.Add(olderEnded, append(bytes.Clone(newer), zero...))
	f.Add(olderEnded, newer[:len(newer)-2])
	f.Add(olderEnded, flipped)
	f.Add(older[:len(older)-1], newer)
	f.Add(append(bytes.Clone(older), 0, 0, 0), newer) // the older cut short
	f.Add(appendRecord(nil, gen-2, 0, g), []byte{})
	f.Add(appendRecord(nil, 99, 0, g), newer)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		data := [2][]byte{a, b}
		st, err := replayWAL("s.db", data, gen, true, 2)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("replayWAL error %v is not a corruption", err)
			}
			return
		}
		var want [][]entry
		var prevClean = true
		for j := range 2 {
			gj := uint64(gen + j)
			d := data[gj%2]
			if first, ok := firstGen(d); ok && first != gj {
				continue
			}
			groups, stop, werr := decodeWAL(d, gj, 2)
			if werr != nil {
				t.Fatalf("replayWAL accepted generation %d whose record does not decode: %v", gj, werr)
			}
			if len(groups) > 0 && !prevClean {
				t.Fatalf("replayWAL took generation %d's records after an unended generation %d", gj, gj-1)
			}
			if _, idx, ok := laterRecord(d, stop, gj, uint32(len(groups))); ok {
				t.Fatalf("replayWAL skipped generation %d's record %d", gj, idx)
			}
			prevClean = len(d)-stop >= walHeader && zeroHeader(d[stop:])
			want = append(want, groups...)
		}
		if diff := cmp.Diff(want, st.groups, cmp.AllowUnexported(entry{}), cmpEmpty); diff != "" {
			t.Fatalf("replayed groups are not the runs of the two generations (-want +got):\n%s", diff)
		}
	})
}

var cmpEmpty = cmp.Comparer(func(a, b []byte) bool { return bytes.Equal(a, b) })
