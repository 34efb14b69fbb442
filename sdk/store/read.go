package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
)

// A value in the bbolt file is framed as crc32c(4) value, the checksum
// covering the key and then the value, so that a value damaged on disk,
// or moved under another key, is detected when it is read.
const frameBytes = 4

func frameSum(k, v []byte) uint32 {
	return crc32.Update(crc32.Checksum(k, castagnoli), castagnoli, v)
}

func putFramed(b *bolt.Bucket, k, v []byte) error {
	fv := make([]byte, frameBytes, frameBytes+len(v))
	binary.BigEndian.PutUint32(fv, frameSum(k, v))
	return b.Put(k, append(fv, v...))
}

// unframe returns the value inside fv, and false if its checksum fails.
func unframe(k, fv []byte) ([]byte, bool) {
	if len(fv) < frameBytes {
		return nil, false
	}
	v := fv[frameBytes:]
	return v, binary.BigEndian.Uint32(fv) == frameSum(k, v)
}

// Reader reads a store's state: a *Snapshot (View, Scan) the state after
// the last committed group, a *Tx (Update) that and the group's own
// writes. Buckets are numbered as in Options.Buckets; a number out of
// range panics. Values are valid until the View, Scan or Update returns
// and must not be changed. A value that fails its checksum, or a page
// that cannot be read, reads as missing and ends an Ascend or Descend;
// the View, Scan or Update then returns a *CorruptError.
type Reader interface {
	// Get returns the value of k in bucket b, nil if there is none.
	Get(b int, k []byte) []byte
	// Ascend calls fn with the keys of bucket b from from (inclusive;
	// nil is the first key) up to to (exclusive; nil is past the last
	// key), in order, and their values, until fn returns false.
	Ascend(b int, from, to []byte, fn func(k, v []byte) bool)
	// Descend is Ascend from the last key of the same range down to its
	// first.
	Descend(b int, from, to []byte, fn func(k, v []byte) bool)
}

var (
	_ Reader = (*Snapshot)(nil)
	_ Reader = (*Tx)(nil)
)

// reader reads the state a View, Scan or Tx sees: a bbolt read
// transaction under up to three overlays' layers, the newest first, and
// keeps the first corruption it meets.
type reader struct {
	d  *DB
	tx *bolt.Tx
	ov [3][]layer // newest first; nil entries are skipped
	// own is the Tx whose reader this is, nil for a Snapshot: its
	// writes are newer than ov's, which leaves ov[0] to them.
	own *Tx
	// gets are, by bucket, a Tx's cursors of Get's lookups in the file,
	// opened by the first: the bucket is opened and the cursor's stack,
	// which a lookup fills, grown once, not per lookup.
	gets []*bolt.Cursor
	err  error
}

// getCursor returns a cursor for a Get's lookup in bucket b: a Tx's is
// kept for its next lookups, since a Tx is for fn's goroutine alone; a
// Snapshot's is new each time, since nothing says fn does not share the
// Snapshot between goroutines.
func (r *reader) getCursor(b int) *bolt.Cursor {
	if r.own == nil {
		return r.tx.Bucket(r.d.buckets[b]).Cursor()
	}
	if r.gets == nil {
		r.gets = make([]*bolt.Cursor, len(r.d.buckets))
	}
	if r.gets[b] == nil {
		r.gets[b] = r.tx.Bucket(r.d.buckets[b]).Cursor()
	}
	return r.gets[b]
}

// Get implements Reader.
func (r *reader) Get(b int, k []byte) []byte {
	if r.own != nil {
		if e, ok := r.own.written(b, k); ok {
			if e.del {
				return nil
			}
			return e.v
		}
	}
	for _, o := range r.ov {
		if o == nil || o[b] == nil {
			continue
		}
		if x, ok := o[b].Get(ovItem{k: k}); ok {
			return x.value()
		}
	}
	fv := r.fileGet(b, k)
	if fv == nil {
		return nil
	}
	v, ok := unframe(k, fv)
	if !ok {
		r.corrupt(b, k)
		return nil
	}
	return v
}

