package ledger

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"math/bits"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Defaults of Options.
const (
	// DefaultIdempotencyTTL is how long a record is kept when
	// Options.IdempotencyTTL is zero.
	DefaultIdempotencyTTL = 24 * time.Hour
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

var (
	bucketMeta     = []byte("meta")
	bucketAccounts = []byte("accounts")
	bucketReceipts = []byte("receipts")
	bucketIdem     = []byte("idem")
	bucketIdemExp  = []byte("idem_exp")

	keySeq    = []byte("seq")
	keyIssued = []byte("issued")
	keyBurned = []byte("burned")
	keyFormat = []byte("format")
	keyWALGen = []byte("wal_gen")
)

// appendFillPercent is how full the pages of the append-mostly buckets are
// split (bbolt's default is 0.5, for random inserts).
const appendFillPercent = 0.9

// File format versions, in meta "format". Version 2 added idempotency
// records that refer to their receipt (encodeRecord). Version 3 says that
// a write-ahead log may hold committed groups the bbolt file lacks, so
// that a binary without a log refuses the file rather than miss them;
// version 4 the same of a log in two files (wal.go), so that a binary
// that reads only the first refuses it too. Open sets 4 and a clean Close
// sets 1 or 2 again (2 once a record refers to a receipt), so a rollback
// to an older binary works after a clean shutdown. Versions 1 to 3 still
// read.
const (
	formatRefs = 2
	formatWAL  = 3
	formatLogs = 4
)

// Options configure Open. The zero Options is usable.
type Options struct {
	// IdempotencyTTL is how long an idempotency record is kept after its
	// commit; default DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration
	// LockTimeout bounds the wait for the file's lock, which another
	// process holding the file keeps; default DefaultLockTimeout.
	LockTimeout time.Duration
	// CheckpointInterval and CheckpointBytes say when CheckpointDue
	// reports true: once the oldest group not yet in the bbolt file is
	// this old, or the write-ahead log has grown by this many bytes.
	// Defaults DefaultCheckpointInterval and DefaultCheckpointBytes.
	CheckpointInterval time.Duration
	CheckpointBytes    int64
	// Render turns a recorded result into the response stored with its
	// idempotency record. It runs inside the committing transaction, so it
	// must be quick and must not call the Ledger. The default stores the
	// receipt's JSON with 200, or the error text with 422.
	Render func(Result) (status int, body []byte)
	// Now returns the current time; tests set it to move expiry. Default
	// time.Now.
	Now func() time.Time

	// openFile, if set, opens the bbolt file (tests: to make its writes
	// fail).
	openFile func(string, int, os.FileMode) (*os.File, error)
	// mmapSize, if set, replaces initialMmapSize (tests: to make a
	// checkpoint remap).
	mmapSize int
}

// Ledger is the wallet's bbolt file and its write-ahead log. It is safe
// for concurrent use: writers (Apply, Sweep) take turns, checkpoints take
// turns and run alongside writers, and lookups run alongside both. Create
// one with Open and call Close.
type Ledger struct {
	db     *bolt.DB
	ttl    time.Duration
	render func(Result) (int, []byte)
	now    func() time.Time
	every  time.Duration
	maxLog int64
	seq    atomic.Uint64 // highest committed receipt seq
	closed atomic.Bool
	// refs is set once a record refers to a receipt: Close then leaves
	// format 2 rather than 1.
	refs atomic.Bool

	// The locks are taken in the order cmu, wmu, omu.
	//
	// wmu serializes the writers and is held across the log's fdatasync:
	// each group must see the one before it. It guards log, first and
	// logSize's updates, and the contents of ov.
	wmu sync.Mutex
	log *wal
	// cmu serializes checkpoints (and Close). A checkpoint holds wmu only
	// to start the log's next generation (rotate), not while it writes
	// the bbolt file.
	cmu sync.Mutex
	// checkpointing is set while a Checkpoint runs, so that
	// CheckpointDue does not send a second caller to wait for it.
	checkpointing atomic.Bool
	// failed is set, for good, by a disk error after which the files'
	// state is not known (a checkpoint's bbolt commit, or a log record
	// that could be neither written nor erased); every writer then gets
	// it. Lookups still answer: what they see was acknowledged. Reopening
	// recovers from the log. Read anywhere (Err).
	failed atomic.Pointer[error]
	// Of the log's current generation: the first group's time (clock),
	// and the log's size, read by CheckpointDue without wmu.
	first   atomic.Int64
	logSize atomic.Int64
	opened  time.Time // for clock

	// omu guards the pointers ov and frozen and ov's contents: writers
	// extend ov, rotate moves it to frozen, a checkpoint drops frozen
	// once the bbolt file holds it, all exclusively. Readers hold it
	// shared while they take the pointers and begin their bbolt read
	// transaction, lookups also while they read, so that they see one
	// consistent state: the file, under frozen, under ov.
	omu sync.RWMutex
	// ov has the writes of the log's current generation; frozen those
	// of the generation before, while a checkpoint writes them into the
	// bbolt file (or after it failed to, until one succeeds), else nil.
	ov     *overlay
	frozen atomic.Pointer[overlay]
}

// Open opens or creates the ledger file at path, with its write-ahead log
// files at path + ".wal" and ".wal.1", and replays into the file the
// groups the log holds.
// If another process holds the file it fails after Options.LockTimeout
// instead of waiting for ever.
func Open(path string, opts Options) (*Ledger, error) {
	l := &Ledger{ttl: opts.IdempotencyTTL, render: opts.Render, now: opts.Now,
		every: opts.CheckpointInterval, maxLog: opts.CheckpointBytes, opened: time.Now()}
	if l.ttl <= 0 {
		l.ttl = DefaultIdempotencyTTL
	}
	if l.render == nil {
		l.render = defaultRender
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.every <= 0 {
		l.every = DefaultCheckpointInterval
	}
	if l.maxLog <= 0 {
		l.maxLog = DefaultCheckpointBytes
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: timeout,
		// The freelist is rebuilt by a scan at open instead of being
		// written by every bbolt commit (each checkpoint): fewer pages
		// per fdatasync.
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: cmp.Or(opts.mmapSize, initialMmapSize),
		OpenFile:        opts.openFile,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open ledger %s: %w for %v: another process (another wallet on the same data dir?) has it open", path, ErrLocked, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	if err := l.recover(db, path); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	l.db = db
	return l, nil
}

// recover replays the write-ahead log into the bbolt file and starts the
// log's next generation, in one bbolt transaction that also marks the
// file as having a log (format 4).
func (l *Ledger) recover(db *bolt.DB, path string) error {
	var gen, fmtv uint64
	if err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return nil
		}
		gen = getU64(meta, keyWALGen)
		switch v := meta.Get(keyFormat); {
		case v == nil:
		case len(v) == 8 && binary.BigEndian.Uint64(v) >= 1 && binary.BigEndian.Uint64(v) <= formatLogs:
			fmtv = binary.BigEndian.Uint64(v)
		default:
			return fmt.Errorf("file format %x is not one of 1 to %d", v, formatLogs)
		}
		return nil
	}); err != nil {
		return err
	}
	l.refs.Store(fmtv >= formatRefs)
	// A file not closed cleanly needs the log files that held its
	// generations: version 3 the first, version 4 both.
	var need []string
	switch fmtv {
	case formatWAL:
		need = []string{path + walSuffixes[0]}
	case formatLogs:
		need = []string{walPath(path, gen), walPath(path, gen+1)}
	}
	for _, p := range need {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: the file was not closed cleanly and its write-ahead log %s, which may hold its last committed groups, is missing: restore it; to open the file without them, create an empty file there", ErrLogMismatch, p)
		}
	}
	// For gen 0 (no log was ever used with this file) openWAL replays
	// nothing and clears log files another ledger left there.
	var groups [][]entry
	var err error
	if l.log, groups, err = openWAL(path, gen); err != nil {
		return err
	}
	if gen == 0 {
		// Generations start at a random number, so that records of
		// another ledger's log never pass for this file's.
		gen = rand.Uint64()>>2 + 1
	}
	// The replayed generations, gen and gen+1, are in the file once this
	// commits: the log starts over with gen+2, in the file that held gen.
	next := gen + 2
	var seq uint64
	err = db.Update(func(tx *bolt.Tx) error {
		if err := createBuckets(tx); err != nil {
			return err
		}
		for i, g := range groups {
			if err := applyEntries(tx, g); err != nil {
				return fmt.Errorf("replay write-ahead log record %d: %w", i, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyFormat, u64(formatLogs)); err != nil {
			return err
		}
		if err := meta.Put(keyWALGen, u64(next)); err != nil {
			return err
		}
		seq = getU64(meta, keySeq)
		return nil
	})
	if err != nil {
		_ = l.log.close()
		return err
	}
	l.log.reset(next)
	l.ov = newOverlay(next)
	l.seq.Store(seq)
	return nil
}

func createBuckets(tx *bolt.Tx) error {
	for _, name := range walBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	return nil
}

// applyEntries writes a group's entries into tx.
func applyEntries(tx *bolt.Tx, es []entry) error {
	for _, e := range es {
		if err := e.apply(tx); err != nil {
			return err
		}
	}
	return nil
}

// apply writes e into tx.
func (e entry) apply(tx *bolt.Tx) error {
	b := tx.Bucket(walBuckets[e.b])
	var err error
	if e.del {
		err = b.Delete(e.k)
	} else {
		err = b.Put(e.k, e.v)
	}
	if err != nil {
		return fmt.Errorf("%s %q: %w", walBuckets[e.b], e.k, err)
	}
	return nil
}

// Close folds the write-ahead log into the bbolt file (a final
// checkpoint, which also sets the file's format back to 1 or 2) and
// closes both, waiting for writers, checkpoints and lookups in progress.
// If the checkpoint fails, the log keeps its groups for the next Open.
// Later calls of every method return ErrClosed. Calling Close more than
// once is safe.
func (l *Ledger) Close() error {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed.Swap(true) {
		return nil
	}
	var errs []error
	final := uint64(1)
	if l.refs.Load() {
		final = formatRefs
	}
	if err := l.Err(); err != nil {
		errs = append(errs, fmt.Errorf("no final checkpoint (the write-ahead log keeps its groups for the next open): %w", err))
	} else if err := l.checkpointAll(final); err != nil {
		errs = append(errs, fmt.Errorf("final checkpoint (the write-ahead log keeps its groups for the next open): %w", err))
	}
	if err := l.log.close(); err != nil {
		errs = append(errs, fmt.Errorf("close write-ahead log: %w", err))
	}
	if err := l.db.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close ledger: %w", err)
	}
	return nil
}

