package store

import (
	"bytes"
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

// FuzzDecodeWAL feeds decodeWAL arbitrary log files: it must not panic,
// must stop at the first record that is not whole, valid and next, and
// what it returns must encode back to a log that decodes the same.
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
	f.Add(log)
	f.Add(log[:len(log)-1])                        // torn tail
	f.Add(append(bytes.Clone(log), 0, 0, 0, 0, 0)) // trailing garbage
	f.Add(appendRecord(nil, gen+1, 0, groups[0]))  // another generation
	f.Add(appendRecord(nil, gen, 1, groups[0]))    // out of order
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, n, err := decodeWAL(data, gen, numBuckets)
		if err != nil {
			return
		}
		if n > len(data) {
			t.Fatalf("decodeWAL read %d of %d bytes", n, len(data))
		}
		var again []byte
		for i, g := range got {
			again = appendRecord(again, gen, uint32(i), g)
		}
		back, m, err := decodeWAL(again, gen, numBuckets)
		if err != nil || m != len(again) {
			t.Fatalf("re-encoded log: %d of %d bytes, %v", m, len(again), err)
		}
		if diff := cmp.Diff(got, back, cmp.AllowUnexported(entry{})); diff != "" {
			t.Fatalf("re-encoded log decodes differently (-first +second):\n%s", diff)
		}
	})
}

// TestDecodeWALStops checks where the log ends for each kind of damage.
func TestDecodeWALStops(t *testing.T) {
	g := []entry{{b: bMeta, k: []byte("seq"), v: []byte{1}}}
	one := appendRecord(nil, 3, 0, g)
	two := appendRecord(bytes.Clone(one), 3, 1, g)
	flipped := bytes.Clone(two)
	flipped[len(flipped)-1] ^= 1
	badEntry := appendRecord(nil, 3, 0, []entry{{b: numBuckets, k: []byte("x"), v: []byte{}}})
	for _, tc := range []struct {
		name   string
		data   []byte
		groups int
		err    bool
	}{
		{"whole", two, 2, false},
		{"torn tail", two[:len(two)-3], 1, false},
		{"flipped bit", flipped, 1, false},
		{"older generation", appendRecord(nil, 2, 0, g), 0, false},
		{"skipped index", append(bytes.Clone(one), appendRecord(nil, 3, 2, g)...), 1, false},
		{"bad entry under a valid checksum", badEntry, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := decodeWAL(tc.data, 3, numBuckets)
			if len(got) != tc.groups || (err != nil) != tc.err {
				t.Errorf("decodeWAL = %d groups, %v; want %d groups, error %v", len(got), err, tc.groups, tc.err)
			}
		})
	}
}
