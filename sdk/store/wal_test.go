package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The buckets of the tests' stores.
const (
	bMeta = iota
	bAccounts
	bReceipts
	bIdem
	bIdemExp
	numBuckets
)

// FuzzDecodeWAL feeds decodeWAL arbitrary log files: it must not panic, must stop at the first record that
// is not whole, valid and next, and what it returns must encode back to a
// log that decodes the same.
func FuzzDecodeWAL(f *testing.F) {
	const gen = 7
	groups := [][]entry{
		{
			{b: bReceipts, k: []byte{0, 0, 0, 0, 0, 0, 0, 1}, v: []byte(`{"tx_id":"tx_0000000000000001"}`)},
			{b: bAccounts, k: []byte("alice"), v: make([]byte, 16)},
			{b: bIdemExp, k: []byte("\x00\x00\x00\x00\x00\x00\x00\x01k"), v: []byte{}},
		},
		{
			{b: bIdem, del: true, k: []byte("k")},
			{b: bMeta, k: []byte("seq"), v: []byte{0, 0, 0, 0, 0, 0, 0, 2}},
		},
	}
	var log []byte
	for i, g := range groups {
		log = appendRecord(log, gen, uint32(i), g)
	}
	started := appendStart(nil, gen, walEnd{records: 3, off: 170, last: 0xdeadbeef})
	for i, g := range groups {
		started = appendRecord(started, gen, uint32(i+1), g)
	}
	f.Add(started)
	f.Add(started[:len(started)-1])                    // torn tail
	f.Add(append(bytes.Clone(started), 0, 0, 0, 0, 0)) // trailing garbage
	f.Add(appendStart(nil, gen+1, walEnd{}))           // another generation
	f.Add(reindex(appendStart(nil, gen, walEnd{}), 1)) // out of order
	f.Add([]byte{})
	f.Add(started[:walHeader+walStartBody])   // the start record alone
	f.Add(started[:walHeader+walStartBody-1]) // the start record torn
	f.Add(log)                                // a group where the start record belongs
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeWAL(data, gen, numBuckets)
		if got.end.off > int64(len(data)) {
			t.Fatalf("decodeWAL read %d of %d bytes", got.end.off, len(data))
		}
		if err != nil {
			return
		}
		if got.prev == nil && got.end.records > 0 {
			t.Fatalf("decodeWAL = a run of %d records without a start record", got.end.records)
		}
		var again []byte
		index := uint32(0)
		if got.prev != nil {
			again = appendStart(again, gen, *got.prev)
			index++
		}
		for _, g := range got.groups {
			again = appendRecord(again, gen, index, g)
			index++
		}
		back, err := decodeWAL(again, gen, numBuckets)
		if err != nil || back.end.off != int64(len(again)) || back.end.records != got.end.records {
			t.Fatalf("re-encoded log: %d of %d bytes, %d of %d records, %v", back.end.off, len(again), back.end.records, got.end.records, err)
		}
		if diff := cmp.Diff(got.groups, back.groups, cmp.AllowUnexported(entry{})); diff != "" {
			t.Fatalf("re-encoded log decodes differently (-first +second):\n%s", diff)
		}
		if diff := cmp.Diff(got.prev, back.prev, cmp.AllowUnexported(walEnd{})); diff != "" {
			t.Fatalf("re-encoded start record decodes differently (-first +second):\n%s", diff)
		}
	})
}

// TestDecodeWALStops checks where the log ends for each kind of damage.
func TestDecodeWALStops(t *testing.T) {
	g := []entry{{b: bMeta, k: []byte("seq"), v: []byte{1}}}
	start := appendStart(nil, 3, walEnd{records: 5, off: 200, last: 7})
	one := appendRecord(bytes.Clone(start), 3, 1, g)
	two := appendRecord(bytes.Clone(one), 3, 2, g)
	flipped := bytes.Clone(two)
	flipped[len(flipped)-1] ^= 1
	badEntry := appendRecord(bytes.Clone(start), 3, 1, []entry{{b: numBuckets, k: []byte("x"), v: []byte{}}})
	shortStart := bytes.Clone(start[:len(start)-1])
	seal(shortStart)
	for _, tc := range []struct {
		name    string
		data    []byte
		groups  int
		records uint32
		err     bool
	}{
		{"whole", two, 2, 3, false},
		{"torn tail", two[:len(two)-3], 1, 2, false},
		{"flipped bit", flipped, 1, 2, false},
		{"older generation", appendStart(nil, 2, walEnd{}), 0, 0, false},
		{"skipped index", append(bytes.Clone(one), appendRecord(nil, 3, 3, g)...), 1, 2, false},
		{"bad entry under a valid checksum", badEntry, 0, 1, true},
		{"start record alone", start, 0, 1, false},
		{"torn start record", start[:len(start)-1], 0, 0, false},
		{"group where the start record belongs", appendRecord(nil, 3, 0, g), 0, 0, true},
		{"second start record", append(bytes.Clone(start), reindex(appendStart(nil, 3, walEnd{}), 1)...), 0, 1, true},
		{"short start record under a valid checksum", shortStart, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeWAL(tc.data, 3, numBuckets)
			if len(got.groups) != tc.groups || got.end.records != tc.records || (err != nil) != tc.err {
				t.Errorf("decodeWAL = %d groups, %d records, %v; want %d groups, %d records, error %v", len(got.groups), got.end.records, err, tc.groups, tc.records, tc.err)
			}
		})
	}
}

