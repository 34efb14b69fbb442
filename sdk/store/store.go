package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Defaults of Options.
const (
	// DefaultLockTimeout is how long Open waits for the file lock when
	// Options.LockTimeout is zero.
	DefaultLockTimeout = time.Second
	// DefaultCheckpointInterval is Options.CheckpointInterval's default.
	DefaultCheckpointInterval = 100 * time.Millisecond
	// DefaultCheckpointBytes is Options.CheckpointBytes' default.
	DefaultCheckpointBytes = 8 << 20
)

// logLimit times Options.CheckpointBytes is as far as the write-ahead log
// grows while checkpoints fail; then writers are refused.
const logLimit = 4

// initialMmapSize is mapped up front so that the file can grow to it
// without a remap, during which bbolt holds readers off.
const initialMmapSize = 256 << 20

// Format is the version of the store's layout, in its "store" bucket:
// 2 has a start record at the head of each log generation, 3 checksums
// the store's own keys and keeps each bucket's sum (sums.go). Open
// converts a file of format 2 and refuses any other. The sequence
// counter (Tx.NextSeq) adds a key to the store's bucket and an entry to
// the log without a new format: only a store that uses it writes them,
// and a release without it refuses such files as damaged.
const Format = 3

// formatUnframed is the format whose store bucket held its values
// without checksums; Open converts it.
const formatUnframed = 2

// The store's own bucket and keys.
var (
	bucketStore = []byte("store")
	keyFormat   = []byte("format")
	keyWALGen   = []byte("wal_gen")
	keyOpen     = []byte("open")
	// keySeq is the sequence counter (Tx.NextSeq), there once a group
	// has moved it.
	keySeq = []byte("seq")
)

// Bucket declares one of a store's buckets.
type Bucket struct {
	// Name is the bucket's name in the file. "store" is the store's own.
	Name string
	// Sequential says keys are mostly appended in order (sequence
	// numbers, timestamps): pages are then split nearly full.
	Sequential bool
}

// Options configure Open.
type Options struct {
	// Buckets are the store's buckets. Their numbers in Tx and Snapshot
	// calls are their indexes here, and the write-ahead log records them
	// by number: a plugin may append buckets in a later release, but
	// never reorder or remove them. At most 127.
	Buckets []Bucket
	// LockTimeout bounds the wait for the file's lock, which another
	// process holding the file keeps; default DefaultLockTimeout.
	LockTimeout time.Duration
	// CheckpointInterval and CheckpointBytes say when CheckpointDue
	// reports true: once the oldest group not yet in the bbolt file is
	// this old, or the write-ahead log has grown by this many bytes.
	// Defaults DefaultCheckpointInterval and DefaultCheckpointBytes.
	CheckpointInterval time.Duration
	CheckpointBytes    int64
	// Hooks, if set, are fault-injection points.
	Hooks *Hooks

	// readOnly opens the bbolt file read-only and leaves the log alone
	// (Check).
	readOnly bool
}

// Recovery is what Open found and did.
type Recovery struct {
	// Groups is the number of groups replayed from the write-ahead log.
	Groups int
	// Trimmed is the torn record left out at the log's end, if any.
	Trimmed *Trim
	// Converted is set when Open converted a file of the store's
	// earlier format (see Format).
	Converted bool
}

