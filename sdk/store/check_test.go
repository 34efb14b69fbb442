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
// that Open refuses it naming the file and the record where the damage
// starts, and that Repair cuts it so that Open succeeds without exactly
// the records it reports dropped. Record 0 of each generation is its
// start record; records 1 to 10 hold keys 0 to 9 in the older, 10 to 19
// in the newer.
func TestCheckAndRepairLog(t *testing.T) {
	for _, tc := range []struct {
		name      string
		damage    func(t *testing.T, path string) string // returns the file damaged
		lost      []int                                  // keys a repair loses
		readable  []int                                  // of those, the ones in readable records
		firstDrop uint32
		records   int // the records Check drops, start records included
	}{
		{
			name: "flipped byte in the newer generation",
			damage: func(t *testing.T, path string) string {
				_, newer := logFiles(t, path)
				offs := recordOffsets(t, path+newer)
				editFile(t, path+newer, func(b []byte) []byte { b[offs[5]+20] ^= 0xff; return b })
				return newer
			},
			lost: span(14, 20), readable: span(15, 20), firstDrop: 5, records: 6,
		},
		{
			name: "flipped byte in the newer generation's start record",
			damage: func(t *testing.T, path string) string {
				_, newer := logFiles(t, path)
				editFile(t, path+newer, func(b []byte) []byte { b[20] ^= 0xff; return b })
				return newer
			},
			lost: span(10, 20), readable: span(10, 20), firstDrop: 0, records: 11,
		},
		{
			name: "flipped byte in the older generation",
			damage: func(t *testing.T, path string) string {
				older, _ := logFiles(t, path)
				offs := recordOffsets(t, path+older)
				editFile(t, path+older, func(b []byte) []byte { b[offs[8]+3] ^= 0x01; return b })
				return older
			},
			lost: span(7, 20), readable: append(span(8, 10), span(10, 20)...), firstDrop: 8, records: 3 + 11,
		},
		{
			name: "zeroed range in the newer generation",
			damage: func(t *testing.T, path string) string {
				_, newer := logFiles(t, path)
				offs := recordOffsets(t, path+newer)
				editFile(t, path+newer, func(b []byte) []byte { clear(b[offs[3] : offs[4]+5]); return b })
				return newer
			},
			lost: span(12, 20), readable: span(14, 20), firstDrop: 3, records: 8,
		},
		{
			name: "truncated older generation",
			damage: func(t *testing.T, path string) string {
				older, _ := logFiles(t, path)
				offs := recordOffsets(t, path+older)
				if err := os.Truncate(path+older, int64(offs[6]+3)); err != nil {
					t.Fatal(err)
				}
				return older
			},
			// The newer generation's start record says the older held
			// records 6 to 10 too.
			lost: span(5, 20), readable: span(10, 20), firstDrop: 6, records: 5 + 11,
		},
		{
			name: "zeroed tail of the older generation",
			damage: func(t *testing.T, path string) string {
				older, _ := logFiles(t, path)
				offs := recordOffsets(t, path+older)
				editFile(t, path+older, func(b []byte) []byte { clear(b[offs[6]:]); return b })
				return older
			},
			lost: span(5, 20), readable: span(10, 20), firstDrop: 6, records: 5 + 11,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := twoGenerations(t)
			file := filepath.Base(path) + tc.damage(t, path)
			_, err := Open(imageOf(t, path), kvOpts)
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.File != file {
				t.Fatalf("Open(damaged) = %v, want a *CorruptError naming %s", err, file)
			}
			rep, err := Check(path, kvOpts)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Problems) != 1 || rep.Problems[0].File != file || !rep.Repairable {
				t.Fatalf("Check = %+v, want one repairable problem in %s", rep, file)
			}
			if p := rep.Problems[0]; p.Where != ce.Where || p.What != ce.Problem {
				t.Errorf("Check's problem %v is not Open's error %v", p, ce)
			}
			if dr := rep.Drops[0]; dr.File != file || dr.First != tc.firstDrop || ce.Where != fmt.Sprintf("record %d at offset %d", dr.First, dr.Offset) {
				t.Errorf("Check drops %+v, want the cut at record %d of %s, where Open's error %q says", rep.Drops, tc.firstDrop, file, ce.Where)
			}
			records := 0
			for _, dr := range rep.Drops {
				records += dr.Records
			}
			if records != tc.records {
				t.Errorf("Check drops %d records, want %d", records, tc.records)
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
			if diff := cmp.Diff(tc.lost, missingKeys(t, path)); diff != "" {
				t.Errorf("keys lost by the repair (-want +got):\n%s", diff)
			}
			if rep, err := Check(path, kvOpts); err != nil || !rep.OK() {
				t.Errorf("Check after Repair and Open = %+v, %v; want healthy", rep, err)
			}
		})
	}
}