// reindex returns the record rec with its index set to index and its
// checksum made to hold.
func reindex(rec []byte, index uint32) []byte {
	binary.BigEndian.PutUint32(rec[walHeader+8:], index)
	seal(rec)
	return rec
}

// oneGeneration returns a store's files as kill -9 would leave them with
// keys 0 to 9 logged in one generation, G, and the next generation not
// started: its file holds the generation before G, already in the bbolt
// file with "cp000" to "cp019". It returns the path and the suffixes of
// G's file and of the next generation's.
func oneGeneration(t *testing.T) (path, cur, next string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	for i := range 2 * perGen {
		putKV(t, d, fmt.Appendf(nil, "cp%03d", i), fmt.Appendf(nil, "checkpointed value %03d", i))
	}
	if err := d.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	for i := range perGen {
		putKV(t, d, kvKey(i), fmt.Appendf(nil, "value %03d", i))
	}
	name, _ := LogEnd(d)
	cur = strings.TrimPrefix(name, "s.db")
	next = ".wal"
	if cur == ".wal" {
		next = ".wal.1"
	}
	return imageOf(t, path), cur, next
}

func putKV(t *testing.T, d *DB, k, v []byte) {
	t.Helper()
	if err := d.Update(func(tx *Tx) error { return tx.Put(0, k, v) }); err != nil {
		t.Fatal(err)
	}
}

// TestRotationCrash opens what a crash while a checkpoint starts the
// log's next generation leaves: its start record not written, torn,
// whole without the zero header after it, or whole. Each opens with
// every group of the generation before, since none of the next was
// acknowledged; a torn write is trimmed. Only the generation before
// ending short of its zero header is damage.
func TestRotationCrash(t *testing.T) {
	for _, tc := range []struct {
		name    string
		written int  // bytes of the start record and its zero header on disk
		cutOld  bool // and the older generation cut inside its last record
		trim    uint32
		trimmed bool
	}{
		{name: "start record not written"},
		{name: "start record torn", written: 20, trimmed: true, trim: 0},
		{name: "start record whole, its zero header not", written: walHeader + walStartBody, trimmed: true, trim: 1},
		{name: "start record and zero header whole", written: walHeader + walStartBody + walHeader},
		{name: "start record torn and the older generation cut short", written: 20, cutOld: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, cur, next := oneGeneration(t)
			data, err := os.ReadFile(path + cur)
			if err != nil {
				t.Fatal(err)
			}
			gen, _ := firstGen(data)
			run, _ := decodeWAL(data, gen, 1)
			start := append(appendStart(nil, gen+1, run.end), make([]byte, walHeader)...)
			editFile(t, path+next, func(b []byte) []byte { copy(b, start[:tc.written]); return b })
			if tc.cutOld {
				last := recordOffsets(t, path+cur)[perGen]
				if err := os.Truncate(path+cur, run.end.off-3); err != nil {
					t.Fatal(err)
				}
				_, err := Open(imageOf(t, path), kvOpts)
				var ce *CorruptError
				if !errors.As(err, &ce) || ce.File != "s.db"+cur || ce.Where != fmt.Sprintf("record %d at offset %d", perGen, last) || !strings.Contains(ce.Problem, "the next generation has started after it") {
					t.Fatalf("Open = %v, want a *CorruptError at s.db%s record %d saying the next generation has started", err, cur, perGen)
				}
				if rep, err := Check(path, kvOpts); err != nil || !rep.Repairable || rep.Drops[0].File != "s.db"+cur || rep.Drops[0].First != perGen {
					t.Errorf("Check = %+v, %v; want a repair that cuts s.db%s at record %d", rep, err, cur, perGen)
				}
				return
			}
			d, err := Open(imageOf(t, path), kvOpts)
			if err != nil {
				t.Fatalf("Open = %v, want every group of the generation before", err)
			}
			tr := d.Recovery().Trimmed
			_ = d.Close()
			switch {
			case !tc.trimmed && tr != nil:
				t.Errorf("Open trimmed %+v, want nothing", *tr)
			case tc.trimmed && (tr == nil || tr.File != "s.db"+next || tr.Gen != gen+1 || tr.Record != tc.trim || tr.Offset != int64(tc.trim)*int64(len(start)-walHeader)):
				t.Errorf("Open trimmed %+v, want record %d of generation %d in s.db%s", tr, tc.trim, gen+1, next)
			}
			if got := keysIn(t, path); len(got) != perGen {
				t.Errorf("store holds keys %v, want 0 to 9", got)
			}
		})
	}
}