// Closed reports whether Close has been called.
func (l *Ledger) Closed() bool { return l.closed.Load() }

// Seq returns the seq of the last committed receipt, 0 for none. Every
// receipt up to it is on disk and visible to lookups.
func (l *Ledger) Seq() uint64 { return l.seq.Load() }

// Apply commits ops as one group and returns one result per op, in order.
// The ops are applied one after another, each seeing what the earlier ones
// did; a refused op (Result.Err) changes nothing. All receipts share one
// CommittedAt. The group is committed when its record is in the
// write-ahead log and fdatasync has returned: one disk write for the
// whole group. A non-nil error means nothing was committed, and the same
// ops may be applied again. Apply cannot be interrupted once it has
// begun: ctx is checked before.
func (l *Ledger) Apply(ctx context.Context, ops []Op) ([]Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	results := make([]Result, len(ops))
	l.wmu.Lock()
	defer l.wmu.Unlock()
	s, err := l.write(func(s *txState) error {
		// A transfer writes its receipt, record, sweep entry and two
		// accounts; the group adds the totals.
		s.writes = make([]entry, 0, 5*len(ops)+3)
		for i := range ops {
			r, err := s.apply(&ops[i])
			if err != nil {
				return err
			}
			results[i] = r
		}
		return nil
	})
	if err != nil {
		// Results of a failed group must not leak out.
		return nil, fmt.Errorf("commit %d operations: %w", len(ops), err)
	}
	if s.refs {
		l.refs.Store(true)
	}
	l.seq.Store(s.seq)
	return results, nil
}