// missingKeys returns which of the logged keys 0 to 19 the store at path
// lacks.
func missingKeys(t *testing.T, path string) []int {
	t.Helper()
	have := keysIn(t, path)
	var missing []int
	for i := range 2 * perGen {
		if !slices.Contains(have, i) {
			missing = append(missing, i)
		}
	}
	return missing
}

// TestZeroedOlderTail zeroes the older generation's file from a record
// boundary to its end, as a disk may, while the newer generation holds
// acknowledged records: the older's run then stops at a whole zero
// header, as at an end, and only the newer's start record tells that
// records are missing. Open refuses, Check reports it, and Repair drops
// exactly the records the start record says were there and the newer
// generation.
func TestZeroedOlderTail(t *testing.T) {
	path := twoGenerations(t)
	older, newer := logFiles(t, path)
	offs := recordOffsets(t, path+older)
	end := recordEnd(t, path+older)
	newerEnd := recordEnd(t, path+newer)
	const cut = 6 // records 6 to 10 (keys 5 to 9) are zeroed
	editFile(t, path+older, func(b []byte) []byte { clear(b[offs[cut]:]); return b })
	gen := genOf(t, path+newer) - 1
	where := fmt.Sprintf("record %d at offset %d", cut, offs[cut])

	_, err := Open(imageOf(t, path), kvOpts)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.File != "s.db"+older || ce.Where != where || ce.Remedy != remedy ||
		!strings.Contains(ce.Problem, fmt.Sprintf("start record (s.db%s record 0) says this generation holds %d records, to offset %d", newer, perGen+1, end)) {
		t.Fatalf("Open(zeroed older tail) = %v, want a *CorruptError at s.db%s %s naming the start record in s.db%s and the remedy", err, older, where, newer)
	}

	rep, err := Check(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	want := Report{
		Problems: []Problem{{File: ce.File, Where: ce.Where, What: ce.Problem}},
		Drops: []Drop{
			// The zeroed records: none can be read, the start record
			// says how many there were.
			{File: "s.db" + older, Gen: gen, First: cut, Last: perGen, Records: perGen + 1 - cut, Offset: int64(offs[cut]), Bytes: int64(end - offs[cut])},
			{File: "s.db" + newer, Gen: gen + 1, First: 0, Last: perGen, Records: perGen + 1, Offset: 0, Bytes: int64(newerEnd), Groups: kvGroups(perGen, 2*perGen)},
		},
		Repairable: true,
	}
	if diff := cmp.Diff(want, rep, cmpEmpty); diff != "" {
		t.Fatalf("Check(zeroed older tail) (-want +got):\n%s", diff)
	}
	rrep, err := Repair(path, kvOpts)
	want.Repaired = true
	if diff := cmp.Diff(want, rrep, cmpEmpty); err != nil || diff != "" {
		t.Fatalf("Repair(zeroed older tail) = %v (-want +got):\n%s", err, diff)
	}
	if diff := cmp.Diff(span(perGen/2, 2*perGen), missingKeys(t, path)); diff != "" {
		t.Errorf("keys lost by the repair (-want +got):\n%s", diff)
	}
	if rep, err := Check(path, kvOpts); err != nil || !rep.OK() {
		t.Errorf("Check after Repair and Open = %+v, %v; want healthy", rep, err)
	}
}

// recordEnd returns where the run of records at the start of the log file
// at p ends.
func recordEnd(t *testing.T, p string) int {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	off := 0
	for {
		body, ok := nextRecord(data[off:])
		if !ok {
			return off
		}
		off += walHeader + len(body)
	}
}

// genOf returns the generation of the log file at p's first record.
func genOf(t *testing.T, p string) uint64 {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	g, ok := firstGen(data)
	if !ok {
		t.Fatalf("%s starts with no whole record", p)
	}
	return g
}

// kvGroups returns the writes of the groups that put keys from to to-1,
// as twoGenerations logs them.
func kvGroups(from, to int) [][]Write {
	var gs [][]Write
	for i := from; i < to; i++ {
		gs = append(gs, []Write{{Bucket: 0, Key: kvKey(i), Value: fmt.Appendf(nil, "value %03d", i)}})
	}
	return gs
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
	if err != nil || !rep.OK() || rep.Trimmed == nil || rep.Trimmed.Record != perGen {
		t.Fatalf("Check(torn tail) = %+v, %v; want no problem and record %d trimmed", rep, err, perGen)
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
			name: "older generation longer than the newer's start record says",
			damage: func(t *testing.T, path string) {
				// A record of the older generation after its last, with
				// the next index: its file is not the one the newer
				// generation followed.
				older, _ := logFiles(t, path)
				gen := genOf(t, path+older)
				editFile(t, path+older, func(b []byte) []byte {
					end := recordEnd(t, path+older)
					rec := appendRecord(nil, gen, perGen+1, []entry{{b: 0, k: []byte("late"), v: []byte("x")}})
					return append(b[:end], append(rec, make([]byte, walHeader)...)...)
				})
			},
			where: "record 0 at offset 0",
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
// G+1, with no record of either generation skipped, G ending where G+1's
// start record says if it has one, and otherwise, if a torn start record
// begins G+1, at a whole zero header.
func FuzzReplayWAL(f *testing.F) {
	const gen = 6 // in .wal; gen+1 in .wal.1
	g := []entry{{b: 0, k: []byte("k"), v: []byte("v")}, {b: 1, del: true, k: []byte("d")}}
	older := appendStart(nil, gen, walEnd{})
	for i := range 3 {
		older = appendRecord(older, gen, uint32(i+1), g)
	}
	run, _ := decodeWAL(older, gen, 2)
	newer := appendStart(nil, gen+1, run.end)
	startLen := len(newer)
	for i := range 3 {
		newer = appendRecord(newer, gen+1, uint32(i+1), g)
	}
	zero := make([]byte, walHeader)
	olderEnded := append(bytes.Clone(older), zero...)
	flipped := bytes.Clone(newer)
	flipped[startLen+walHeader+20] ^= 1
	startFlipped := bytes.Clone(newer)
	startFlipped[20] ^= 1
	zeroedTail := bytes.Clone(olderEnded) // from the older's last record on
	clear(zeroedTail[len(older)-len(appendRecord(nil, gen, 3, g)):])
	f.Add(olderEnded, append(bytes.Clone(newer), zero...))
	f.Add(olderEnded, newer[:len(newer)-2])
	f.Add(olderEnded, flipped)
	f.Add(olderEnded, startFlipped)                               // the start record damaged, groups after it
	f.Add(olderEnded, append(newer[:startLen:startLen], zero...)) // the start record alone
	f.Add(olderEnded, newer[:startLen-3])                         // a crash during the rotation
	f.Add(older[:len(older)-1], newer)                            // the older cut short
	f.Add(append(bytes.Clone(older), 0, 0, 0), newer)             // the older cut short
	f.Add(zeroedTail, newer)                                      // the older's tail zeroed
	f.Add(appendStart(nil, gen-2, walEnd{}), []byte{})
	f.Add(appendRecord(nil, 99, 0, g), newer)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		data := [2][]byte{a, b}
		st, err := replayWAL("s.db", data, gen, 2)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("replayWAL error %v is not a corruption", err)
			}
			return
		}
		var want [][]entry
		var runs [2]walRun
		var absent [2]bool
		for j := range 2 {
			gj := uint64(gen + j)
			d := data[gj%2]
			if first, ok := firstGen(d); ok && first != gj {
				absent[j] = true
				continue
			}
			r, werr := decodeWAL(d, gj, 2)
			if werr != nil {
				t.Fatalf("replayWAL accepted generation %d whose record does not decode: %v", gj, werr)
			}
			if _, idx, ok := laterRecord(d, int(r.end.off), gj, r.end.records); ok {
				t.Fatalf("replayWAL skipped generation %d's record %d", gj, idx)
			}
			runs[j] = r
			want = append(want, r.groups...)
		}
		if p := runs[1].prev; p != nil && runs[0].end != *p {
			t.Fatalf("replayWAL took generation %d, whose start record says %d ends at %+v, but it ends at %+v", gen+1, gen, *p, runs[0].end)
		}
		if older := data[gen%2][runs[0].end.off:]; !absent[0] && !absent[1] && runs[1].prev == nil && !zeroHeader(data[(gen+1)%2]) && (len(older) < walHeader || !zeroHeader(older)) {
			t.Fatalf("replayWAL took generation %d, not ended by a zero header, before a torn start of generation %d", gen, gen+1)
		}
		if diff := cmp.Diff(want, st.groups, cmp.AllowUnexported(entry{}), cmpEmpty); diff != "" {
			t.Fatalf("replayed groups are not the runs of the two generations (-want +got):\n%s", diff)
		}
	})
}

