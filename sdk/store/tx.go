package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// Limits of keys and values, which the bbolt file sets.
const (
	// MaxKeySize is the longest key Tx.Put takes.
	MaxKeySize = 32768
	// MaxValueSize is the longest value Tx.Put takes.
	MaxValueSize = 1<<31 - 2 - frameBytes
)

// Tx is a group of writes being made by Update. It reads the state after
// the last committed group and its own writes (it implements Reader).
// It is valid only until fn returns, and only in fn's goroutine.
type Tx struct {
	reader
	// writes are the group's writes in the order made: its log record.
	// The group's own reads find them through index and ordered, which
	// are built only as reads need them, so that a write costs an
	// append.
	writes []entry
	// wrote has bit b set once the group has written to bucket b: most
	// reads of a bucket it did not write need no look at writes.
	wrote [(walMaxBuckets + 63) / 64]uint64
	// index holds the position in writes of the last write of each key
	// of writes[:indexed]; Get makes it once the writes are more than
	// scanWrites, and extends it.
	index   map[writeKey]int
	indexed int
	// ordered holds, by bucket, the group's writes to the bucket in key
	// order, made by the first range read of a bucket it wrote and kept
	// up to date by later writes; nil until then.
	ordered []layer
	// seq is the sequence counter as the group leaves it; 0 while the
	// group has not called NextSeq.
	seq uint64
}

// writeKey names a key of a bucket in Tx.index. Its k shares the bytes
// of the write's key, which Put copied and nothing changes.
type writeKey struct {
	b int
	k string
}

// bytesKey returns k as a string without a copy, for keys of writeKey:
// a lookup's key lives only as long as the lookup, an index's as long
// as the Tx's writes, whose bytes nothing changes.
func bytesKey(k []byte) string { return unsafe.String(unsafe.SliceData(k), len(k)) }

// maxWritesHint bounds the room a group makes for its writes from the
// group before it: one large group does not make every later one
// allocate as much.
const maxWritesHint = 1024

// scanWrites is how many writes a group's reads look through one by one
// before they index them: a few compares of a short slice cost less than
// a map insert per write, which a long slice repays.
const scanWrites = 128

// written returns the last write of k to bucket b made by the group.
func (t *Tx) written(b int, k []byte) (entry, bool) {
	if t.wrote[b/64]&(1<<(b%64)) == 0 {
		return entry{}, false
	}
	if len(t.writes) <= scanWrites {
		for i := len(t.writes) - 1; i >= 0; i-- {
			if e := t.writes[i]; e.b == b && bytes.Equal(e.k, k) {
				return e, true
			}
		}
		return entry{}, false
	}
	if t.index == nil {
		t.index = make(map[writeKey]int, len(t.writes))
	}
	for i := t.indexed; i < len(t.writes); i++ {
		t.index[writeKey{t.writes[i].b, bytesKey(t.writes[i].k)}] = i
	}
	t.indexed = len(t.writes)
	i, ok := t.index[writeKey{b, bytesKey(k)}]
	if !ok {
		return entry{}, false
	}
	return t.writes[i], true
}

// writtenLayer returns the group's writes to bucket b in key order.
func (t *Tx) writtenLayer(b int) layer {
	if t.ordered == nil {
		t.ordered = make([]layer, len(t.d.buckets))
	}
	if t.ordered[b] == nil {
		// Made even if empty, so that a bucket the group never wrote
		// is looked through once.
		l := newLayer()
		for _, e := range t.writes {
			if e.b == b {
				l.Set(ovItem{k: e.k, v: e.v, del: e.del})
			}
		}
		t.ordered[b] = l
	}
	return t.ordered[b]
}

// Put writes v under k in bucket b. It copies k and v: the caller may
// reuse them once Put returns. It returns ErrKeyRequired for an empty
// key, ErrKeyTooLarge or ErrValueTooLarge past MaxKeySize or
// MaxValueSize, and ErrNoBucket for a bucket number out of range: a
// checkpoint must not meet a write it cannot make.
func (t *Tx) Put(b int, k, v []byte) error {
	if err := t.check(b, k); err != nil {
		return err
	}
	if int64(len(v)) > MaxValueSize {
		return ErrValueTooLarge
	}
	// One allocation for both: the overlay keeps them, and drops them,
	// together.
	kv := make([]byte, len(k)+len(v))
	copy(kv, k)
	copy(kv[len(k):], v)
	t.write(entry{b: b, k: kv[:len(k):len(k)], v: kv[len(k):]})
	return nil
}

// Delete deletes k from bucket b. It fails as Put does.
func (t *Tx) Delete(b int, k []byte) error {
	if err := t.check(b, k); err != nil {
		return err
	}
	t.write(entry{b: b, del: true, k: bytes.Clone(k)})
	return nil
}

