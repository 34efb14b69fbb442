package store

import (
	"bytes"
	"fmt"
	"sync"
)

// scrubber is where Scrub goes on from.
type scrubber struct {
	mu     sync.Mutex
	bucket int
	after  []byte // the last key checked in bucket, nil for its start
}

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
// store is open. A damaged value or page fails it with a *CorruptError,
// counts it (Corruptions) and makes the store refuse writes, as a read
// that met it would. It holds one read transaction for the slice.
func (d *DB) Scrub(n int) (ScrubStats, error) {
	var st ScrubStats
	if d.closed.Load() {
		return st, ErrClosed
	}
	d.scrub.mu.Lock()
	defer d.scrub.mu.Unlock()
	d.omu.RLock()
	tx, err := d.db.Begin(false)
	d.omu.RUnlock()
	if err != nil {
		return st, d.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	err = func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = corruptf(d.name, fmt.Sprintf("bucket %s", d.buckets[d.scrub.bucket]), "a page cannot be read: %v", p)
			}
		}()
		for st.Checked < n {
			c := tx.Bucket(d.buckets[d.scrub.bucket]).Cursor()
			var k, v []byte
			if d.scrub.after == nil {
				k, v = c.First()
			} else if k, v = c.Seek(d.scrub.after); k != nil && bytes.Equal(k, d.scrub.after) {
				k, v = c.Next()
			}
			for ; k != nil && st.Checked < n; k, v = c.Next() {
				st.Checked++
				d.scrub.after = append(d.scrub.after[:0], k...)
				if _, ok := unframe(k, v); !ok {
					return corruptf(d.name, fmt.Sprintf("bucket %s key %q", d.buckets[d.scrub.bucket], k), "checksum mismatch")
				}
			}
			if k != nil {
				return nil
			}
			d.scrub.bucket, d.scrub.after = (d.scrub.bucket+1)%len(d.buckets), nil
			if d.scrub.bucket == 0 {
				st.Wrapped = true
				return nil
			}
		}
		return nil
	}()
	d.noteCorrupt(err)
	return st, err
}