// TestFailedStart makes the write of a start record fail: the checkpoint
// fails and the start record is erased, so that the generation before
// goes on taking groups; if it cannot be erased, the store fails until
// Reopen rather than log a group past the end the start record names.
// Either way every acknowledged group survives a crash.
func TestFailedStart(t *testing.T) {
	eio := errors.New("injected EIO")
	for _, tc := range []struct {
		name   string
		fails  int // fdatasyncs that fail: the start record's, then its erasure's
		failed bool
	}{
		{name: "erased", fails: 1},
		{name: "not erased", fails: 2, failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hooks := &Hooks{}
			opts := kvOpts
			opts.Hooks = hooks
			path := filepath.Join(t.TempDir(), "s.db")
			d, err := Open(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = d.Close() })
			for i := range perGen / 2 {
				putKV(t, d, kvKey(i), fmt.Appendf(nil, "value %03d", i))
			}
			fails := tc.fails
			hooks.SetSync(func(f *os.File) error {
				if fails > 0 {
					fails--
					return eio
				}
				return fdatasync(f)
			})
			err = d.Checkpoint()
			hooks.SetSync(nil)
			if !errors.Is(err, eio) || errors.Is(d.Err(), ErrFailed) != tc.failed {
				t.Fatalf("Checkpoint whose start record fails = %v (store: %v), want the injected error, failed %v", err, d.Err(), tc.failed)
			}
			if got := keysIn(t, imageOf(t, path)); len(got) != perGen/2 {
				t.Errorf("after the failed checkpoint a crash keeps keys %v, want 0 to 4", got)
			}
			if tc.failed {
				if err := d.Update(func(tx *Tx) error { return tx.Put(0, kvKey(9), []byte("x")) }); !errors.Is(err, ErrFailed) {
					t.Fatalf("Update after a start record that could not be erased = %v, want ErrFailed", err)
				}
				if err := d.Reopen(); err != nil {
					t.Fatalf("Reopen = %v", err)
				}
			}
			for i := perGen / 2; i < perGen; i++ {
				putKV(t, d, kvKey(i), fmt.Appendf(nil, "value %03d", i))
			}
			if got := keysIn(t, imageOf(t, path)); len(got) != perGen {
				t.Errorf("a crash keeps keys %v, want 0 to 9", got)
			}
			if err := d.Checkpoint(); err != nil {
				t.Errorf("Checkpoint once the disk works = %v", err)
			}
		})
	}
}

// TestCrashesBeforeStart crashes Open, again and again, between its
// commit of the replayed log into the bbolt file and the durable write of
// the next generation's start record: the start record's fdatasync
// fails, and the log files are put back as they were, as a crash before
// the record reached the disk leaves them. Every later Open must still
// open the files, with every acknowledged group: an Open that skipped
// past generations that never began would, after the second such crash,
// leave the files four generations behind what the bbolt file names,
// which the third Open would refuse as another data dir's.
func TestCrashesBeforeStart(t *testing.T) {
	path := twoGenerations(t)
	var logs [2][]byte
	for i, suffix := range walSuffixes {
		b, err := os.ReadFile(path + suffix)
		if err != nil {
			t.Fatal(err)
		}
		logs[i] = b
	}
	eio := errors.New("injected EIO")
	for crash := range 4 {
		hooks := &Hooks{}
		hooks.SetSync(func(*os.File) error { return eio })
		opts := kvOpts
		opts.Hooks = hooks
		if d, err := Open(path, opts); !errors.Is(err, eio) {
			if d != nil {
				_ = d.Close()
			}
			t.Fatalf("crash %d: Open whose start record cannot be synced = %v, want the injected error", crash, err)
		}
		for i, suffix := range walSuffixes {
			if err := os.WriteFile(path+suffix, logs[i], 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := keysIn(t, path); len(got) != 2*perGen {
		t.Errorf("after 4 crashes before the start record, the store holds the logged keys %v, want 0 to %d", got, 2*perGen-1)
	}
}
