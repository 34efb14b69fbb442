package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// This file walks a bbolt file's pages from its bytes, read with pread
// rather than through bbolt's memory map, so that a damaged page id
// cannot fault: bbolt follows page ids unchecked, and its tree walks
// (tx.Check, and the free page scan of bbolt.Open under NoFreelistSync)
// run in goroutines of its own, where a page id past the end of the file
// is a fault that debug.SetPanicOnFault cannot turn into a panic, and
// kills the process. The walk checks every bound before it reads, so
// bbolt is only let at a file whose tree is sound.
//
// The layout walked is bbolt v1.5's (go.etcd.io/bbolt/internal/common),
// in the machine's byte order:
//
//	page:    id(8) flags(2) count(2) overflow(4), then count elements
//	meta:    a page whose body is magic(4) version(4) pageSize(4)
//	         flags(4) root(8) sequence(8) freelist(8) pgid(8) txid(8)
//	         checksum(8), the checksum FNV-64a over the bytes before it
//	branch:  elements pos(4) ksize(4) pgid(8)
//	leaf:    elements flags(4) pos(4) ksize(4) vsize(4)
//	bucket:  a leaf value flagged 0x01: root(8) sequence(8), and for
//	         root 0 the bucket's page inline after it
//
// where pos is the offset of the element's key from the element itself,
// a leaf's value follows its key, and the keys and values of a page
// follow its elements in order with no gap (WriteInodeToPage).

const (
	pageHeaderSize  = 16
	branchElemSize  = 16
	leafElemSize    = 16
	metaSize        = 64
	metaSumOffset   = 56 // the checksum covers the meta's bytes before it
	bucketHeadSize  = 16
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	pageBranch      = 0x01
	pageLeaf        = 0x02
	pageMeta        = 0x04
	pageFreelist    = 0x10
	leafBucket      = 0x01
	noFreelist      = ^uint64(0)
	maxPageSize     = 1 << 24 // as far as bbolt looks for the second meta page
	minPageSize     = 1024
	maxTreeDepth    = 64 // far deeper than any bbolt tree; a cycle otherwise
	maxWalkProblems = maxProblems
)

// pageProblem is one piece of damage the walk found.
type pageProblem struct {
	// where is "page 12", "meta page 0" or "meta pages".
	where string
	what  string
	// meta says the problem is a meta page that fails its checks while
	// the other holds: bbolt falls back to that one, and the tree the
	// walk followed is the one bbolt reads.
	meta bool
}

// region is a run of a bbolt file's bytes and what they hold, for tests
// that damage the file where it matters.
type region struct {
	kind string // one of the region* constants
	// bucket is the bucket whose page it is, nested names joined by
	// "/"; "" for the root bucket, whose keys are the buckets' names.
	bucket string
	off, n int64
}

// Kinds of region.
const (
	regionMeta           = "meta"
	regionFreelist       = "freelist"
	regionFree           = "free"
	regionBranchHeader   = "branch header"
	regionBranchElements = "branch elements"
	regionBranchKeys     = "branch keys"
	regionLeafHeader     = "leaf header"
	regionLeafElements   = "leaf element headers"
	regionLeafKeys       = "leaf keys"
	regionLeafValues     = "leaf values"
	regionBucketHeader   = "bucket header"
)

// pageWalk is one walk of a bbolt file.
type pageWalk struct {
	r        io.ReaderAt
	size     int64
	pageSize int64
	hwm      uint64 // the chosen meta's high-water mark, in pages
	metaUsed int    // the meta page bbolt reads, -1 if neither holds
	txid     uint64
	problems []pageProblem
	omitted  int
	seen     []uint64 // a bit per page below the high-water mark and the end of the file
	// regions is kept only when wanted (tests): a file of millions of
	// pages must not cost that much memory.
	regions     []region
	wantRegions bool
}

// walkBoltFile walks the bbolt file at path (see the top of this file).
// It fails only if the file cannot be read; damage is in the walk's
// problems.
func walkBoltFile(path string, wantRegions bool) (*pageWalk, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	return walkBolt(f, fi.Size(), wantRegions), nil
}