// DB is a store: a bbolt file and its write-ahead log. It is safe for
// concurrent use: writers (Update) take turns, checkpoints take turns and
// run alongside writers, and readers (View, Scan) run alongside both.
// Create one with Open and call Close.
type DB struct {
	path    string
	name    string // base name of path, for errors
	opts    Options
	buckets [][]byte
	seqb    []bool
	db      *bolt.DB
	every   time.Duration
	maxLog  int64
	closed  atomic.Bool

	recovery Recovery

	// The locks are taken in the order cmu, wmu, scrub.mu, omu.
	//
	// wmu serializes the writers and is held across the log's fdatasync:
	// each group must see the one before it. It guards log, first and
	// logSize's updates, and the contents of ov.
	wmu sync.Mutex
	log *wal
	// cmu serializes checkpoints, Close and Reopen. A checkpoint holds
	// wmu only to start the log's next generation (rotate), not while it
	// writes the bbolt file.
	cmu sync.Mutex
	// checkpointing is set while a Checkpoint runs, so that
	// CheckpointDue does not send a second caller to wait for it.
	checkpointing atomic.Bool
	// failed is set by a disk error after which the files' state is not
	// known (a checkpoint's bbolt commit, or a log record that could be
	// neither written nor erased), or by corruption met while running;
	// every writer then gets it. Readers still answer: what they see was
	// acknowledged. Reopen clears a disk error, never corruption.
	failed atomic.Pointer[error]
	// corruptions counts the corrupt values and pages met while
	// running (Corruptions).
	corruptions atomic.Uint64
	scrub       scrubber
	// Of the log's current generation: the first group's time (clock),
	// and the log's size, read by CheckpointDue without wmu.
	first   atomic.Int64
	logSize atomic.Int64
	// frozenFirst is first of the generation frozen holds, for
	// CheckpointLag: rotate stores it before frozen.
	frozenFirst atomic.Int64
	opened      time.Time // for clock

	// omu guards the pointers db, ov and frozen and ov's contents:
	// writers extend ov, rotate moves it to frozen, a checkpoint drops
	// frozen once the bbolt file holds it, Reopen replaces them all,
	// exclusively. Readers hold it shared while they take the pointers
	// and begin their bbolt read transaction, View also while it reads,
	// so that they see one consistent state: the file, under frozen,
	// under ov.
	omu    sync.RWMutex
	ov     *overlay
	frozen atomic.Pointer[overlay]
	// copyMu serializes Scan's copies of ov's layers, which mark their
	// nodes as shared; Scan holds omu shared meanwhile.
	copyMu sync.Mutex
	// seq is the sequence counter after the last committed group
	// (Tx.NextSeq). wmu guards it.
	seq uint64
	// lastWrites is how many writes the last group made, up to
	// maxWritesHint: the next group's room for its writes, made at
	// once instead of grown by doubling. wmu guards it.
	lastWrites int
}

// Open opens or creates the store file at path, with its write-ahead log
// files at path + ".wal" and ".wal.1", and replays into the file the
// groups the log holds. If another process holds the file it fails after
// Options.LockTimeout instead of waiting for ever. Damaged files make it
// fail with a *CorruptError; a torn record at the log's end is left out
// and reported in Recovery. A bbolt file the store did not write (one
// with buckets but not the store's own) fails it with an error wrapping
// ErrNotStore, and is left unchanged: a plugin converts its own earlier
// files with Import.
func Open(path string, opts Options) (*DB, error) {
	if err := validBuckets(opts.Buckets); err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	d := &DB{path: path, name: filepath.Base(path), opts: opts, every: opts.CheckpointInterval,
		maxLog: opts.CheckpointBytes, opened: time.Now()}
	for _, b := range opts.Buckets {
		d.buckets = append(d.buckets, []byte(b.Name))
		d.seqb = append(d.seqb, b.Sequential)
	}
	if d.every <= 0 {
		d.every = DefaultCheckpointInterval
	}
	if d.maxLog <= 0 {
		d.maxLog = DefaultCheckpointBytes
	}
	db, err := d.openBolt()
	if err != nil {
		return nil, err
	}
	if opts.readOnly {
		d.db = db
		return d, nil
	}
	if err := d.recover(db); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, blameMeta(path, err))
	}
	d.db = db
	// bbolt's free page scan has read every page through the map.
	d.dropResident()
	return d, nil
}

// validBuckets refuses the buckets of Options that a store cannot have.
func validBuckets(bs []Bucket) error {
	if len(bs) == 0 || len(bs) > walMaxBuckets {
		return fmt.Errorf("%d buckets, want 1 to %d", len(bs), walMaxBuckets)
	}
	for _, b := range bs {
		if b.Name == "" || b.Name == string(bucketStore) {
			return fmt.Errorf("bucket name %q is reserved or empty", b.Name)
		}
	}
	return nil
}