// write runs fn against the state after the last group, appends the
// writes it made to the write-ahead log as one record, and once that is
// on disk shows them to lookups. On error nothing of fn's writes is kept.
// The caller holds wmu.
func (l *Ledger) write(fn func(*txState) error) (*txState, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	if size := l.logSize.Load(); size >= logLimit*l.maxLog {
		// Checkpoints have been failing or nobody calls them (the
		// committer's are due at maxLog): one try here, then refuse
		// rather than grow the log and the overlay without bound.
		if err := l.checkpointNow(); err != nil {
			return nil, fmt.Errorf("write-ahead log holds %d bytes and checkpoints fail: %w", size, err)
		}
	}
	s, err := l.newTxState()
	if err != nil {
		return nil, l.mapErr(err)
	}
	err = func() error {
		// The read transaction ends before the log's fdatasync and the
		// wait for omu: a checkpoint whose commit grows bbolt's memory
		// map waits for every read transaction, and lookups that hold
		// omu shared wait for that remap, so a writer holding one there
		// would close a cycle. The writes hold no bbolt memory.
		defer s.close()
		if err := fn(s); err != nil {
			return err
		}
		return s.flush()
	}()
	if err == nil && len(s.writes) > 0 {
		var n int
		if n, err = l.log.append(s.writes); err == nil {
			l.logSize.Add(int64(n))
			l.first.CompareAndSwap(0, l.clock())
		} else if terr := l.log.erase(); terr != nil {
			// The record may be on disk, and a recovery would replay
			// it: nobody can be told the group did not happen.
			l.fail(fmt.Errorf("%w: write-ahead log record (%w) could not be erased after its write failed: %w", ErrOutcomeUnknown, err, terr))
			err = l.Err()
		}
	}
	if err != nil {
		return nil, l.mapErr(err)
	}
	if len(s.writes) > 0 {
		l.omu.Lock()
		l.ov.add(s.writes)
		l.omu.Unlock()
	}
	return s, nil
}

// CheckpointDue reports whether Checkpoint should run: the oldest group
// not yet in the bbolt file is Options.CheckpointInterval old, or the
// write-ahead log has grown by Options.CheckpointBytes, or a checkpoint
// failed before it committed; never while a checkpoint runs, or once the
// ledger has failed (Err).
func (l *Ledger) CheckpointDue() bool {
	if l.Err() != nil || l.checkpointing.Load() {
		return false
	}
	first := l.first.Load()
	return l.frozen.Load() != nil || first != 0 && (time.Duration(l.clock()-first) >= l.every || l.logSize.Load() >= l.maxLog)
}