var cmpEmpty = cmp.Comparer(func(a, b []byte) bool { return bytes.Equal(a, b) })

// TestDamagedLastRecord damages the newest generation's last record, an
// acknowledged group of a value long enough to cross a sector boundary.
// What a crash can leave (the file ending inside the record, or the
// record zeroed from a sector boundary to its end) is trimmed; a byte
// flipped in a record whole in the file, or zeros that start inside a
// sector, are damage: Open refuses, Check finds it and Repair drops it.
func TestDamagedLastRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	for i := range perGen {
		putKV(t, d, kvKey(i), fmt.Appendf(nil, "value %03d", i))
	}
	putKV(t, d, []byte("big"), bytes.Repeat([]byte{0x5a}, 3*walSector))
	name, end := LogEnd(d)
	file := strings.TrimPrefix(name, "s.db")
	image := imageOf(t, path)
	offs := recordOffsets(t, image+file)
	last := offs[len(offs)-1]
	record := uint32(len(offs) - 1)
	boundary := (last/walSector + 1) * walSector // the record's first sector boundary
	lastBoundary := (int(end) - 1) / walSector * walSector
	for _, tc := range []struct {
		name    string
		damage  func([]byte) []byte
		trimmed bool
	}{
		{"flipped byte in the value", func(b []byte) []byte { b[last+100] ^= 1; return b }, false},
		{"flipped byte in the checksum", func(b []byte) []byte { b[last+5] ^= 1; return b }, false},
		{"flipped last byte", func(b []byte) []byte { b[end-1] ^= 0x80; return b }, false},
		{"file ends inside the record", func(b []byte) []byte { return b[:end-1] }, true},
		{"file ends inside the header", func(b []byte) []byte { return b[:last+5] }, true},
		{"zeroed from a sector boundary", func(b []byte) []byte { clear(b[boundary:end]); return b }, true},
		{"zeroed from inside its last sector", func(b []byte) []byte { clear(b[lastBoundary+1 : end]); return b }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := imageOf(t, image)
			editFile(t, p+file, tc.damage)
			d, err := Open(p, kvOpts)
			if tc.trimmed {
				if err != nil {
					t.Fatalf("Open = %v, want the torn record trimmed", err)
				}
				tr := d.Recovery().Trimmed
				_ = d.Close()
				if tr == nil || tr.File != "s.db"+file || tr.Record != record || tr.Offset != int64(last) {
					t.Errorf("Open trimmed %+v, want record %d at offset %d of s.db%s", tr, record, last, file)
				}
				if got := keysIn(t, p); len(got) != perGen {
					t.Errorf("store holds keys %v, want 0 to 9", got)
				}
				return
			}
			var ce *CorruptError
			where := fmt.Sprintf("record %d at offset %d", record, last)
			if !errors.As(err, &ce) || ce.File != "s.db"+file || ce.Where != where {
				if err == nil {
					_ = d.Close()
				}
				t.Fatalf("Open = %v, want a *CorruptError at s.db%s %s", err, file, where)
			}
			rep, err := Check(p, kvOpts)
			if err != nil || rep.OK() || !rep.Repairable || rep.Trimmed != nil || len(rep.Drops) != 1 ||
				rep.Drops[0].File != "s.db"+file || rep.Drops[0].First != record || rep.Drops[0].Records != 1 || rep.Drops[0].Offset != int64(last) {
				t.Fatalf("Check = %+v, %v; want the problem found and a repair that drops record %d", rep, err, record)
			}
			if rep, err := Repair(p, kvOpts); err != nil || !rep.Repaired || len(rep.Drops) != 1 || rep.Drops[0].First != record {
				t.Fatalf("Repair = %+v, %v; want record %d dropped", rep, err, record)
			}
			if got := keysIn(t, p); len(got) != perGen {
				t.Errorf("store after repair holds keys %v, want 0 to 9", got)
			}
			if rep, err := Check(p, kvOpts); err != nil || !rep.OK() {
				t.Errorf("Check after Repair = %+v, %v; want healthy", rep, err)
			}
		})
	}
}