// openBolt opens the bbolt file, turning a damaged one into a
// *CorruptError.
func (d *DB) openBolt() (db *bolt.DB, err error) {
	timeout := cmp.Or(d.opts.LockTimeout, DefaultLockTimeout)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			db, err = nil, fileCorruptf(d.name, "", "the file cannot be read: %v", v)
		}
	}()
	openFile := d.hooks().OpenFile
	if !d.opts.readOnly {
		openFile = d.walkedOpener(openFile, timeout) // Check walks the file itself
	}
	db, err = bolt.Open(d.path, 0o600, &bolt.Options{
		Timeout: timeout,
		// The freelist is rebuilt by a scan at open instead of being
		// written by every bbolt commit (each checkpoint): fewer pages
		// per fdatasync.
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: cmp.Or(d.hooks().MmapSize, initialMmapSize),
		OpenFile:        openFile,
		ReadOnly:        d.opts.readOnly,
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("open store %s: %w for %v: another process has it open", d.path, ErrLocked, timeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, fileCorruptf(d.name, "meta pages", "%v", err)
	case err != nil:
		return nil, fmt.Errorf("open store %s: %w", d.path, d.mapErr(err))
	}
	return db, nil
}

// layout is what the file says of itself.
type layout struct {
	gen   uint64
	seq   uint64 // the sequence counter, 0 if never moved
	open  bool   // not closed cleanly: the log may hold groups
	fresh bool
	// sums are the buckets' sums by name; nil in a file of an earlier
	// format, which has none yet.
	sums map[string]bucketSum
}

// readLayout reads the store's own bucket. Damage to it is a
// *CorruptError; a format this release does not read is a plain error.
func (d *DB) readLayout(tx *bolt.Tx) (layout, error) {
	if st := tx.Bucket(bucketStore); st != nil {
		fv := st.Get(keyFormat)
		v, framed := unframe(keyFormat, fv)
		switch {
		case len(fv) == 8:
			// Format 2 kept the store's keys unframed.
			v, framed = fv, false
		case !framed || len(v) != 8:
			return layout{}, fileCorruptf(d.name, "bucket store key \"format\"", "checksum mismatch or not a format number")
		}
		switch f := binary.BigEndian.Uint64(v); {
		case f > Format:
			return layout{}, fmt.Errorf("store format %d is newer than this release's %d: open the file with the release that wrote it", f, Format)
		case f == formatUnframed && !framed:
			return d.readUnframed(st)
		case f < Format:
			// No release wrote an older format: nothing converts it.
			return layout{}, fmt.Errorf("store format %d is older than this release's %d and no release wrote it (a development build did): restore the data dir from a backup", f, Format)
		}
		vals, sums, err := storeKeys(tx, st)
		if err != nil {
			return layout{}, fileCorruptf(d.name, "bucket store", "%v", err)
		}
		return layout{gen: vals[string(keyWALGen)], seq: vals[string(keySeq)], open: vals[string(keyOpen)] == 1, sums: sums}, nil
	}
	if name, _ := tx.Cursor().First(); name != nil {
		return layout{}, fmt.Errorf("%w: it holds bucket %q but not the store's own", ErrNotStore, name)
	}
	return layout{fresh: true}, nil
}

// readUnframed reads the store's bucket of a file of formatUnframed,
// which holds exactly its three keys, unframed.
func (d *DB) readUnframed(st *bolt.Bucket) (layout, error) {
	n := 0
	err := st.ForEach(func(k, v []byte) error {
		n++
		if len(v) != 8 || !bytes.Equal(k, keyFormat) && !bytes.Equal(k, keyWALGen) && !bytes.Equal(k, keyOpen) {
			return fmt.Errorf("key %q with a %d-byte value is not one format %d wrote", k, len(v), formatUnframed)
		}
		return nil
	})
	if err == nil && n != 3 {
		err = fmt.Errorf("%d keys, where format %d wrote 3", n, formatUnframed)
	}
	if err != nil {
		return layout{}, fileCorruptf(d.name, "bucket store", "%v", err)
	}
	return layout{gen: getU64(st, keyWALGen), open: getU64(st, keyOpen) == 1}, nil
}

// recover replays the write-ahead log into the bbolt file and starts the
// log's next generation, in one bbolt transaction that also marks the
// file as open (its log may hold groups from now on).
func (d *DB) recover(db *bolt.DB) error {
	var lay layout
	if err := d.guard(func() error {
		return db.View(func(tx *bolt.Tx) (err error) {
			lay, err = d.readLayout(tx)
			return err
		})
	}); err != nil {
		return err
	}
	// A file not closed cleanly needs the log files that held its
	// generations.
	if lay.open {
		for _, p := range []string{walPath(d.path, lay.gen), walPath(d.path, lay.gen+1)} {
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				return &CorruptError{File: filepath.Base(p), Problem: "missing: the store file was not closed cleanly, and this write-ahead log may hold its last committed groups",
					Remedy: "restore it from the backup the store file came from; to open the file without those groups, create an empty file there"}
			}
		}
	}
	gen := lay.gen
	if !lay.open && !lay.fresh {
		// Closed cleanly: nothing in the log is needed. Its files may
		// hold anything (a backup of the file alone, say).
		gen = 0
	}
	log, st, err := openWAL(d.path, gen, len(d.buckets), d.opts.Hooks.syncer())
	if err != nil {
		return err
	}
	if gen == 0 {
		gen = lay.gen
	}
	if gen == 0 {
		gen = newGen()
	}
	// The replayed generations, gen and gen+1, are in the file once this
	// commits: the log starts over with gen+2, in the file that held gen.
	// A generation that never began is not skipped: the log starts over
	// with the first of them. A crash between this commit and the next
	// generation's start record leaves the files holding the generations
	// two before the ones the file then names, which Open reads as never
	// begun; skipping past them, one crash after another, would leave
	// files four and more behind, which no crash explains.
	next := gen + 2
	if lay.open {
		next = gen + uint64(st.started)
	}
	var seq uint64
	err = d.guard(func() error {
		return db.Update(func(tx *bolt.Tx) error {
			for _, name := range d.buckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return fmt.Errorf("create bucket %s: %w", name, d.mapErr(err))
				}
			}
			sums := lay.sums
			if sums == nil {
				// A file of an earlier format: its buckets are counted
				// now, and every one gets its sum.
				var err error
				if sums, err = d.countBuckets(tx); err != nil {
					return err
				}
			}
			w := d.newWriter(tx, sums, nil)
			w.seq = lay.seq
			for i, g := range st.groups {
				for _, e := range g {
					if err := w.apply(e); err != nil {
						return fmt.Errorf("replay write-ahead log group %d: %w", i, err)
					}
				}
			}
			seq = w.seq
			return w.finish(next, true)
		})
	})
	if err != nil {
		_ = log.close()
		return err
	}
	// The generation before next is in the file now: its start record
	// names none.
	if err := log.start(next, walEnd{}); err != nil {
		_ = log.close()
		return err
	}
	d.log = log
	d.seq = seq
	d.ov = newOverlay(next, len(d.buckets))
	d.recovery = Recovery{Groups: len(st.groups), Trimmed: st.trim, Converted: !lay.fresh && lay.sums == nil}
	return nil
}