// fileGet reads k from bucket b of the file, turning a panic of bbolt's
// (it panics on some damaged pages) into the reader's corruption. A key
// that is not there is checked against its neighbours in the file, the
// keys just after and before it: damage to a page's element headers or
// to a branch page, which hides a key from the search, shows there as a
// neighbour whose checksum fails or that is out of order.
func (r *reader) fileGet(b int, k []byte) (v []byte) {
	defer func() {
		if p := recover(); p != nil {
			r.pageCorrupt(p)
			v = nil
		}
	}()
	c := r.getCursor(b)
	nk, nv := c.Seek(k)
	if nk != nil && bytes.Equal(nk, k) {
		if nv == nil {
			// Flagged as a nested bucket, which the store never
			// writes: the element's header is damaged.
			r.corrupt(b, k)
		}
		return nv
	}
	if nk != nil && (bytes.Compare(nk, k) < 0 || !framed(nk, nv)) {
		r.corrupt(b, nk)
		return nil
	}
	var pk, pv []byte
	if nk == nil {
		pk, pv = c.Last()
	} else {
		pk, pv = c.Prev()
	}
	if pk != nil && (bytes.Compare(pk, k) >= 0 || !framed(pk, pv)) {
		r.corrupt(b, pk)
	}
	return nil
}

// framed reports whether fv is a value with its checksum, the key's.
func framed(k, fv []byte) bool {
	_, ok := unframe(k, fv)
	return fv != nil && ok
}

func (r *reader) pageCorrupt(p any) {
	if r.err == nil {
		r.err = fileCorruptf(r.d.name, "", "a page cannot be read: %v", p)
	}
}

func (r *reader) corrupt(b int, k []byte) {
	if r.err == nil {
		r.err = fileCorruptf(r.d.name, fmt.Sprintf("bucket %s key %q", r.d.buckets[b], k), "checksum mismatch")
	}
}

// Ascend implements Reader. It merges the file with the writes not yet
// checkpointed, both kept in key order: the first key costs a seek in
// each, whatever the number of writes waiting for a checkpoint.
func (r *reader) Ascend(b int, from, to []byte, fn func(k, v []byte) bool) {
	r.walk(b, from, to, false, fn)
}

// Descend implements Reader.
func (r *reader) Descend(b int, from, to []byte, fn func(k, v []byte) bool) {
	r.walk(b, from, to, true, fn)
}

// walk runs Ascend or Descend, turning a panic of bbolt's into the
// reader's corruption; fn's own panics go on.
func (r *reader) walk(b int, from, to []byte, desc bool, fn func(k, v []byte) bool) {
	if from != nil && to != nil && bytes.Compare(from, to) >= 0 {
		return
	}
	panicked := true
	defer func() {
		if panicked {
			if p := recover(); p != nil {
				r.pageCorrupt(p)
				return
			}
		}
	}()
	r.merge(b, from, to, desc, func(k, v []byte) bool {
		panicked = false
		ok := fn(k, v)
		panicked = true
		return ok
	})
	panicked = false
}

