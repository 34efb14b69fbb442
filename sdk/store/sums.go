package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// A bbolt page whose element headers are damaged can hide a value
// without failing any checksum: a lookup that lands beside it reports
// the key missing. So each bucket's values are counted, and their
// checksums summed, in the store's own bucket, under keySums plus the
// bucket's name; the scrubber and Check add the values up and compare,
// so that a value lost from a bucket is reported as damage, never
// served as "not found".
var keySums = []byte("sums/")

// bucketSum is the number of values in a bucket and the sum, modulo
// 2^64, of their checksums (the frames' CRC-32C, which cover key and
// value). Both count modulo 2^64, so that a difference of two sums is a
// bucketSum too.
type bucketSum struct{ n, sum uint64 }

func frameCRC(fv []byte) uint64 { return uint64(binary.BigEndian.Uint32(fv)) }

// add counts the framed value fv in.
func (s *bucketSum) add(fv []byte) { s.n++; s.sum += frameCRC(fv) }

// sub counts the framed value fv out.
func (s *bucketSum) sub(fv []byte) { s.n--; s.sum -= frameCRC(fv) }

// merge adds o in.
func (s *bucketSum) merge(o bucketSum) { s.n += o.n; s.sum += o.sum }

func (s bucketSum) bytes() []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, s.n), s.sum)
}

func sumsKey(bucket []byte) []byte { return append(bytes.Clone(keySums), bucket...) }

// mismatch describes how the values found in a bucket, got, differ from
// its recorded sum, want; empty if they agree.
func (want bucketSum) mismatch(got bucketSum) string {
	switch {
	case got.n != want.n:
		return fmt.Sprintf("holds %d values, but its count says %d: damage to the file's pages lost or added a value", got.n, want.n)
	case got.sum != want.sum:
		return "the checksums of its values do not add up to its recorded sum: damage to the file's pages replaced a value"
	}
	return ""
}

