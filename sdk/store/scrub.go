package store

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"sync"
)

// scrubber is where Scrub goes on from.
type scrubber struct {
	mu     sync.Mutex
	bucket int
	after  []byte // the last key checked in bucket, nil for its start
	// seen is the sum of bucket's values up to after, as they are now:
	// checkpoints that write keys up to after change it (writer).
	seen bucketSum
}

// reset starts a new pass. The caller holds mu.
func (s *scrubber) reset() { s.bucket, s.after, s.seen = 0, nil, bucketSum{} }

// ScrubStats is what one Scrub call did.
type ScrubStats struct {
	// Checked is the number of values whose checksums were verified.
	Checked int
	// Wrapped is set when the call reached the end of the last bucket:
	// the next call starts a new pass over the file.
	Wrapped bool
}

// Scrub verifies the checksums of up to n values of the bbolt file, from
// where the last call stopped, so that damage is found before a read
// meets it; call it in slices, between requests, for as long as the
// store is open. At the end of each bucket it compares the values it
// counted with the bucket's recorded sum, so that a value that damage to
// the file's pages hid from lookups is found too, and at the end of a
// pass it checks the store's own bucket. A damaged value or page fails
// it with a *CorruptError, counts it (Corruptions) and makes the store
// refuse writes, as a read that met it would. It holds one read
// transaction for the slice, at whose end it drops bbolt's memory map
// from the process's RSS (see Memory in the package doc).
func (d *DB) Scrub(n int) (ScrubStats, error) {
	var st ScrubStats
	if d.closed.Load() {
		return st, ErrClosed
	}
	d.scrub.mu.Lock()
	defer d.scrub.mu.Unlock()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	d.omu.RLock()
	tx, err := d.db.Begin(false)
	d.omu.RUnlock()
	if err != nil {
		return st, d.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	sc := &d.scrub
	err = func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fileCorruptf(d.name, fmt.Sprintf("bucket %s", d.buckets[sc.bucket]), "a page cannot be read: %v", p)
			}
		}()
		for st.Checked < n {
			name := d.buckets[sc.bucket]
			c := tx.Bucket(name).Cursor()
			var k, v []byte
			if sc.after == nil {
				k, v = c.First()
			} else if k, v = c.Seek(sc.after); k != nil && bytes.Equal(k, sc.after) {
				k, v = c.Next()
			}
			for ; k != nil && st.Checked < n; k, v = c.Next() {
				st.Checked++
				if sc.after != nil && bytes.Compare(k, sc.after) <= 0 {
					return fileCorruptf(d.name, fmt.Sprintf("bucket %s key %q", name, k), "keys out of order: the file's pages are damaged")
				}
				sc.after = append(sc.after[:0], k...)
				if _, ok := unframe(k, v); v == nil || !ok {
					return fileCorruptf(d.name, fmt.Sprintf("bucket %s key %q", name, k), "checksum mismatch")
				}
				sc.seen.add(v)
			}
			if k != nil {
				return nil
			}
			lay, err := d.readLayout(tx)
			if err != nil {
				return err
			}
			if lay.sums != nil {
				if m := lay.sums[string(name)].mismatch(sc.seen); m != "" {
					return fileCorruptf(d.name, fmt.Sprintf("bucket %s", name), "%s", m)
				}
			}
			sc.bucket, sc.after, sc.seen = (sc.bucket+1)%len(d.buckets), nil, bucketSum{}
			if sc.bucket == 0 {
				st.Wrapped = true
				return nil
			}
		}
		return nil
	}()
	// The slice has read its pages through bbolt's map: they leave the
	// process's RSS, with the rest of the map (see dropMapped), while tx
	// still pins the map. All of it rather than the slice's pages alone,
	// which a Cursor does not name: readers' pages go too, or reads would
	// grow the RSS towards the file's size as a pass does (a queue reads
	// each message once). What readers read again faults back from the
	// page cache, once a slice. A checkpoint's commit, which may remap,
	// waits for scrub.mu meanwhile, and Close's unmap for tx.
	_ = dropMapped(tx)
	if err != nil {
		// The next pass starts over: a sum met part way means nothing
		// once a bucket's value has failed.
		sc.reset()
	}
	d.noteCorrupt(err)
	return st, err
}