// Err returns the error that made the ledger refuse every write until it
// is reopened (it wraps ErrFailed), or nil.
func (l *Ledger) Err() error {
	if p := l.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// fail makes the ledger refuse writes for good with err.
func (l *Ledger) fail(err error) {
	err = fmt.Errorf("%w: %w", ErrFailed, err)
	l.failed.CompareAndSwap(nil, &err)
}

// clock returns the monotonic nanoseconds since Open, at least 1: a wall
// clock stepped back must not hold checkpoints off.
func (l *Ledger) clock() int64 { return int64(time.Since(l.opened)) + 1 }

// CheckpointIn returns how long until CheckpointDue reports true by age
// alone; at least a millisecond.
func (l *Ledger) CheckpointIn() time.Duration {
	if l.checkpointing.Load() {
		return l.every
	}
	if l.frozen.Load() != nil {
		return time.Millisecond // a checkpoint failed before its commit
	}
	first := l.first.Load()
	if first == 0 {
		return l.every
	}
	return max(l.every-time.Duration(l.clock()-first), time.Millisecond)
}

// Pending reports whether groups wait in the write-ahead log for a
// checkpoint.
func (l *Ledger) Pending() bool { return l.first.Load() != 0 || l.frozen.Load() != nil }

// Checkpoint writes the groups committed since the last checkpoint into
// the bbolt file, in one bbolt transaction (bbolt's two fdatasyncs), so
// that their log generation can be reused. Groups go on committing
// meanwhile, into the log's next generation; they wait only while it is
// started. Lookups do not wait. On error the groups stay in the log, and
// the next Checkpoint writes them first. If the bbolt commit itself
// failed, the ledger has failed (ErrFailed).
func (l *Ledger) Checkpoint() error {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	l.checkpointing.Store(true)
	defer l.checkpointing.Store(false)
	if l.closed.Load() {
		return ErrClosed
	}
	if err := l.Err(); err != nil {
		return err
	}
	if l.frozen.Load() == nil {
		l.wmu.Lock()
		if l.first.Load() == 0 {
			l.wmu.Unlock()
			return nil
		}
		l.rotate()
		l.wmu.Unlock()
	}
	return l.commitFrozen(formatLogs)
}

// checkpointNow checkpoints everything logged so far, for a writer whose
// log has grown too long. The caller holds wmu, so it cannot wait for a
// checkpoint under way (which may be waiting for wmu): it fails instead.
func (l *Ledger) checkpointNow() error {
	if !l.cmu.TryLock() {
		return errors.New("a checkpoint is under way")
	}
	defer l.cmu.Unlock()
	return l.checkpointAll(formatLogs)
}

// checkpointAll writes every logged group into the bbolt file and sets
// its format. The caller holds cmu and wmu.
func (l *Ledger) checkpointAll(format uint64) error {
	if l.frozen.Load() != nil {
		if err := l.commitFrozen(formatLogs); err != nil {
			return err
		}
	}
	l.rotate()
	return l.commitFrozen(format)
}

// rotate starts the log's next generation, in the other file, and makes
// the current one's overlay frozen, for commitFrozen to write into the
// bbolt file. The caller holds cmu and wmu, and frozen is nil: the other
// file's generation is in the bbolt file.
func (l *Ledger) rotate() {
	next := l.ov.gen + 1
	l.log.reset(next)
	l.omu.Lock()
	l.frozen.Store(l.ov)
	l.ov = newOverlay(next)
	l.omu.Unlock()
	l.first.Store(0)
	l.logSize.Store(0)
}

// commitFrozen writes the frozen overlay into the bbolt file, naming the
// generation after it as the first the file lacks, with meta "format"
// set to format, and drops it. The caller holds cmu.
func (l *Ledger) commitFrozen(format uint64) error {
	fz := l.frozen.Load()
	tx, err := l.db.Begin(true)
	if err != nil {
		return fmt.Errorf("checkpoint: begin: %w", l.mapErr(err))
	}
	err = fz.writeTo(tx)
	if err == nil {
		meta := tx.Bucket(bucketMeta)
		if err = meta.Put(keyFormat, u64(format)); err == nil {
			err = meta.Put(keyWALGen, u64(fz.gen+1))
		}
	}
	if err != nil {
		_ = tx.Rollback()
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := tx.Commit(); err != nil {
		// bbolt may have written the new meta page, naming the next
		// generation, before failing; and its free list now counts the
		// pages of that meta as free. Neither can be undone: a reopen
		// reads whichever meta is on disk and replays the log from
		// there.
		l.fail(fmt.Errorf("checkpoint: %w", l.mapErr(err)))
		return l.Err()
	}
	// Lookups that began before this saw the old file and frozen, those
	// after see the new file; both hold the same state.
	l.omu.Lock()
	l.frozen.Store(nil)
	l.omu.Unlock()
	return nil
}

// Account returns the state of account id and the seq the read saw.
func (l *Ledger) Account(id string) (Account, uint64, error) {
	a := Account{ID: id}
	var seq uint64
	err := l.view(func(r reader) error {
		seq = getU64(r.bucket(bMeta), keySeq)
		if v := r.bucket(bAccounts).Get([]byte(id)); v != nil {
			a.Balance, a.Nonce = decodeAccount(v)
		}
		return nil
	})
	return a, seq, err
}

// Supply returns the totals and the seq the read saw.
func (l *Ledger) Supply() (Supply, uint64, error) {
	var s Supply
	var seq uint64
	err := l.view(func(r reader) error {
		meta := r.bucket(bMeta)
		s = Supply{Issued: getU64(meta, keyIssued), Burned: getU64(meta, keyBurned)}
		seq = getU64(meta, keySeq)
		return nil
	})
	return s, seq, err
}

// Receipt returns the receipt with transaction id txID, or ErrNotFound.
func (l *Ledger) Receipt(txID string) (Receipt, error) {
	var rc Receipt
	seq, ok := ParseTxID(txID)
	if !ok {
		return rc, ErrNotFound
	}
	err := l.view(func(r reader) error {
		v := r.bucket(bReceipts).Get(u64(seq))
		if v == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(v, &rc); err != nil {
			return fmt.Errorf("decode receipt %d: %w", seq, err)
		}
		return nil
	})
	return rc, err
}

// Receipts returns up to limit receipts with seqs after after, in seq
// order.
func (l *Ledger) Receipts(after uint64, limit int) ([]Receipt, error) {
	var out []Receipt
	err := l.longView([]int{bReceipts}, func(r reader) error {
		// Seqs have no gaps: every seq up to the last has its receipt.
		receipts := r.bucket(bReceipts)
		for seq := after + 1; seq > after && len(out) < limit; seq++ {
			v := receipts.Get(u64(seq))
			if v == nil {
				break
			}
			var rc Receipt
			if err := json.Unmarshal(v, &rc); err != nil {
				return fmt.Errorf("decode receipt %d: %w", seq, err)
			}
			out = append(out, rc)
		}
		return nil
	})
	return out, err
}

// Idempotency returns the unexpired record stored under key, if any.
func (l *Ledger) Idempotency(key string) (Record, bool, error) {
	var rec Record
	var ok bool
	now := l.now()
	err := l.view(func(r reader) error {
		v := r.bucket(bIdem).Get([]byte(key))
		if v == nil {
			return nil
		}
		rc, err := decodeRecord(v, r.bucket(bReceipts))
		if err != nil {
			return fmt.Errorf("idempotency record %q: %w", key, err)
		}
		if rc.Expires.After(now) {
			rec, ok = rc, true
		}
		return nil
	})
	return rec, ok, err
}

// Sweep deletes up to limit expired idempotency records, oldest first, as
// one group, and returns how many it deleted. Expired records are already
// ignored by lookups; sweeping only reclaims their space.
func (l *Ledger) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now := uint64(l.now().UnixNano())
	n := 0
	limit = max(limit, 0)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.write(func(s *txState) error {
		expired := s.expired(now, limit)
		for _, k := range expired {
			if err := s.del(bIdemExp, k); err != nil {
				return err
			}
			if err := s.del(bIdem, k[8:]); err != nil {
				return err
			}
		}
		n = len(expired)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep idempotency records: %w", err)
	}
	return n, nil
}

// expired returns the keys of the sweep index that expire at now or
// before, up to limit of them, oldest first: those of the overlays, and
// those of the bbolt file the overlays neither delete nor hold.
func (s *txState) expired(now uint64, limit int) [][]byte {
	due := func(k string) bool { return len(k) >= 8 && binary.BigEndian.Uint64([]byte(k[:8])) <= now }
	var keys []string
	seen := map[string]bool{}
	for _, o := range s.ov {
		if o == nil {
			continue
		}
		for k, x := range o.m[bIdemExp] {
			if seen[k] {
				continue
			}
			seen[k] = true
			if !x.del && due(k) {
				keys = append(keys, k)
			}
		}
	}
	c := s.b[bIdemExp].Cursor()
	n := 0 // keys taken from the file
	for k, _ := c.First(); k != nil && n < limit; k, _ = c.Next() {
		if !due(string(k)) {
			break
		}
		if !seen[string(k)] {
			keys = append(keys, string(k))
			n++
		}
	}
	slices.Sort(keys)
	keys = keys[:min(len(keys), limit)]
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = []byte(k)
	}
	return out
}

// Audit scans the whole ledger and returns its totals, so that callers
// can check supply = issued − burned = the sum of balances. It is O(size
// of the ledger): for tests and operators' checks, not for requests.
func (l *Ledger) Audit() (Audit, error) {
	var a Audit
	err := l.longView([]int{bMeta, bAccounts, bReceipts}, func(r reader) error {
		meta := r.bucket(bMeta)
		a.Issued, a.Burned, a.Seq = getU64(meta, keyIssued), getU64(meta, keyBurned), getU64(meta, keySeq)
		add := func(v []byte) {
			bal, _ := decodeAccount(v)
			var carry uint64
			a.Balances, carry = bits.Add64(a.Balances, bal, 0)
			a.Overflow = a.Overflow || carry != 0
			a.Accounts++
		}
		// longView merged the overlays into o[0].
		accounts := r.bucket(bAccounts)
		if err := accounts.b.ForEach(func(k, v []byte) error {
			if _, ok := accounts.o[0][string(k)]; !ok {
				add(v)
			}
			return nil
		}); err != nil {
			return err
		}
		for _, x := range accounts.o[0] {
			if !x.del {
				add(x.v)
			}
		}
		receipts := r.bucket(bReceipts)
		a.Receipts = receipts.b.Stats().KeyN
		for k := range receipts.o[0] {
			if receipts.b.Get([]byte(k)) == nil {
				a.Receipts++
			}
		}
		return nil
	})
	return a, err
}

// view runs fn in a bbolt read transaction under the overlays of the
// groups not yet checkpointed: the state after the last committed group.
// It holds omu shared throughout, which a writer adding a group waits
// for, and readers behind that writer too: fn must be a few lookups.
func (l *Ledger) view(fn func(reader) error) error {
	if l.closed.Load() {
		return ErrClosed
	}
	l.omu.RLock()
	defer l.omu.RUnlock()
	ovs := [2]*overlay{l.ov, l.frozen.Load()}
	return l.mapErr(l.db.View(func(tx *bolt.Tx) error { return fn(reader{tx: tx, ov: ovs}) }))
}

// longView is view for scans: it holds omu only while it begins the read
// transaction and copies the overlays' buckets fn reads into one (the
// others are left empty), then runs fn on that snapshot.
func (l *Ledger) longView(buckets []int, fn func(reader) error) error {
	if l.closed.Load() {
		return ErrClosed
	}
	l.omu.RLock()
	tx, err := l.db.Begin(false)
	ov := newOverlay(0)
	if err == nil {
		fz := l.frozen.Load()
		for _, b := range buckets {
			m := map[string]ovValue{}
			if fz != nil {
				m = maps.Clone(fz.m[b])
			}
			maps.Copy(m, l.ov.m[b])
			ov.m[b] = m
		}
	}
	l.omu.RUnlock()
	if err != nil {
		return l.mapErr(err)
	}
	defer func() { _ = tx.Rollback() }()
	return l.mapErr(fn(reader{tx: tx, ov: [2]*overlay{ov}}))
}

func (l *Ledger) mapErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// reader is a lookup's view: a bbolt read transaction under up to two
// overlays, the newer first.
type reader struct {
	tx *bolt.Tx
	ov [2]*overlay
}

func (r reader) bucket(b int) merged {
	m := merged{b: r.tx.Bucket(walBuckets[b])}
	for i, o := range r.ov {
		if o != nil {
			m.o[i] = o.m[b]
		}
	}
	return m
}

// getter reads a bucket.
type getter interface{ Get(k []byte) []byte }

// merged reads a bbolt bucket through the overlays' writes to it, the
// newer (o[0]) first.
type merged struct {
	b *bolt.Bucket
	o [2]map[string]ovValue
}

func (m merged) Get(k []byte) []byte {
	for _, o := range m.o {
		if x, ok := o[string(k)]; ok {
			return x.value()
		}
	}
	return m.b.Get(k)
}

// overlay is the writes of one log generation's groups, the last write of
// each key: what lookups add to the bbolt file until a checkpoint has
// written them into it.
type overlay struct {
	gen uint64
	m   [numBuckets]map[string]ovValue
}

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

func newOverlay(gen uint64) *overlay {
	o := &overlay{gen: gen}
	for i := range o.m {
		o.m[i] = map[string]ovValue{}
	}
	return o
}

func (o *overlay) add(es []entry) {
	for _, e := range es {
		o.m[e.b][string(e.k)] = ovValue{v: e.v, del: e.del}
	}
}

// writeTo writes the overlay into tx, each bucket's keys in order: bbolt
// inserts sorted keys fastest, and a key that many groups wrote (an
// account, the totals) costs one Put.
func (o *overlay) writeTo(tx *bolt.Tx) error {
	for b, m := range o.m {
		bk := tx.Bucket(walBuckets[b])
		if b == bReceipts || b == bIdemExp {
			// Appended in seq and expiry order: their pages can be
			// split nearly full instead of half, fewer pages to write.
			bk.FillPercent = appendFillPercent
		}
		keys := slices.Sorted(maps.Keys(m))
		for _, k := range keys {
			x := m[k]
			if err := (entry{b: b, del: x.del, k: []byte(k), v: x.v}).apply(tx); err != nil {
				return err
			}
		}
	}
	return nil
}

// txState applies operations of one group and keeps the writes they
// make, for the write-ahead log. It reads the state after the last group:
// a bbolt read transaction (the last checkpoint) under the frozen and the
// current overlay, and, for the buckets a group reads back (records and
// the receipts they refer to), under the group's own writes. Accounts are
// read once, changed in memory and written once by flush, so an account
// that several operations of a group touch costs one write.
type txState struct {
	l      *Ledger
	now    time.Time
	tx     *bolt.Tx
	b      [numBuckets]*bolt.Bucket
	ov     [2]*overlay                    // current, frozen
	local  [numBuckets]map[string]ovValue // this group's writes, for readBack buckets
	writes []entry

	seq, issued, burned uint64
	// The totals as the group found them, so that flush writes only
	// what changed.
	seq0, issued0, burned0 uint64
	cache                  map[string]*acct
	// refs is set when a record of the group refers to its receipt.
	refs bool
}

// readBack are the buckets a group may read after writing them: an
// operation's key may repeat in its group, and its record refers to a
// receipt of the group.
var readBack = [numBuckets]bool{bIdem: true, bReceipts: true}

type acct struct {
	balance, nonce uint64
	dirty          bool
}

// newTxState begins a group. The caller holds wmu, so ov is stable; the
// frozen overlay and the read transaction are taken together under omu,
// so that they show one state whether or not a checkpoint commits
// meanwhile.
func (l *Ledger) newTxState() (*txState, error) {
	l.omu.RLock()
	fz := l.frozen.Load()
	tx, err := l.db.Begin(false)
	l.omu.RUnlock()
	if err != nil {
		return nil, fmt.Errorf("begin read transaction: %w", err)
	}
	s := &txState{l: l, now: l.now().UTC(), tx: tx, ov: [2]*overlay{l.ov, fz}, cache: map[string]*acct{}}
	for i, name := range walBuckets {
		s.b[i] = tx.Bucket(name)
	}
	s.seq, s.issued, s.burned = getU64(s.bucket(bMeta), keySeq), getU64(s.bucket(bMeta), keyIssued), getU64(s.bucket(bMeta), keyBurned)
	s.seq0, s.issued0, s.burned0 = s.seq, s.issued, s.burned
	return s, nil
}

// close ends the group's read transaction.
func (s *txState) close() { _ = s.tx.Rollback() }

// get returns the value of k in bucket b as the group sees it, nil if
// there is none. It is valid until close.
func (s *txState) get(b int, k []byte) []byte {
	if x, ok := s.local[b][string(k)]; ok {
		return x.value()
	}
	for _, o := range s.ov {
		if o == nil {
			continue
		}
		if x, ok := o.m[b][string(k)]; ok {
			return x.value()
		}
	}
	return s.b[b].Get(k)
}

// bucket returns a getter of bucket b as the group sees it.
func (s *txState) bucket(b int) getter { return groupBucket{s, b} }

type groupBucket struct {
	s *txState
	b int
}

func (g groupBucket) Get(k []byte) []byte { return g.s.get(g.b, k) }

// put writes v under k in bucket b. The overlay keeps k and v once the
// group is logged, so neither may be reused. It refuses what bbolt
// would: a checkpoint must not meet a write it cannot make.
func (s *txState) put(b int, k, v []byte) error {
	switch {
	case len(k) == 0:
		return berrors.ErrKeyRequired
	case len(k) > bolt.MaxKeySize:
		return berrors.ErrKeyTooLarge
	case int64(len(v)) > bolt.MaxValueSize:
		return berrors.ErrValueTooLarge
	}
	if v == nil {
		v = []byte{}
	}
	s.write(entry{b: b, k: k, v: v})
	return nil
}

// del deletes k from bucket b.
func (s *txState) del(b int, k []byte) error {
	if len(k) == 0 {
		return berrors.ErrKeyRequired
	}
	s.write(entry{b: b, del: true, k: k})
	return nil
}

func (s *txState) write(e entry) {
	s.writes = append(s.writes, e)
	if readBack[e.b] {
		if s.local[e.b] == nil {
			s.local[e.b] = map[string]ovValue{}
		}
		s.local[e.b][string(e.k)] = ovValue{v: e.v, del: e.del}
	}
}

func (s *txState) account(id string) *acct {
	if a, ok := s.cache[id]; ok {
		return a
	}
	a := &acct{}
	if v := s.get(bAccounts, []byte(id)); v != nil {
		a.balance, a.nonce = decodeAccount(v)
	}
	s.cache[id] = a
	return a
}

// apply applies one operation. A returned error aborts the whole
// group (bbolt failed); a refusal is in the Result.
func (s *txState) apply(op *Op) (Result, error) {
	var old []byte // an expired record under op's key
	if op.Idem != nil {
		if v := s.get(bIdem, []byte(op.Idem.Key)); v != nil {
			old = v
			rec, err := decodeRecord(v, s.bucket(bReceipts))
			if err != nil {
				return Result{}, fmt.Errorf("idempotency record %q: %w", op.Idem.Key, err)
			}
			if rec.Expires.After(s.now) {
				return Result{Record: &rec, Replayed: true}, nil
			}
		}
	}
	res := Result{Err: s.check(op)}
	if res.Err == nil {
		res.Receipt = s.commit(op)
		res.ReceiptJSON = res.Receipt.AppendJSON(make([]byte, 0, 256))
		if err := s.put(bReceipts, u64(res.Receipt.Seq), res.ReceiptJSON); err != nil {
			return Result{}, err
		}
	}
	if op.Idem != nil && Recorded(res.Err) {
		rec, err := s.record(op.Idem, old, res)
		if err != nil {
			return Result{}, err
		}
		res.Record = rec
	}
	return res, nil
}

// check decides whether op can commit against the current state.
func (s *txState) check(op *Op) error {
	if err := shape(op); err != nil {
		return err
	}
	if op.Kind == KindIssue {
		if _, carry := bits.Add64(s.issued, op.Amount, 0); carry != 0 {
			return ErrSupplyOverflow
		}
		return nil
	}
	from := s.account(op.From)
	if from.nonce == math.MaxUint64 || op.Nonce != from.nonce+1 {
		return &NonceError{Account: op.From, Got: op.Nonce, Expected: from.nonce + 1}
	}
	need := op.Amount
	if op.Kind == KindBatch {
		need, _ = legSum(op.Legs) // shape checked the overflow
	}
	if from.balance < need {
		return &InsufficientFundsError{Account: op.From, Balance: from.balance, Needed: need}
	}
	return nil
}

// shape refuses what the API layer should have refused already.
func shape(op *Op) error {
	switch op.Kind {
	case KindIssue:
		if op.To == "" || op.Amount == 0 {
			return fmt.Errorf("%w: issue needs an account and a positive amount", ErrInvalid)
		}
	case KindTransfer:
		if op.From == "" || op.To == "" || op.From == op.To || op.Amount == 0 {
			return fmt.Errorf("%w: transfer needs two distinct accounts and a positive amount", ErrInvalid)
		}
	case KindBurn:
		if op.From == "" || op.Amount == 0 {
			return fmt.Errorf("%w: burn needs an account and a positive amount", ErrInvalid)
		}
	case KindBatch:
		if op.From == "" || len(op.Legs) == 0 {
			return fmt.Errorf("%w: batch needs an account and at least one leg", ErrInvalid)
		}
		for _, l := range op.Legs {
			if l.To == "" || l.To == op.From || l.Amount == 0 {
				return fmt.Errorf("%w: every leg needs another account and a positive amount", ErrInvalid)
			}
		}
		if _, ok := legSum(op.Legs); !ok {
			return fmt.Errorf("%w: the legs' amounts overflow", ErrInvalid)
		}
	default:
		return fmt.Errorf("%w: unknown kind %v", ErrInvalid, op.Kind)
	}
	return nil
}

// legSum returns the total of legs and false if it overflows a uint64.
func legSum(legs []Leg) (uint64, bool) {
	var sum, carry uint64
	for _, l := range legs {
		sum, carry = bits.Add64(sum, l.Amount, 0)
		if carry != 0 {
			return 0, false
		}
	}
	return sum, true
}

// commit applies a checked op and returns its receipt. No balance can
// overflow: every balance is at most the supply, which is at most issued.
func (s *txState) commit(op *Op) *Receipt {
	s.seq++
	r := &Receipt{
		TxID:        TxID(s.seq),
		Kind:        op.Kind.String(),
		From:        op.From,
		Amount:      op.Amount,
		Seq:         s.seq,
		CommittedAt: s.now,
	}
	if op.Kind.debits() {
		r.Nonce = op.Nonce
	}
	switch op.Kind {
	case KindIssue:
		r.From = ""
		r.To = op.To
		to := s.account(op.To)
		to.balance += op.Amount
		to.dirty = true
		s.issued += op.Amount
	case KindTransfer:
		r.To = op.To
		s.debit(op.From, op.Amount)
		to := s.account(op.To)
		to.balance += op.Amount
		to.dirty = true
	case KindBurn:
		s.debit(op.From, op.Amount)
		s.burned += op.Amount
	case KindBatch:
		total, _ := legSum(op.Legs)
		r.Amount = total
		r.Legs = append([]Leg(nil), op.Legs...)
		s.debit(op.From, total)
		for _, l := range op.Legs {
			to := s.account(l.To)
			to.balance += l.Amount
			to.dirty = true
		}
	}
	return r
}

func (s *txState) debit(id string, amount uint64) {
	a := s.account(id)
	a.balance -= amount
	a.nonce++
	a.dirty = true
}

// record stores the outcome of op under its key, replacing old, an
// expired record if not nil, and its sweep index entry.
func (s *txState) record(idem *Idem, old []byte, res Result) (*Record, error) {
	key := []byte(idem.Key)
	if len(old) >= 8 {
		if err := s.del(bIdemExp, expKey(binary.BigEndian.Uint64(old[:8]), key)); err != nil {
			return nil, err
		}
	}
	status, body := s.l.render(res)
	rec := &Record{Fingerprint: idem.Fingerprint, Status: status, Body: body, Expires: s.now.Add(s.l.ttl)}
	var seq uint64
	if res.Receipt != nil {
		seq = res.Receipt.Seq
	}
	v, ref, err := encodeRecord(rec, res.ReceiptJSON, seq)
	if err != nil {
		return nil, err
	}
	s.refs = s.refs || ref
	if err := s.put(bIdem, key, v); err != nil {
		return nil, err
	}
	if err := s.put(bIdemExp, expKey(uint64(rec.Expires.UnixNano()), key), nil); err != nil {
		return nil, err
	}
	return rec, nil
}

// flush writes the changed accounts and totals.
func (s *txState) flush() error {
	ids := make([]string, 0, len(s.cache))
	for id, a := range s.cache {
		if a.dirty {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // bbolt inserts sorted keys fastest
	for _, id := range ids {
		a := s.cache[id]
		if err := s.put(bAccounts, []byte(id), encodeAccount(a.balance, a.nonce)); err != nil {
			return err
		}
	}
	for _, kv := range []struct {
		k         []byte
		v, before uint64
	}{{keySeq, s.seq, s.seq0}, {keyIssued, s.issued, s.issued0}, {keyBurned, s.burned, s.burned0}} {
		if kv.v == kv.before {
			continue
		}
		if err := s.put(bMeta, kv.k, u64(kv.v)); err != nil {
			return err
		}
	}
	return nil
}

func defaultRender(r Result) (int, []byte) {
	if r.Err != nil {
		b, _ := json.Marshal(map[string]string{"error": r.Err.Error()})
		return 422, b
	}
	if r.ReceiptJSON == nil {
		return 200, r.Receipt.AppendJSON(nil)
	}
	return 200, bytes.Clone(r.ReceiptJSON)
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b getter, k []byte) uint64 {
	v := b.Get(k)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func encodeAccount(balance, nonce uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, balance)
	binary.BigEndian.PutUint64(b[8:], nonce)
	return b
}

func decodeAccount(v []byte) (balance, nonce uint64) {
	if len(v) != 16 {
		return 0, 0
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:])
}

func expKey(expires uint64, key []byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(key)), expires), key...)
}