// sumBucket counts the values of b and checks each one's checksum.
func sumBucket(name []byte, b *bolt.Bucket) (bucketSum, error) {
	var s bucketSum
	err := b.ForEach(func(k, fv []byte) error {
		if fv == nil {
			return fmt.Errorf("key %q is a nested bucket, which the store never writes", k)
		}
		if _, ok := unframe(k, fv); !ok {
			return fmt.Errorf("key %q: checksum mismatch", k)
		}
		s.add(fv)
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("bucket %s %w", name, err)
	}
	return s, nil
}

// storeKeys reads the store's own bucket of a file of Format: every value
// framed, the three keys of the layout, a sum for every other bucket
// present, and the sequence counter if a group ever moved it. It returns
// the values of the layout's keys and of the counter, and the sums by
// bucket name.
func storeKeys(tx *bolt.Tx, st *bolt.Bucket) (vals map[string]uint64, sums map[string]bucketSum, err error) {
	vals = map[string]uint64{}
	sums = map[string]bucketSum{}
	err = st.ForEach(func(k, fv []byte) error {
		v, ok := unframe(k, fv)
		switch {
		case fv == nil:
			return fmt.Errorf("key %q is a nested bucket, which the store never writes", k)
		case !ok:
			return fmt.Errorf("key %q: checksum mismatch", k)
		case bytes.HasPrefix(k, keySums) && len(v) == 16:
			sums[string(k[len(keySums):])] = bucketSum{binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])}
		case (bytes.Equal(k, keyFormat) || bytes.Equal(k, keyWALGen) || bytes.Equal(k, keyOpen) || bytes.Equal(k, keySeq)) && len(v) == 8:
			vals[string(k)] = binary.BigEndian.Uint64(v)
		default:
			return fmt.Errorf("key %q with a %d-byte value is not one the store writes", k, len(v))
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	var missing []string
	for _, k := range [][]byte{keyFormat, keyWALGen, keyOpen} {
		if _, ok := vals[string(k)]; !ok {
			missing = append(missing, string(k))
		}
	}
	err = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if _, ok := sums[string(name)]; !ok && !bytes.Equal(name, bucketStore) {
			missing = append(missing, string(sumsKey(name)))
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if len(missing) > 0 {
		return nil, nil, fmt.Errorf("keys %s are missing: damage to the file's pages lost them", strings.Join(missing, ", "))
	}
	return vals, sums, nil
}

// writer makes a checkpoint's or a recovery's writes in a bbolt write
// transaction, keeping each bucket's sum, and the scrubber's running sum
// of the bucket it is part way through, in step.
type writer struct {
	d    *DB
	tx   *bolt.Tx
	sums []bucketSum // by bucket index
	// scrub, if set, is the scrubber, whose mutex the caller holds; delta
	// is what the writes change of its running sum, applied once the
	// transaction commits.
	scrub *scrubber
	delta bucketSum
	// seq is the sequence counter the writes leave, 0 if none ever
	// moved it.
	seq uint64
	// open are, by bucket index, the buckets written so far; nil until
	// the first write of each.
	open []*openBucket
}

// openBucket is a bucket of a writer's transaction.
type openBucket struct {
	b *bolt.Bucket
	// c looks up old values: one cursor per bucket, whose stack a
	// lookup fills, grown once rather than per write.
	c *bolt.Cursor
	// last is the greatest key the bucket holds, read at its first
	// write and raised by every write after it: a key past it is new,
	// and needs no lookup of an old value.
	last []byte
}

// newWriter starts writing into tx, with the buckets' sums as sums holds
// them.
func (d *DB) newWriter(tx *bolt.Tx, sums map[string]bucketSum, scrub *scrubber) *writer {
	w := &writer{d: d, tx: tx, sums: make([]bucketSum, len(d.buckets)), scrub: scrub}
	for i, name := range d.buckets {
		w.sums[i] = sums[string(name)]
	}
	return w
}

// use moves w on to tx, the next transaction of the same writes, as an
// import makes them: the buckets' last keys stay what the writes left.
func (w *writer) use(tx *bolt.Tx) {
	w.tx = tx
	for _, wb := range w.open {
		if wb != nil {
			wb.b, wb.c = nil, nil
		}
	}
}

// apply writes e, with the value's checksum, and keeps the sums.
func (w *writer) apply(e entry) error {
	if e.b == entrySeq {
		w.seq = max(w.seq, decodeSeq(e.v))
		return nil
	}
	name := w.d.buckets[e.b]
	scrubbed := w.scrub != nil && w.scrub.bucket == e.b && w.scrub.after != nil && bytes.Compare(e.k, w.scrub.after) <= 0
	if w.open == nil {
		w.open = make([]*openBucket, len(w.d.buckets))
	}
	wb := w.open[e.b]
	if wb == nil {
		wb = &openBucket{b: w.tx.Bucket(name)}
		wb.c = wb.b.Cursor()
		k, _ := wb.c.Last()
		wb.last = bytes.Clone(k)
		w.open[e.b] = wb
	} else if wb.b == nil {
		wb.b = w.tx.Bucket(name)
		wb.c = wb.b.Cursor()
	}
	b := wb.b
	// Appends (sequence numbers, times: most checkpointed keys of a
	// sequential bucket) are past the bucket's last key: no old value.
	found := false
	if bytes.Compare(e.k, wb.last) > 0 {
		if !e.del {
			wb.last = e.k
		}
	} else if k, old := wb.c.Seek(e.k); k != nil && bytes.Equal(k, e.k) {
		if _, ok := unframe(k, old); old == nil || !ok {
			return fileCorruptf(w.d.name, fmt.Sprintf("bucket %s key %q", name, e.k), "checksum mismatch")
		}
		found = true
		w.sums[e.b].sub(old)
		if scrubbed {
			w.delta.sub(old)
		}
	}
	if e.del {
		// A key the file does not hold (most often one written and
		// deleted again before this checkpoint) needs no deletion; one
		// it does is where the lookup left the cursor.
		if !found {
			return nil
		}
		if err := wb.c.Delete(); err != nil {
			return fmt.Errorf("%s %q: %w", name, e.k, w.d.mapErr(err))
		}
		return nil
	}
	fv := make([]byte, frameBytes, frameBytes+len(e.v))
	binary.BigEndian.PutUint32(fv, frameSum(e.k, e.v))
	fv = append(fv, e.v...)
	if err := b.Put(e.k, fv); err != nil {
		return fmt.Errorf("%s %q: %w", name, e.k, w.d.mapErr(err))
	}
	w.sums[e.b].add(fv)
	if scrubbed {
		w.delta.add(fv)
	}
	return nil
}

// finish writes the buckets' sums, the layout's keys and the sequence
// counter into the store's bucket.
func (w *writer) finish(gen uint64, open bool) error {
	st, err := w.tx.CreateBucketIfNotExists(bucketStore)
	if err != nil {
		return err
	}
	for i, name := range w.d.buckets {
		if err := putFramed(st, sumsKey(name), w.sums[i].bytes()); err != nil {
			return err
		}
	}
	o := uint64(0)
	if open {
		o = 1
	}
	for _, kv := range [][2][]byte{{keyFormat, u64(Format)}, {keyWALGen, u64(gen)}, {keyOpen, u64(o)}} {
		if err := putFramed(st, kv[0], kv[1]); err != nil {
			return err
		}
	}
	if w.seq > 0 {
		// Written once a group has moved the counter: the files of a
		// store that never does stay as a release without it wrote them.
		return putFramed(st, keySeq, u64(w.seq))
	}
	return nil
}

// committed applies the transaction's change of the scrubber's running
// sum, once it has committed.
func (w *writer) committed() {
	if w.scrub != nil {
		w.scrub.seen.merge(w.delta)
	}
}