// walkBolt walks the bbolt file that r reads, of size bytes. It never
// panics: every offset is checked before it is read, and a panic that
// slips through anyway is one more problem.
func walkBolt(r io.ReaderAt, size int64, wantRegions bool) (w *pageWalk) {
	w = &pageWalk{r: r, size: size, metaUsed: -1, wantRegions: wantRegions}
	defer func() {
		if v := recover(); v != nil {
			w.problem("", fmt.Sprintf("the walk of the file's pages stopped: %v", v))
		}
	}()
	root, freelist, ok := w.metas()
	if !ok {
		return w
	}
	if freelist != noFreelist {
		w.freelist(freelist)
	}
	w.page(root, "", nil, nil, true, 0)
	if w.wantRegions {
		w.free()
	}
	return w
}

// structural reports whether the walk found damage other than a meta
// page bbolt falls back from: damage that bbolt's own walks of the tree
// must not meet.
func (w *pageWalk) structural() bool {
	for _, p := range w.problems {
		if !p.meta {
			return true
		}
	}
	return w.omitted > 0
}

// metaProblem returns the problem of a damaged meta page bbolt falls
// back from, if any.
func (w *pageWalk) metaProblem() (pageProblem, bool) {
	for _, p := range w.problems {
		if p.meta {
			return p, true
		}
	}
	return pageProblem{}, false
}

func (w *pageWalk) problem(where, what string) {
	if len(w.problems) >= maxWalkProblems {
		w.omitted++
		return
	}
	w.problems = append(w.problems, pageProblem{where: where, what: what})
}

func (w *pageWalk) pageProblem(id uint64, format string, args ...any) {
	w.problem("page "+strconv.FormatUint(id, 10), fmt.Sprintf(format, args...))
}

func (w *pageWalk) region(kind, bucket string, off, n int64) {
	if w.wantRegions && n > 0 {
		w.regions = append(w.regions, region{kind: kind, bucket: bucket, off: off, n: n})
	}
}

// read returns the n bytes at off, false if they are not all in the
// file.
func (w *pageWalk) read(off, n int64) ([]byte, bool) {
	if off < 0 || n < 0 || off > w.size || n > w.size-off {
		return nil, false
	}
	b := make([]byte, n)
	if _, err := w.r.ReadAt(b, off); err != nil {
		return nil, false
	}
	return b, true
}

// boltMeta is a meta page's body.
type boltMeta struct {
	magic, version, pageSize   uint32
	root, freelist, pgid, txid uint64
	checksum, sum              uint64
	headerID                   uint64
	headerFlags                uint16
}

func parseMeta(b []byte) boltMeta {
	ne := binary.NativeEndian
	m := boltMeta{headerID: ne.Uint64(b), headerFlags: ne.Uint16(b[8:])}
	body := b[pageHeaderSize : pageHeaderSize+metaSize]
	m.magic = ne.Uint32(body)
	m.version = ne.Uint32(body[4:])
	m.pageSize = ne.Uint32(body[8:])
	m.root = ne.Uint64(body[16:])
	m.freelist = ne.Uint64(body[32:])
	m.pgid = ne.Uint64(body[40:])
	m.txid = ne.Uint64(body[48:])
	m.checksum = ne.Uint64(body[metaSumOffset:])
	h := fnv.New64a()
	_, _ = h.Write(body[:metaSumOffset])
	m.sum = h.Sum64()
	return m
}

// invalid says why bbolt rejects m, "" if it does not (Meta.Validate).
func (m boltMeta) invalid() string {
	switch {
	case m.magic != boltMagic:
		return fmt.Sprintf("magic %#x, not bbolt's", m.magic)
	case m.version != boltVersion:
		return fmt.Sprintf("version %d, not %d", m.version, boltVersion)
	case m.checksum != m.sum:
		return "checksum mismatch"
	}
	return ""
}