// newGen returns the first generation of a new store's log. Generations
// start at a random number, so that records of another store's log
// never pass for this file's.
func newGen() uint64 { return rand.Uint64()>>2 + 1 }

// guard runs fn, turning a panic of bbolt's (it panics on some damaged
// pages, and faults on a page number past the file's end) into a
// *CorruptError.
func (d *DB) guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if v := recover(); v != nil {
			err = fileCorruptf(d.name, "", "a page cannot be read: %v", v)
		}
	}()
	return fn()
}

// countBuckets counts every bucket of the file but the store's own,
// checking its values' checksums, and writes their sums into the store's
// bucket.
func (d *DB) countBuckets(tx *bolt.Tx) (map[string]bucketSum, error) {
	st, err := tx.CreateBucketIfNotExists(bucketStore)
	if err != nil {
		return nil, err
	}
	sums := map[string]bucketSum{}
	err = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		if bytes.Equal(name, bucketStore) {
			return nil
		}
		s, err := sumBucket(name, b)
		if err != nil {
			return fileCorruptf(d.name, "", "%v", err)
		}
		sums[string(name)] = s
		return putFramed(st, sumsKey(name), s.bytes())
	})
	return sums, err
}

// Recovery returns what Open found in the log.
func (d *DB) Recovery() Recovery { return d.recovery }

