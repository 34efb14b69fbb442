package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"runtime/debug"
	"slices"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
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

// frameAll adds checksums to every value of b (a file of the wallet's
// earlier layout).
func frameAll(b *bolt.Bucket) error {
	var kvs [][2][]byte
	if err := b.ForEach(func(k, v []byte) error {
		kvs = append(kvs, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		return nil
	}); err != nil {
		return err
	}
	for _, kv := range kvs {
		if err := putFramed(b, kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// layer is the writes to one bucket of one overlay: the last write of
// each key, nil for a deletion.
type layer = map[string]ovValue

// ovValue is one write of an overlay.
type ovValue struct {
	v   []byte
	del bool
}

// value returns the value written, nil for a deletion.
func (x ovValue) value() []byte {
	if x.del {
		return nil
	}
	return x.v
}

// overlay is the writes of one log generation's groups, the last write of
// each key: what readers add to the bbolt file until a checkpoint has
// written them into it.
type overlay struct {
	gen uint64
	m   []layer
}

func newOverlay(gen uint64, buckets int) *overlay {
	o := &overlay{gen: gen, m: make([]layer, buckets)}
	for i := range o.m {
		o.m[i] = layer{}
	}
	return o
}

func (o *overlay) add(es []entry) {
	for _, e := range es {
		o.m[e.b][string(e.k)] = ovValue{v: e.v, del: e.del}
	}
}

// writeTo writes the overlay through w, each bucket's keys in order:
// bbolt inserts sorted keys fastest, and a key that many groups wrote
// costs one Put.
func (o *overlay) writeTo(w *writer) error {
	for b, m := range o.m {
		if w.d.seqb[b] {
			// Appended in order: pages can be split nearly full
			// instead of half, fewer pages to write.
			w.tx.Bucket(w.d.buckets[b]).FillPercent = 0.9
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			x := m[k]
			if err := w.apply(entry{b: b, del: x.del, k: []byte(k), v: x.v}); err != nil {
				return err
			}
		}
	}
	return nil
}

// reader reads the state a View, Scan or Tx sees: a bbolt read
// transaction under up to two overlays' layers, the newer first, and
// keeps the first corruption it meets.
type reader struct {
	d   *DB
	tx  *bolt.Tx
	ov  [3][]layer // newest first; nil entries are skipped
	err error
}

// Get returns the value of k in bucket b, nil if there is none. The value
// is valid until the transaction ends and must not be changed. A value
// that fails its checksum reads as nil, and the View, Scan or Update
// returns a *CorruptError.
func (r *reader) Get(b int, k []byte) []byte {
	for _, o := range r.ov {
		if o == nil {
			continue
		}
		if x, ok := o[b][string(k)]; ok {
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
	c := r.tx.Bucket(r.d.buckets[b]).Cursor()
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

// Ascend calls fn with the keys of bucket b from from on (all when from
// is nil), in order, and their values, until fn returns false. It merges
// the file with the writes not yet checkpointed; those are sorted per
// call, so it suits Scan and small Tx and View reads of a bucket's first
// keys. A value that fails its checksum ends it.
func (r *reader) Ascend(b int, from []byte, fn func(k, v []byte) bool) {
	panicked := true
	defer func() {
		if panicked {
			if p := recover(); p != nil {
				r.pageCorrupt(p)
				return
			}
		}
	}()
	r.ascend(b, from, func(k, v []byte) bool {
		panicked = false
		ok := fn(k, v)
		panicked = true
		return ok
	})
	panicked = false
}

func (r *reader) ascend(b int, from []byte, fn func(k, v []byte) bool) {
	merged := layer{}
	for i := len(r.ov) - 1; i >= 0; i-- {
		if r.ov[i] != nil {
			maps.Copy(merged, r.ov[i][b])
		}
	}
	keys := slices.Sorted(maps.Keys(merged))
	i, _ := slices.BinarySearch(keys, string(from))
	c := r.tx.Bucket(r.d.buckets[b]).Cursor()
	var fk, fv []byte
	if from == nil {
		fk, fv = c.First()
	} else {
		fk, fv = c.Seek(from)
	}
	// The file's keys must come in order, from from on: damage to its
	// pages shows as one that does not.
	last, first := from, true
	for fk != nil || i < len(keys) {
		var k, v []byte
		switch {
		case fk != nil && (i == len(keys) || bytes.Compare(fk, []byte(keys[i])) < 0):
			var ok bool
			inOrder := last == nil || bytes.Compare(fk, last) > 0 || first && bytes.Equal(fk, last)
			if v, ok = unframe(fk, fv); !ok || fv == nil || !inOrder {
				r.corrupt(b, fk)
				return
			}
			k, last, first = fk, fk, false
			fk, fv = c.Next()
		default:
			if fk != nil && string(fk) == keys[i] {
				fk, fv = c.Next() // the overlay's write replaces the file's
			}
			x := merged[keys[i]]
			k = []byte(keys[i])
			i++
			if x.del {
				continue
			}
			v = x.v
		}
		if !fn(k, v) {
			return
		}
	}
}

// Snapshot is what View and Scan read: the state after the last
// committed group.
type Snapshot struct{ reader }

// Tx is a group of writes being made by Update. It reads the state after
// the last committed group and its own writes.
type Tx struct {
	reader
	local  []layer
	writes []entry
}

// Put writes v under k in bucket b. The store keeps k and v once the
// group is logged, so the caller must not change them afterwards. It
// refuses what bbolt would: a checkpoint must not meet a write it cannot
// make.
func (t *Tx) Put(b int, k, v []byte) error {
	switch {
	case len(k) == 0:
		return berrors.ErrKeyRequired
	case len(k) > bolt.MaxKeySize:
		return berrors.ErrKeyTooLarge
	case int64(len(v))+frameBytes > bolt.MaxValueSize:
		return berrors.ErrValueTooLarge
	}
	if v == nil {
		v = []byte{}
	}
	t.write(entry{b: b, k: k, v: v})
	return nil
}

// Delete deletes k from bucket b.
func (t *Tx) Delete(b int, k []byte) error {
	if len(k) == 0 {
		return berrors.ErrKeyRequired
	}
	t.write(entry{b: b, del: true, k: k})
	return nil
}

func (t *Tx) write(e entry) {
	t.writes = append(t.writes, e)
	t.local[e.b][string(e.k)] = ovValue{v: e.v, del: e.del}
}

// begin starts a group. The caller holds wmu, so ov is stable; the frozen
// overlay and the read transaction are taken together under omu, so that
// they show one state whether or not a checkpoint commits meanwhile.
func (d *DB) begin() (*Tx, error) {
	d.omu.RLock()
	fz := d.frozen.Load()
	tx, err := d.db.Begin(false)
	d.omu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("begin read transaction: %w", d.mapErr(err))
	}
	t := &Tx{reader: reader{d: d, tx: tx}, local: make([]layer, len(d.buckets))}
	for i := range t.local {
		t.local[i] = layer{}
	}
	t.ov = [3][]layer{t.local, d.ov.m, nil}
	if fz != nil {
		t.ov[2] = fz.m
	}
	return t, nil
}

// close ends the group's read transaction.
func (t *Tx) close() { _ = t.tx.Rollback() }

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
// read transaction and copies the not yet checkpointed writes to the
// buckets fn reads (the others then look as in the file alone), then runs
// fn on that snapshot.
func (d *DB) Scan(buckets []int, fn func(*Snapshot) error) error {
	if d.closed.Load() {
		return ErrClosed
	}
	d.omu.RLock()
	tx, err := d.db.Begin(false)
	copied := make([]layer, len(d.buckets))
	if err == nil {
		fz := d.frozen.Load()
		for _, b := range buckets {
			m := layer{}
			if fz != nil {
				maps.Copy(m, fz.m[b])
			}
			maps.Copy(m, d.ov.m[b])
			copied[b] = m
		}
	}
	d.omu.RUnlock()
	if err != nil {
		return d.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	s := &Snapshot{reader{d: d, tx: tx}}
	s.ov[0] = copied
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