// An idempotency record is stored as its expiry (8 bytes, Unix
// nanoseconds), the request's fingerprint (32), the status (2) and then
// either the body, or, when the status has recordRef set, the seq of a
// receipt (8) whose stored bytes begin the body, their CRC-32C (4), and
// the rest of the body. A committed operation's response is its receipt:
// referring to it keeps the record a third of the size. Receipts are
// never rewritten or deleted; the checksum turns a receipt that changed
// anyway into an error rather than a different replay. Records from
// before the reference existed have the body whole, and still decode.
const (
	recordHeader = 42
	recordRef    = 0x8000 // in the status: the body starts with a receipt
	refBytes     = 8 + 4  // the receipt's seq and checksum
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeRecord encodes r. When the body begins with receipt, the receipt
// stored under seq, the record refers to it instead of holding a copy.
func encodeRecord(r *Record, receipt []byte, seq uint64) ([]byte, bool, error) {
	if r.Status < 0 || r.Status >= recordRef {
		return nil, false, fmt.Errorf("record status %d out of range", r.Status)
	}
	ref := len(receipt) > 0 && bytes.HasPrefix(r.Body, receipt)
	size := recordHeader + len(r.Body)
	if ref {
		size = recordHeader + refBytes + len(r.Body) - len(receipt)
	}
	b := make([]byte, 0, size)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Expires.UnixNano()))
	b = append(b, r.Fingerprint[:]...)
	if !ref {
		b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
		return append(b, r.Body...), false, nil
	}
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status)|recordRef)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(receipt, castagnoli))
	return append(b, r.Body[len(receipt):]...), true, nil
}