// Close folds the write-ahead log into the bbolt file (a final
// checkpoint, which also marks the file closed cleanly) and closes both,
// waiting for writers, checkpoints and readers in progress. If the
// checkpoint fails, the log keeps its groups for the next Open. Later
// calls of every method return ErrClosed. Calling Close more than once is
// safe.
func (d *DB) Close() error {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.closed.Swap(true) {
		return nil
	}
	if d.opts.readOnly {
		return d.db.Close()
	}
	var errs []error
	if err := d.Err(); err != nil {
		errs = append(errs, fmt.Errorf("no final checkpoint (the write-ahead log keeps its groups for the next open): %w", err))
	} else if err := d.checkpointAll(false); err != nil {
		errs = append(errs, fmt.Errorf("final checkpoint (the write-ahead log keeps its groups for the next open): %w", err))
	}
	if d.log != nil {
		if err := d.log.close(); err != nil {
			errs = append(errs, fmt.Errorf("close write-ahead log: %w", err))
		}
	}
	if err := d.db.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// Closed reports whether Close has been called.
func (d *DB) Closed() bool { return d.closed.Load() }

// noteCorrupt counts err if it is corruption and makes the store refuse
// writes: a store that served one bad value must not build on it.
func (d *DB) noteCorrupt(err error) {
	if errors.Is(err, ErrCorrupt) {
		d.corruptions.Add(1)
		d.fail(err)
	}
}

// Corruptions returns how many times corrupt data was met while running
// (reads, Scrub).
func (d *DB) Corruptions() uint64 { return d.corruptions.Load() }

// CheckpointDue reports whether Checkpoint should run: the oldest group
// not yet in the bbolt file is Options.CheckpointInterval old, or the
// write-ahead log has grown by Options.CheckpointBytes, or a checkpoint
// failed before it committed; never while a checkpoint runs, or once the
// store has failed (Err).
func (d *DB) CheckpointDue() bool {
	if d.Err() != nil || d.checkpointing.Load() {
		return false
	}
	first := d.first.Load()
	return d.frozen.Load() != nil || first != 0 && (time.Duration(d.clock()-first) >= d.every || d.logSize.Load() >= d.maxLog)
}

// Err returns the error that makes the store refuse every write: a disk
// error (it wraps ErrFailed; Reopen clears it once the disk allows) or
// corruption (it wraps ErrCorrupt). It is nil while writes are taken.
func (d *DB) Err() error {
	if p := d.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail makes the store refuse writes with err, which wraps ErrFailed or
// ErrCorrupt. Corruption replaces a disk error, never the other way.
func (d *DB) fail(err error) {
	for {
		old := d.failed.Load()
		if old != nil && (errors.Is(*old, ErrCorrupt) || !errors.Is(err, ErrCorrupt)) {
			return
		}
		if d.failed.CompareAndSwap(old, &err) {
			return
		}
	}
}

// clock returns the monotonic nanoseconds since Open, at least 1: a wall
// clock stepped back must not hold checkpoints off.
func (d *DB) clock() int64 { return int64(time.Since(d.opened)) + 1 }

// CheckpointIn returns how long until CheckpointDue reports true by age
// alone; at least a millisecond.
func (d *DB) CheckpointIn() time.Duration {
	if d.checkpointing.Load() {
		return d.every
	}
	if d.frozen.Load() != nil {
		return time.Millisecond // a checkpoint failed before its commit
	}
	first := d.first.Load()
	if first == 0 {
		return d.every
	}
	return max(d.every-time.Duration(d.clock()-first), time.Millisecond)
}

// Pending reports whether groups wait in the write-ahead log for a
// checkpoint.
func (d *DB) Pending() bool { return d.first.Load() != 0 || d.frozen.Load() != nil }

// CheckpointLag returns how long the oldest group not yet in the bbolt
// file has been waiting for a checkpoint: from its log record until the
// checkpoint that writes it commits. It is zero exactly when Pending is
// false, so that zero also means that no checkpoint is writing the file.
// A lag well past Options.CheckpointInterval means checkpoints fail or
// stall.
func (d *DB) CheckpointLag() time.Duration {
	// first before frozen, the reverse of rotate's stores (frozen, then
	// first = 0): a checkpoint that rotates in between shows in frozen.
	first := d.first.Load()
	if d.frozen.Load() != nil {
		// A checkpoint is under way. Its generation may hold no group
		// (Close and Reopen checkpoint an empty one): pending even so.
		if ff := d.frozenFirst.Load(); ff != 0 {
			first = ff
		} else if first == 0 {
			return time.Nanosecond
		}
	}
	if first == 0 {
		return 0
	}
	return max(time.Duration(d.clock()-first), time.Nanosecond)
}

// Checkpoint writes the groups committed since the last checkpoint into
// the bbolt file, in one bbolt transaction (bbolt's two fdatasyncs), so
// that their log generation can be reused. Groups go on committing
// meanwhile, into the log's next generation; they wait only while it is
// started. Readers do not wait. On error the groups stay in the log, and
// the next Checkpoint writes them first. If the bbolt commit itself
// failed, the store has failed (ErrFailed) until Reopen.
func (d *DB) Checkpoint() error {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	d.checkpointing.Store(true)
	defer d.checkpointing.Store(false)
	if d.closed.Load() {
		return ErrClosed
	}
	if err := d.Err(); err != nil {
		return err
	}
	if d.frozen.Load() == nil {
		d.wmu.Lock()
		if d.first.Load() == 0 {
			d.wmu.Unlock()
			return nil
		}
		err := d.rotate()
		d.wmu.Unlock()
		if err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
	}
	return d.commitFrozen(true)
}

// checkpointNow checkpoints everything logged so far, for a writer whose
// log has grown too long. The caller holds wmu, so it cannot wait for a
// checkpoint under way (which may be waiting for wmu): it fails instead.
func (d *DB) checkpointNow() error {
	if !d.cmu.TryLock() {
		return errors.New("a checkpoint is under way")
	}
	defer d.cmu.Unlock()
	return d.checkpointAll(true)
}

// checkpointAll writes every logged group into the bbolt file and marks
// it open or closed cleanly. The caller holds cmu and wmu.
func (d *DB) checkpointAll(open bool) error {
	if d.frozen.Load() != nil {
		if err := d.commitFrozen(true); err != nil {
			return err
		}
	}
	if err := d.rotate(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return d.commitFrozen(open)
}

// rotate starts the log's next generation, in the other file, with a
// start record that names where the current one ends, and makes the
// current one's overlay frozen, for commitFrozen to write into the bbolt
// file. The caller holds cmu and wmu, and frozen is nil: the other
// file's generation is in the bbolt file.
func (d *DB) rotate() error {
	next := d.ov.gen + 1
	if err := d.log.start(next, d.log.end()); err != nil {
		if uerr := d.log.unstart(next); uerr != nil {
			// The start record may be on disk: a group appended to the
			// current generation would make it longer than the start
			// record says, which a recovery takes for damage.
			d.fail(fmt.Errorf("%w: %w, and it could not be erased: %w", ErrFailed, err, uerr))
			return d.Err()
		}
		return err
	}
	d.frozenFirst.Store(d.first.Load())
	d.omu.Lock()
	d.frozen.Store(d.ov)
	d.ov = newOverlay(next, len(d.buckets))
	d.omu.Unlock()
	d.first.Store(0)
	d.logSize.Store(0)
	return nil
}

// commitFrozen writes the frozen overlay into the bbolt file, naming the
// generation after it as the first the file lacks, and drops it. open
// false marks the file closed cleanly. The caller holds cmu.
func (d *DB) commitFrozen(open bool) error {
	fz := d.frozen.Load()
	// The scrubber waits: the writes change its running sum of the
	// bucket it is part way through.
	d.scrub.mu.Lock()
	defer d.scrub.mu.Unlock()
	tx, err := d.db.Begin(true)
	if err != nil {
		return fmt.Errorf("checkpoint: begin: %w", d.mapErr(err))
	}
	var w *writer
	err = d.guard(func() error {
		lay, err := d.readLayout(tx)
		if err != nil {
			return err
		}
		w = d.newWriter(tx, lay.sums, &d.scrub)
		w.seq = lay.seq
		if err := fz.writeTo(w); err != nil {
			return err
		}
		return w.finish(fz.gen+1, open)
	})
	if err != nil {
		_ = tx.Rollback()
		d.noteCorrupt(err)
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := d.guard(tx.Commit); err != nil {
		err = d.mapErr(err)
		// bbolt may have written the new meta page, naming the next
		// generation, before failing; and its free list now counts the
		// pages of that meta as free. Neither can be undone: a reopen
		// reads whichever meta is on disk and replays the log from
		// there.
		if errors.Is(err, ErrCorrupt) {
			// bbolt panicked part way: its lock is still held.
			_ = d.guard(tx.Rollback)
			d.noteCorrupt(err)
			return fmt.Errorf("checkpoint: %w", err)
		}
		d.fail(fmt.Errorf("%w: checkpoint: %w", ErrFailed, d.mapErr(err)))
		return d.Err()
	}
	w.committed()
	// Readers that began before this saw the old file and frozen, those
	// after see the new file; both hold the same state.
	d.omu.Lock()
	d.frozen.Store(nil)
	d.omu.Unlock()
	return nil
}

// Reopen recovers a store that a disk error has failed (Err wraps
// ErrFailed): it closes the files, opens them again and replays the log,
// as a restart of the process would. Writers, checkpoints and readers
// wait meanwhile. It returns nil at once if the store has not failed,
// and the corruption if that is why it failed: only an operator can
// repair that. On error the store stays failed, still answering readers
// from what it held, and Reopen may be called again.
func (d *DB) Reopen() error {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	if d.closed.Load() {
		return ErrClosed
	}
	err := d.Err()
	if err == nil || errors.Is(err, ErrCorrupt) {
		return err
	}
	// The scrubber starts its pass over: the file it was part way
	// through is read again from the log.
	d.scrub.mu.Lock()
	defer d.scrub.mu.Unlock()
	d.scrub.reset()
	d.omu.Lock()
	defer d.omu.Unlock()
	// Closing bbolt waits for Scans' read transactions to end.
	_ = d.log.close()
	_ = d.db.Close()
	db, err := d.openBolt()
	if err == nil {
		if err = d.recover(db); err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		// Keep answering readers from the old state: bbolt must be open
		// for that, read-only if it can be nothing else.
		if rdb, rerr := bolt.Open(d.path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second}); rerr == nil {
			d.db = rdb
		}
		if errors.Is(err, ErrCorrupt) {
			d.noteCorrupt(err)
		}
		return fmt.Errorf("reopen store: %w", err)
	}
	d.db = db
	d.dropResident()
	d.frozen.Store(nil)
	d.first.Store(0)
	d.logSize.Store(0)
	d.failed.Store(nil)
	return nil
}

// hooks returns the options' hooks, empty ones if none.
func (d *DB) hooks() *Hooks {
	if d.opts.Hooks == nil {
		return &Hooks{}
	}
	return d.opts.Hooks
}

// mapErr keeps bbolt's error values inside the package: its error for a
// closed file becomes ErrClosed, its others their message alone. Errors
// of the system's (ENOSPC, EIO) stay as they are, for errors.Is.
func (d *DB) mapErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("%w: %v", ErrClosed, err)
	}
	for _, be := range boltErrors {
		if errors.Is(err, be) {
			return errors.New(err.Error())
		}
	}
	return err
}

// boltErrors are bbolt's error values (go.etcd.io/bbolt/errors).
var boltErrors = []error{
	berrors.ErrInvalid, berrors.ErrInvalidMapping, berrors.ErrVersionMismatch, berrors.ErrChecksum,
	berrors.ErrTimeout, berrors.ErrTxNotWritable, berrors.ErrTxClosed, berrors.ErrDatabaseReadOnly,
	berrors.ErrFreePagesNotLoaded, berrors.ErrBucketNotFound, berrors.ErrBucketExists,
	berrors.ErrBucketNameRequired, berrors.ErrKeyRequired, berrors.ErrKeyTooLarge,
	berrors.ErrValueTooLarge, berrors.ErrMaxSizeReached, berrors.ErrIncompatibleValue,
	berrors.ErrSameBuckets, berrors.ErrDifferentDB,
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b *bolt.Bucket, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}