// metaAt reads the meta at off, if the file holds a whole one there.
func (w *pageWalk) metaAt(off int64) (boltMeta, bool) {
	b, ok := w.read(off, pageHeaderSize+metaSize)
	if !ok {
		return boltMeta{}, false
	}
	return parseMeta(b), true
}

// metas reads the two meta pages as bbolt.Open does: the page size from
// meta page 0, or, if it is invalid, from the first valid meta page at
// 1 KiB times a power of two; then the valid one of the highest txid. It
// returns the root bucket's page and the freelist's of the meta chosen.
func (w *pageWalk) metas() (root, freelist uint64, ok bool) {
	ps := int64(0)
	if m, ok := w.metaAt(0); ok && m.invalid() == "" {
		ps = int64(m.pageSize)
	} else {
		for pos := int64(minPageSize); pos <= maxPageSize && pos < w.size-minPageSize; pos <<= 1 {
			if m, ok := w.metaAt(pos); ok && m.invalid() == "" {
				ps = int64(m.pageSize)
				break
			}
		}
	}
	if ps == 0 {
		w.problem("meta pages", "neither meta page is valid")
		return 0, 0, false
	}
	if ps < pageHeaderSize+metaSize || ps > maxPageSize {
		w.problem("meta pages", fmt.Sprintf("page size %d", ps))
		return 0, 0, false
	}
	w.pageSize = ps
	var ms [2]boltMeta
	var bad [2]string
	for i := range ms {
		m, ok := w.metaAt(int64(i) * ps)
		switch {
		case !ok:
			bad[i] = "cut off by the end of the file"
		default:
			ms[i], bad[i] = m, m.invalid()
		}
		w.region(regionMeta, "", int64(i)*ps, pageHeaderSize+metaSize)
	}
	// bbolt prefers the higher txid, even of a meta that fails.
	a, b := 0, 1
	if ms[1].txid > ms[0].txid {
		a, b = 1, 0
	}
	use := a
	if bad[a] != "" {
		use = b
	}
	if bad[use] != "" {
		w.problem("meta pages", fmt.Sprintf("neither meta page is valid: meta page 0: %s; meta page 1: %s", bad[0], bad[1]))
		return 0, 0, false
	}
	w.metaUsed, w.txid = use, ms[use].txid
	if other := 1 - use; bad[other] != "" {
		w.problems = append(w.problems, pageProblem{where: fmt.Sprintf("meta page %d", other), meta: true,
			what: fmt.Sprintf("%s; bbolt falls back to meta page %d (txid %d)", bad[other], use, ms[use].txid)})
	}
	m := ms[use]
	where := fmt.Sprintf("meta page %d", use)
	if m.headerID != uint64(use) || m.headerFlags != pageMeta {
		w.problem(where, fmt.Sprintf("page header says page %d of type %#x", m.headerID, m.headerFlags))
	}
	if int64(m.pageSize) != ps {
		w.problem(where, fmt.Sprintf("page size %d, but the file's is %d", m.pageSize, ps))
		return 0, 0, false
	}
	w.hwm = m.pgid
	w.seen = make([]uint64, (min(m.pgid, uint64(w.size/ps))+63)/64)
	if pages := uint64(w.size / ps); m.pgid > pages {
		w.problem(where, fmt.Sprintf("high-water mark %d pages, past the end of the file (%d pages)", m.pgid, pages))
	}
	if m.root < 2 || m.root >= m.pgid {
		w.problem(where, fmt.Sprintf("root bucket at page %d, outside pages 2 to %d", m.root, m.pgid))
		return 0, 0, false
	}
	if m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid) {
		w.problem(where, fmt.Sprintf("freelist at page %d, outside pages 2 to %d", m.freelist, m.pgid))
		return 0, 0, false
	}
	return m.root, m.freelist, true
}