// decodeRecord decodes v, reading a receipt it refers to from receipts.
// It copies what it keeps: bbolt owns v only for the transaction.
func decodeRecord(v []byte, receipts getter) (Record, error) {
	if len(v) < recordHeader {
		return Record{}, fmt.Errorf("%d bytes is too short", len(v))
	}
	var r Record
	r.Expires = time.Unix(0, int64(binary.BigEndian.Uint64(v))).UTC()
	copy(r.Fingerprint[:], v[8:40])
	status := binary.BigEndian.Uint16(v[40:recordHeader])
	r.Status = int(status &^ recordRef)
	rest := v[recordHeader:]
	if status&recordRef == 0 {
		r.Body = bytes.Clone(rest)
		return r, nil
	}
	if len(rest) < refBytes {
		return Record{}, fmt.Errorf("%d bytes is too short for a receipt reference", len(v))
	}
	seq := binary.BigEndian.Uint64(rest)
	receipt := receipts.Get(rest[:8])
	if receipt == nil {
		return Record{}, fmt.Errorf("refers to receipt %d, which is missing", seq)
	}
	if crc32.Checksum(receipt, castagnoli) != binary.BigEndian.Uint32(rest[8:refBytes]) {
		return Record{}, fmt.Errorf("refers to receipt %d, which has changed since", seq)
	}
	r.Body = make([]byte, 0, len(receipt)+len(rest)-refBytes)
	r.Body = append(append(r.Body, receipt...), rest[refBytes:]...)
	return r, nil
}