// DeleteRange deletes the keys of bucket b from from (inclusive; nil is
// the first key) up to to (exclusive; nil is past the last key), as the
// group sees them. Each key deleted is one write of the group's log
// record: it suits ranges of the size a group writes. It returns a
// *CorruptError if the range holds a damaged value.
func (t *Tx) DeleteRange(b int, from, to []byte) error {
	if err := checkBucket(len(t.d.buckets), b); err != nil {
		return err
	}
	var keys [][]byte
	t.Ascend(b, from, to, func(k, _ []byte) bool {
		keys = append(keys, bytes.Clone(k))
		return true
	})
	if t.err != nil {
		return t.err
	}
	for _, k := range keys {
		t.write(entry{b: b, del: true, k: k})
	}
	return nil
}

// NextSeq returns the store's next sequence number: 1 for the first, then
// one more each call, in every group after it too. The counter is
// durable with the group: a group that fails gives its numbers out again,
// one that commits never. A store whose groups never call NextSeq keeps
// no counter in its files.
func (t *Tx) NextSeq() uint64 {
	if t.seq == 0 {
		t.seq = t.d.seq
	}
	t.seq++
	return t.seq
}

func checkBucket(numBuckets, b int) error {
	if b < 0 || b >= numBuckets {
		return fmt.Errorf("%w: %d of %d", ErrNoBucket, b, numBuckets)
	}
	return nil
}

// check refuses a write of key k to bucket b that a checkpoint could not
// make.
func (t *Tx) check(b int, k []byte) error { return checkWrite(len(t.d.buckets), b, k) }

// checkWrite refuses a write of key k to bucket b of a store of
// numBuckets buckets that the bbolt file could not take.
func checkWrite(numBuckets, b int, k []byte) error {
	if err := checkBucket(numBuckets, b); err != nil {
		return err
	}
	switch {
	case len(k) == 0:
		return ErrKeyRequired
	case len(k) > MaxKeySize:
		return ErrKeyTooLarge
	}
	return nil
}

func (t *Tx) write(e entry) {
	t.writes = append(t.writes, e)
	t.wrote[e.b/64] |= 1 << (e.b % 64)
	if t.ordered != nil && t.ordered[e.b] != nil {
		setItem(t.ordered, e)
	}
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
	t := &Tx{reader: reader{d: d, tx: tx}, writes: make([]entry, 0, d.lastWrites)}
	t.own = t
	// ov[0] is the group's own writes, which the reader takes from t.
	t.ov = [3][]layer{nil, d.ov.m, nil}
	if fz != nil {
		t.ov[2] = fz.m
	}
	return t, nil
}

// close ends the group's read transaction.
func (t *Tx) close() { _ = t.tx.Rollback() }

// Update runs fn against the state after the last committed group,
// appends the writes it made to the write-ahead log as one record, and
// returns once that is on disk (fdatasync): one disk write for the whole
// group. On error nothing of fn's writes is kept. Updates take turns.
func (d *DB) Update(fn func(*Tx) error) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.closed.Load() {
		return ErrClosed
	}
	if err := d.Err(); err != nil {
		return err
	}
	if size := d.logSize.Load(); size >= logLimit*d.maxLog {
		// Checkpoints have been failing or nobody calls them: one try
		// here, then refuse rather than grow the log and the overlay
		// without bound.
		if err := d.checkpointNow(); err != nil {
			return fmt.Errorf("write-ahead log holds %d bytes and checkpoints fail: %w", size, err)
		}
	}
	t, err := d.begin()
	if err != nil {
		return err
	}
	err = func() error {
		// The read transaction ends before the log's fdatasync and the
		// wait for omu: a checkpoint whose commit grows bbolt's memory
		// map waits for every read transaction, and readers that hold
		// omu shared wait for that remap, so a writer holding one there
		// would close a cycle. The writes hold no bbolt memory.
		defer t.close()
		err := d.contain(func() error { return fn(t) })
		if t.err != nil {
			// A damaged value explains whatever fn made of it.
			return t.err
		}
		return err
	}()
	if err != nil {
		d.noteCorrupt(err)
		return err
	}
	if t.seq != 0 {
		t.writes = append(t.writes, entry{b: entrySeq, v: encodeSeq(t.seq)})
	}
	if len(t.writes) == 0 {
		return nil
	}
	d.lastWrites = min(len(t.writes), maxWritesHint)
	n, err := d.log.append(t.writes)
	if err != nil {
		if terr := d.log.erase(); terr != nil {
			// The record may be on disk, and a recovery would replay
			// it: nobody can be told the group did not happen.
			d.fail(fmt.Errorf("%w: %w: write-ahead log record (%w) could not be erased after its write failed: %w", ErrFailed, ErrOutcomeUnknown, err, terr))
			return d.Err()
		}
		return err
	}
	if t.seq != 0 {
		d.seq = t.seq
	}
	d.logSize.Add(int64(n))
	d.first.CompareAndSwap(0, d.clock())
	d.omu.Lock()
	d.ov.add(t.writes)
	d.omu.Unlock()
	return nil
}

func encodeSeq(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func decodeSeq(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