// pageAt reads page id and its overflow pages, checking its header: the
// id it says, a type in want (a mask of page types) and its extent. It
// marks the pages seen.
func (w *pageWalk) pageAt(id uint64, want uint16) (p []byte, ok bool) {
	if id < 2 || id >= w.hwm {
		w.pageProblem(id, "outside pages 2 to %d", w.hwm)
		return nil, false
	}
	if id >= uint64(w.size/w.pageSize) {
		w.pageProblem(id, "past the end of the file")
		return nil, false
	}
	off := int64(id) * w.pageSize
	h, ok := w.read(off, pageHeaderSize)
	if !ok {
		w.pageProblem(id, "past the end of the file")
		return nil, false
	}
	ne := binary.NativeEndian
	hid, flags, overflow := ne.Uint64(h), ne.Uint16(h[8:]), uint64(ne.Uint32(h[12:]))
	if hid != id {
		w.pageProblem(id, "its header says page %d", hid)
		return nil, false
	}
	if flags&want == 0 || flags&(flags-1) != 0 {
		w.pageProblem(id, "type %#x where a %s page belongs", flags, typeNames(want))
		return nil, false
	}
	if id+overflow >= w.hwm {
		w.pageProblem(id, "%d overflow pages run past the high-water mark %d", overflow, w.hwm)
		return nil, false
	}
	n := int64(overflow+1) * w.pageSize
	if p, ok = w.read(off, n); !ok {
		w.pageProblem(id, "%d overflow pages run past the end of the file", overflow)
		return nil, false
	}
	for i := id; i <= id+overflow; i++ {
		if w.reached(i) {
			w.pageProblem(i, "reached twice")
			return nil, false
		}
	}
	for i := id; i <= id+overflow; i++ {
		w.seen[i/64] |= 1 << (i % 64)
	}
	return p, true
}

// reached reports whether the walk has reached page id.
func (w *pageWalk) reached(id uint64) bool {
	return id/64 < uint64(len(w.seen)) && w.seen[id/64]&(1<<(id%64)) != 0
}

func typeNames(mask uint16) string {
	switch mask {
	case pageBranch:
		return "branch"
	case pageLeaf:
		return "leaf"
	case pageFreelist:
		return "freelist"
	}
	return "branch or leaf"
}

// freelist walks the freelist page id (a file whose freelist is synced:
// the store's is not, but a file written by other code may be).
func (w *pageWalk) freelist(id uint64) {
	p, ok := w.pageAt(id, pageFreelist)
	if !ok {
		return
	}
	w.region(regionFreelist, "", int64(id)*w.pageSize, int64(len(p)))
	ne := binary.NativeEndian
	count, at := uint64(ne.Uint16(p[10:])), int64(pageHeaderSize)
	if count == 0xffff {
		if len(p) < pageHeaderSize+8 {
			w.pageProblem(id, "freelist count cut off")
			return
		}
		count, at = ne.Uint64(p[pageHeaderSize:]), pageHeaderSize+8
	}
	if count > uint64(int64(len(p))-at)/8 {
		w.pageProblem(id, "freelist of %d ids overruns the page", count)
		return
	}
	for i := range int64(count) {
		if fid := ne.Uint64(p[at+8*i:]); fid < 2 || fid >= w.hwm {
			w.pageProblem(id, "freelist entry %d is page %d, outside pages 2 to %d", i, fid, w.hwm)
			return
		}
	}
}

// free notes the pages nothing reaches as free: bbolt's freelist, which
// it rebuilds at open by the same walk.
func (w *pageWalk) free() {
	pages := uint64(w.size / w.pageSize)
	for id := uint64(2); id < pages; id++ {
		if !w.reached(id) {
			w.region(regionFree, "", int64(id)*w.pageSize, w.pageSize)
		}
	}
}

// page walks page id of bucket b and the pages under it, whose keys must
// lie in [lo, hi) (nil: unbounded). root says it is the bucket's root
// page, which alone may be an empty leaf. It returns the page's first
// key, nil if it has none or cannot be read.
func (w *pageWalk) page(id uint64, b string, lo, hi []byte, root bool, depth int) []byte {
	if depth > maxTreeDepth {
		w.pageProblem(id, "deeper than %d pages", maxTreeDepth)
		return nil
	}
	p, ok := w.pageAt(id, pageBranch|pageLeaf)
	if !ok {
		return nil
	}
	return w.nodes(p, int64(id)*w.pageSize, "page "+strconv.FormatUint(id, 10), b, lo, hi, root, depth)
}