func (r *reader) merge(b int, from, to []byte, desc bool, fn func(k, v []byte) bool) {
	var ls [3]layer
	for i, o := range r.ov {
		if o != nil {
			ls[i] = o[b]
		}
	}
	if r.own != nil {
		ls[0] = r.own.writtenLayer(b)
	}
	ov := newOvIter(ls, from, to, desc)
	defer ov.release()
	// dir orders keys the way the walk goes: positive when a comes
	// after b.
	dir := func(a, b []byte) int {
		if desc {
			return bytes.Compare(b, a)
		}
		return bytes.Compare(a, b)
	}
	c := r.tx.Bucket(r.d.buckets[b]).Cursor()
	var fk, fv []byte
	switch {
	case !desc && from == nil:
		fk, fv = c.First()
	case !desc:
		fk, fv = c.Seek(from)
	case to == nil:
		fk, fv = c.Last()
	default:
		// At the first key at or after to, which is excluded.
		if fk, fv = c.Seek(to); fk == nil {
			fk, fv = c.Last()
		} else {
			fk, fv = c.Prev()
		}
	}
	// The file's keys must come in order, from the bound the walk starts
	// at: damage to its pages shows as one that does not.
	last, first := from, true
	if desc {
		last = to
	}
	for {
		if fk != nil && !ov.inRange(fk) {
			fk = nil
		}
		x, xok := ov.peek()
		if fk == nil && !xok {
			return
		}
		var k, v []byte
		if fk != nil && (!xok || dir(fk, x.k) < 0) {
			var ok bool
			inOrder := last == nil || dir(fk, last) > 0 || !desc && first && bytes.Equal(fk, last)
			if v, ok = unframe(fk, fv); !ok || fv == nil || !inOrder {
				r.corrupt(b, fk)
				return
			}
			k, last, first = fk, fk, false
			if desc {
				fk, fv = c.Prev()
			} else {
				fk, fv = c.Next()
			}
		} else {
			if fk != nil && bytes.Equal(fk, x.k) {
				// The overlay's write replaces the file's.
				if desc {
					fk, fv = c.Prev()
				} else {
					fk, fv = c.Next()
				}
			}
			ov.skip(x.k)
			if x.del {
				continue
			}
			k, v = x.k, x.v
		}
		if !fn(k, v) {
			return
		}
	}
}

// Snapshot is what View and Scan read: the state after the last
// committed group. It implements Reader.
type Snapshot struct{ reader }

// View runs fn on the state after the last committed group. It holds a
// lock that a writer adding a group waits for, and readers behind that
// writer too: fn must be a few lookups; use Scan for more. It returns
// fn's error, or a *CorruptError if fn read a damaged value.
func (d *DB) View(fn func(*Snapshot) error) error {
	if d.closed.Load() {
		return ErrClosed
	}
	d.omu.RLock()
	defer d.omu.RUnlock()
	s := &Snapshot{reader{d: d}}
	if fz := d.frozen.Load(); fz != nil {
		s.ov[1] = fz.m
	}
	s.ov[0] = d.ov.m
	err := d.contain(func() error {
		return d.db.View(func(tx *bolt.Tx) error {
			s.tx = tx
			err := fn(s)
			if s.err != nil {
				// A damaged value explains whatever fn made of it.
				return s.err
			}
			return err
		})
	})
	d.noteCorrupt(err)
	return d.mapErr(err)
}

// Scan is View for long reads: it holds the lock only while it begins its
// read transaction and takes a copy of the writes not yet checkpointed
// (a copy on write of their ordered layers: it costs a pointer per
// bucket, and later writes copy what they change), then runs fn on that
// snapshot, which sees every bucket as View would.
func (d *DB) Scan(fn func(*Snapshot) error) error {
	if d.closed.Load() {
		return ErrClosed
	}
	s := &Snapshot{reader{d: d}}
	d.omu.RLock()
	tx, err := d.db.Begin(false)
	if err == nil {
		if fz := d.frozen.Load(); fz != nil {
			s.ov[1] = fz.m // frozen: nothing writes it any more
		}
		d.copyMu.Lock()
		s.ov[0] = snapshot(d.ov.m)
		d.copyMu.Unlock()
	}
	d.omu.RUnlock()
	if err != nil {
		return d.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	s.tx = tx
	if err = d.contain(func() error { return fn(s) }); s.err != nil {
		err = s.err // a damaged value explains whatever fn made of it
	}
	d.noteCorrupt(err)
	return d.mapErr(err)
}

// contain runs fn with memory faults turned into panics, and turns such a
// panic into a *CorruptError: bbolt maps the file into memory, and a
// damaged page number can send a read past the file's end. Other panics
// go on.
func (d *DB) contain(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			f, ok := p.(interface{ Addr() uintptr })
			if !ok {
				panic(p)
			}
			err = fileCorruptf(d.name, "", "a page cannot be read: memory fault at %#x", f.Addr())
		}
	}()
	return fn()
}
