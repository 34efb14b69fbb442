package store

import (
	"bytes"

	"github.com/tidwall/btree"
)

// ovItem is one write of an overlay: the last value of key k, or its
// deletion.
type ovItem struct {
	k, v []byte
	del  bool
}

// value returns the value written, nil for a deletion.
func (x ovItem) value() []byte {
	if x.del {
		return nil
	}
	return x.v
}

func lessItem(a, b ovItem) bool { return bytes.Compare(a.k, b.k) < 0 }

// layer is the writes to one bucket of one overlay, kept in key order so
// that a range read costs a seek and a step per key, however many writes
// wait for a checkpoint. A nil layer holds no writes.
type layer = *btree.BTreeG[ovItem]

// newLayer returns an empty layer. The store's own locks guard it: the
// tree takes none of its own.
func newLayer() layer {
	return btree.NewBTreeGOptions(lessItem, btree.Options{NoLocks: true})
}

// overlay is the writes of one log generation's groups, the last write of
// each key: what readers add to the bbolt file until a checkpoint has
// written them into it. seq is the sequence counter after its groups, 0
// if none of them moved it.
type overlay struct {
	gen uint64
	m   []layer // by bucket; nil until the bucket is written
	seq uint64
}

func newOverlay(gen uint64, buckets int) *overlay {
	return &overlay{gen: gen, m: make([]layer, buckets)}
}

func (o *overlay) add(es []entry) {
	for _, e := range es {
		if e.b == entrySeq {
			o.seq = decodeSeq(e.v)
			continue
		}
		setItem(o.m, e)
	}
}

// setItem records e in the layer of its bucket in m, making the layer if
// need be.
func setItem(m []layer, e entry) {
	if m[e.b] == nil {
		m[e.b] = newLayer()
	}
	m[e.b].Set(ovItem{k: e.k, v: e.v, del: e.del})
}

// writeTo writes the overlay through w, each bucket's keys in order:
// bbolt inserts sorted keys fastest, and a key that many groups wrote
// costs one Put.
func (o *overlay) writeTo(w *writer) error {
	w.seq = max(w.seq, o.seq)
	for b, m := range o.m {
		if m == nil {
			continue
		}
		if w.d.seqb[b] {
			// Appended in order: pages can be split nearly full
			// instead of half, fewer pages to write.
			w.tx.Bucket(w.d.buckets[b]).FillPercent = 0.9
		}
		var err error
		m.Scan(func(x ovItem) bool {
			err = w.apply(entry{b: b, del: x.del, k: x.k, v: x.v})
			return err == nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// snapshot returns copies of the layers of m that stay as they are while
// m goes on taking writes: a copy costs a pointer, and the nodes are
// copied only as writes to m change them. The caller holds d.omu shared
// and d.copyMu, since copying marks m's nodes as shared.
func snapshot(m []layer) []layer {
	s := make([]layer, len(m))
	for i, l := range m {
		if l != nil {
			s[i] = l.Copy()
		}
	}
	return s
}

// ovIter walks the writes of up to three overlays' layers of one bucket,
// in key order or its reverse, within [from, to), the newest write of
// each key once.
type ovIter struct {
	its  [3]btree.IterG[ovItem]
	ok   [3]bool
	n    int
	desc bool
	from []byte
	to   []byte
}

// newOvIter positions an iterator over ls (newest first, nil skipped) at
// the first write of [from, to) in the direction asked. Call release.
func newOvIter(ls [3]layer, from, to []byte, desc bool) *ovIter {
	o := &ovIter{desc: desc, from: from, to: to}
	for _, l := range ls {
		if l == nil || l.Len() == 0 {
			continue
		}
		i := o.n
		o.its[i] = l.Iter()
		it := &o.its[i]
		switch {
		case !desc && from == nil:
			o.ok[i] = it.First()
		case !desc:
			o.ok[i] = it.Seek(ovItem{k: from})
		case to == nil:
			o.ok[i] = it.Last()
		case it.Seek(ovItem{k: to}):
			// At the first key at or after to, which is excluded.
			o.ok[i] = it.Prev()
		default:
			o.ok[i] = it.Last()
		}
		o.n++
	}
	return o
}

func (o *ovIter) release() {
	for i := range o.n {
		o.its[i].Release()
	}
}

// inRange reports whether k is within the iterator's bounds on the side
// it moves towards.
func (o *ovIter) inRange(k []byte) bool {
	if o.desc {
		return o.from == nil || bytes.Compare(k, o.from) >= 0
	}
	return o.to == nil || bytes.Compare(k, o.to) < 0
}

// peek returns the next write without moving past it.
func (o *ovIter) peek() (ovItem, bool) {
	best := -1
	for i := range o.n {
		if !o.ok[i] {
			continue
		}
		k := o.its[i].Item().k
		if best < 0 {
			best = i
			continue
		}
		c := bytes.Compare(k, o.its[best].Item().k)
		if o.desc {
			c = -c
		}
		if c < 0 { // on a tie the newer layer, the lower index, wins
			best = i
		}
	}
	if best < 0 {
		return ovItem{}, false
	}
	x := o.its[best].Item()
	if !o.inRange(x.k) {
		return ovItem{}, false
	}
	return x, true
}

// skip moves every layer past key k.
func (o *ovIter) skip(k []byte) {
	for i := range o.n {
		if o.ok[i] && bytes.Equal(o.its[i].Item().k, k) {
			if o.desc {
				o.ok[i] = o.its[i].Prev()
			} else {
				o.ok[i] = o.its[i].Next()
			}
		}
	}
}