// nodes walks the elements of page p, at file offset off (a bucket's
// page inline in its parent's value included), whose header has been
// checked.
func (w *pageWalk) nodes(p []byte, off int64, where, b string, lo, hi []byte, root bool, depth int) []byte {
	bad := func(format string, args ...any) []byte {
		w.problem(where, fmt.Sprintf(format, args...))
		return nil
	}
	ne := binary.NativeEndian
	flags, count := ne.Uint16(p[8:]), int64(ne.Uint16(p[10:]))
	leaf := flags == pageLeaf
	kind := map[bool][3]string{
		false: {regionBranchHeader, regionBranchElements, regionBranchKeys},
		true:  {regionLeafHeader, regionLeafElements, regionLeafKeys},
	}[leaf]
	w.region(kind[0], b, off, pageHeaderSize)
	if count == 0 && (!leaf || !root) {
		return bad("an empty %s page, which bbolt never leaves", map[bool]string{false: "branch", true: "leaf"}[leaf])
	}
	elemEnd := pageHeaderSize + count*branchElemSize // leaf elements are the same size
	if elemEnd > int64(len(p)) {
		return bad("%d elements overrun the page", count)
	}
	w.region(kind[1], b, off+pageHeaderSize, elemEnd-pageHeaderSize)
	type child struct {
		key  []byte
		id   uint64
		kind uint32
		val  []byte
		voff int64
	}
	children := make([]child, 0, count)
	next := elemEnd // where bbolt puts the next element's key
	var prev []byte
	for i := range count {
		e := pageHeaderSize + i*branchElemSize
		var pos, ksize, vsize int64
		var c child
		if leaf {
			c.kind = ne.Uint32(p[e:])
			pos, ksize, vsize = int64(ne.Uint32(p[e+4:])), int64(ne.Uint32(p[e+8:])), int64(ne.Uint32(p[e+12:]))
		} else {
			pos, ksize = int64(ne.Uint32(p[e:])), int64(ne.Uint32(p[e+4:]))
			c.id = ne.Uint64(p[e+8:])
		}
		switch {
		case e+pos != next:
			return bad("element %d's key at offset %d, where bbolt puts it at %d", i, e+pos, next)
		case ksize == 0:
			return bad("element %d has an empty key", i)
		case ksize+vsize > int64(len(p))-next:
			return bad("element %d's key and value (%d and %d bytes) overrun the page", i, ksize, vsize)
		case leaf && c.kind&^leafBucket != 0:
			return bad("element %d has flags %#x", i, c.kind)
		case leaf && b == "" && c.kind != leafBucket:
			return bad("element %d of the root bucket is not a bucket", i)
		}
		c.key = p[next : next+ksize]
		w.region(kind[2], b, off+next, ksize)
		if leaf {
			c.val, c.voff = p[next+ksize:next+ksize+vsize], off+next+ksize
			if c.kind != leafBucket {
				w.region(regionLeafValues, b, c.voff, vsize)
			}
		}
		next += ksize + vsize
		switch {
		case prev != nil && bytes.Compare(prev, c.key) >= 0:
			return bad("element %d's key %q is not after the one before, %q", i, c.key, prev)
		case lo != nil && bytes.Compare(c.key, lo) < 0:
			return bad("element %d's key %q is before its parent's bound %q", i, c.key, lo)
		case hi != nil && bytes.Compare(c.key, hi) >= 0:
			return bad("element %d's key %q is not before its parent's next key %q", i, c.key, hi)
		}
		prev = c.key
		children = append(children, c)
	}
	for i, c := range children {
		switch {
		case !leaf:
			bound := hi
			if i+1 < len(children) {
				bound = children[i+1].key
			}
			first := w.page(c.id, b, c.key, bound, false, depth+1)
			if first != nil && !bytes.Equal(first, c.key) {
				// bbolt rewrites a branch's key whenever it writes the
				// child, to the child's first key.
				w.pageProblem(c.id, "first key %q, but its parent's %s says %q", first, where, c.key)
			}
		case c.kind == leafBucket:
			w.bucket(c.val, c.voff, where, joinBucket(b, string(c.key)), depth)
		}
	}
	if len(children) == 0 {
		return nil
	}
	return children[0].key
}

// bucket walks the bucket whose header is v, at file offset off in the
// page at where.
func (w *pageWalk) bucket(v []byte, off int64, where, name string, depth int) {
	if len(v) < bucketHeadSize {
		w.problem(where, fmt.Sprintf("bucket %q's header is %d bytes", name, len(v)))
		return
	}
	w.region(regionBucketHeader, name, off, bucketHeadSize)
	root := binary.NativeEndian.Uint64(v)
	if root != 0 {
		if len(v) != bucketHeadSize {
			w.problem(where, fmt.Sprintf("bucket %q has a root page and %d bytes inline", name, len(v)-bucketHeadSize))
			return
		}
		w.page(root, name, nil, nil, true, depth+1)
		return
	}
	inline := v[bucketHeadSize:]
	where = fmt.Sprintf("%s, bucket %q inline", where, name)
	if len(inline) < pageHeaderSize {
		w.problem(where, fmt.Sprintf("an inline page of %d bytes", len(inline)))
		return
	}
	if flags := binary.NativeEndian.Uint16(inline[8:]); flags != pageLeaf {
		w.problem(where, fmt.Sprintf("type %#x where a leaf page belongs", flags))
		return
	}
	if binary.NativeEndian.Uint32(inline[12:]) != 0 {
		w.problem(where, "an inline page with overflow pages")
		return
	}
	w.nodes(inline, off+bucketHeadSize, where, name, nil, nil, true, depth+1)
}

func joinBucket(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "/" + name
}

// blameMeta returns err, Open's refusal of the store at path, as the
// damaged meta page that explains it, if one does: bbolt silently falls
// back to the older meta page, whose file is older than the log once a
// later checkpoint has started the log's next generation, and the log
// then looks like another data dir's. Other errors come back as they are.
func blameMeta(path string, err error) error {
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Remedy != restoreTogether {
		return err
	}
	w, werr := walkBoltFile(path, false)
	if werr != nil {
		return err
	}
	p, ok := w.metaProblem()
	if !ok {
		return err
	}
	return &CorruptError{File: filepath.Base(path), Where: p.where,
		Problem: fmt.Sprintf("%s, which is older than the write-ahead log (%s %s: %s)", p.what, ce.File, ce.Where, ce.Problem),
		Remedy:  "restore the data dir from a backup"}
}

// walkedOpener returns bbolt's Options.OpenFile for a store opened for
// writing: it opens the file with open (os.OpenFile if nil), takes
// bbolt's lock on it, so that no writer changes it meanwhile, and walks
// its pages, refusing a file whose tree is damaged before bbolt.Open
// walks it to rebuild its free list. A new, empty file is bbolt's to
// initialize.
func (d *DB) walkedOpener(open func(string, int, os.FileMode) (*os.File, error), timeout time.Duration) func(string, int, os.FileMode) (*os.File, error) {
	if open == nil {
		open = os.OpenFile
	}
	return func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := open(name, flag, perm)
		if err != nil {
			return nil, err
		}
		if err := lockFile(f, timeout); err != nil {
			_ = f.Close()
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		if fi.Size() == 0 {
			return f, nil
		}
		w := walkBolt(f, fi.Size(), false)
		for _, p := range w.problems {
			if !p.meta {
				_ = f.Close()
				return nil, fileCorruptf(d.name, p.where, "%s", p.what)
			}
		}
		return f, nil
	}
}
