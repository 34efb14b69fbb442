package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// Defaults of Options.
const (
	// DefaultIdempotencyTTL is how long a record is kept when
	// Options.IdempotencyTTL is zero.
	DefaultIdempotencyTTL = 24 * time.Hour
	// DefaultLockTimeout is how long Open waits for the file lock when
	// Options.LockTimeout is zero.
	DefaultLockTimeout = store.DefaultLockTimeout
	// DefaultCheckpointInterval is Options.CheckpointInterval's default.
	DefaultCheckpointInterval = store.DefaultCheckpointInterval
	// DefaultCheckpointBytes is Options.CheckpointBytes' default.
	DefaultCheckpointBytes = store.DefaultCheckpointBytes
)

// The ledger's buckets, by their numbers in the store.
const (
	bMeta = iota
	bAccounts
	bReceipts
	bIdem
	bIdemExp
)

// buckets are the ledger's buckets in the store, in the order of their
// numbers, which the store's log records: append only.
var buckets = []store.Bucket{
	{Name: "meta"},
	{Name: "accounts"},
	{Name: "receipts", Sequential: true},
	{Name: "idem"},
	{Name: "idem_exp", Sequential: true},
}

var (
	keySeq    = []byte("seq")
	keyIssued = []byte("issued")
	keyBurned = []byte("burned")
	keyProbed = []byte("probed") // the time of the last Probe
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
	// Hooks are the store's fault-injection points, for tests and fault
	// drills; nil otherwise.
	Hooks *store.Hooks
}

// Ledger is the wallet's state in a store (package sdk/store): a bbolt
// file and its write-ahead log. It is safe for concurrent use: writers
// (Apply, Sweep) take turns, checkpoints run alongside them, and lookups
// alongside both. Create one with Open and call Close.
type Ledger struct {
	db     *store.DB
	ttl    time.Duration
	render func(Result) (int, []byte)
	now    func() time.Time
	seq    atomic.Uint64 // highest committed receipt seq
	hooks  *store.Hooks
	// converted says Open converted the files of the release before
	// the store.
	converted bool
	// wmu makes a group's commit and its seq's publication one step.
	wmu sync.Mutex
}

// Open opens or creates the ledger file at path, with its write-ahead log
// files at path + ".wal" and ".wal.1", replays into the file the groups
// the log holds, and checks the ledger's invariants (supply = issued −
// burned = the sum of balances; the last receipt is there) in
// O(accounts). Files of the wallet's release before the store (the
// ledger's formats 1 to 4) are converted into a store first, in one
// step that a crash leaves undone or done (Converted). Damaged files, or broken invariants, fail it with an
// error wrapping ErrCorrupt (a *store.CorruptError).
// If another process holds the file it fails after Options.LockTimeout
// instead of waiting for ever.
func Open(path string, opts Options) (*Ledger, error) {
	l := &Ledger{ttl: opts.IdempotencyTTL, render: opts.Render, now: opts.Now, hooks: opts.Hooks}
	if l.hooks == nil {
		l.hooks = &store.Hooks{}
	}
	if l.ttl <= 0 {
		l.ttl = DefaultIdempotencyTTL
	}
	if l.render == nil {
		l.render = defaultRender
	}
	if l.now == nil {
		l.now = time.Now
	}
	sopts := store.Options{
		Buckets:            buckets,
		LockTimeout:        opts.LockTimeout,
		CheckpointInterval: opts.CheckpointInterval,
		CheckpointBytes:    opts.CheckpointBytes,
		Hooks:              l.hooks,
	}
	db, err := store.Open(path, sopts)
	if errors.Is(err, store.ErrNotStore) {
		// The release before the store wrote it, or it is no ledger.
		if l.converted, err = convert(path, sopts); err == nil {
			db, err = store.Open(path, sopts)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l.db = db
	seq, err := l.verify()
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	l.seq.Store(seq)
	return l, nil
}

// verify checks the invariants that cost O(accounts) and returns the last
// receipt's seq.
func (l *Ledger) verify() (uint64, error) {
	var seq uint64
	err := l.db.Scan(func(s *store.Snapshot) (err error) {
		seq, err = verifySnapshot(s)
		return err
	})
	return seq, err
}

// verifySnapshot checks the invariants of the state s shows and returns
// its last receipt's seq.
func verifySnapshot(s *store.Snapshot) (uint64, error) {
	var seq uint64
	err := func() error {
		meta := bucketOf(s, bMeta)
		issued, burned := getU64(meta, keyIssued), getU64(meta, keyBurned)
		seq = getU64(meta, keySeq)
		var sum uint64
		overflow := false
		s.Ascend(bAccounts, nil, nil, func(_, v []byte) bool {
			bal, _ := decodeAccount(v)
			var carry uint64
			sum, carry = bits.Add64(sum, bal, 0)
			overflow = overflow || carry != 0
			return true
		})
		switch {
		case burned > issued || overflow || sum != issued-burned:
			return invariantf("supply check failed: issued %d − burned %d ≠ the sum of balances %d (overflow %v)", issued, burned, sum, overflow)
		case seq > 0 && s.Get(bReceipts, u64(seq)) == nil:
			return invariantf("the last receipt, seq %d, is missing", seq)
		case s.Get(bReceipts, u64(seq+1)) != nil:
			return invariantf("a receipt after the last seq %d exists", seq)
		}
		return nil
	}()
	return seq, err
}

func invariantf(format string, args ...any) error {
	return &store.CorruptError{File: "ledger", Problem: fmt.Sprintf(format, args...),
		Remedy: "restore the data dir from a backup"}
}

// Close folds the write-ahead log into the bbolt file and closes both,
// waiting for writers, checkpoints and lookups in progress. Later calls
// of every method return ErrClosed. Calling Close more than once is safe.
func (l *Ledger) Close() error {
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("close ledger: %w", err)
	}
	return nil
}

// Closed reports whether Close has been called.
func (l *Ledger) Closed() bool { return l.db.Closed() }

// Hooks returns the store's fault-injection points (Options.Hooks, or
// ones Open made).
func (l *Ledger) Hooks() *store.Hooks { return l.hooks }

// Store returns the ledger's store, for its operators' calls: Scrub,
// Reopen and Recovery.
func (l *Ledger) Store() *store.DB { return l.db }

// Corruptions returns how many times the ledger's store met corrupt data
// while running (store.DB.Corruptions); it makes the ledger a
// durable.CorruptionCounter, whose count the committer exports.
func (l *Ledger) Corruptions() uint64 { return l.db.Corruptions() }

// Converted reports whether Open converted the ledger from the files of
// the wallet's release before the store (its formats 1 to 4).
func (l *Ledger) Converted() bool { return l.converted }

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
	var s *txState
	err := l.db.Update(func(tx *store.Tx) error {
		s = l.newTxState(tx)
		for i := range ops {
			r, err := s.apply(&ops[i])
			if err != nil {
				return err
			}
			results[i] = r
		}
		return s.flush()
	})
	if err != nil {
		// Results of a failed group must not leak out.
		return nil, fmt.Errorf("commit %d operations: %w", len(ops), err)
	}
	l.seq.Store(s.seq)
	return results, nil
}

// CheckpointDue reports whether Checkpoint should run (store.DB.CheckpointDue).
func (l *Ledger) CheckpointDue() bool { return l.db.CheckpointDue() }

// Err returns the error that makes the ledger refuse every write, or nil:
// it wraps ErrFailed (a disk error; Reopen recovers) or ErrCorrupt.
func (l *Ledger) Err() error { return l.db.Err() }

// Reopen recovers a ledger that a disk error failed (store.DB.Reopen) and
// checks its invariants again.
func (l *Ledger) Reopen() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.db.Err() == nil {
		return nil
	}
	if err := l.db.Reopen(); err != nil {
		return err
	}
	seq, err := l.verify()
	if err != nil {
		return err
	}
	l.seq.Store(seq)
	return nil
}

// CheckpointIn returns how long until CheckpointDue reports true by age
// alone; at least a millisecond.
func (l *Ledger) CheckpointIn() time.Duration { return l.db.CheckpointIn() }

// Pending reports whether groups wait in the write-ahead log for a
// checkpoint.
func (l *Ledger) Pending() bool { return l.db.Pending() }

// Checkpoint writes the groups committed since the last checkpoint into
// the bbolt file (store.DB.Checkpoint).
func (l *Ledger) Checkpoint() error { return l.db.Checkpoint() }

// Account returns the state of account id and the seq the read saw.
func (l *Ledger) Account(id string) (Account, uint64, error) {
	a := Account{ID: id}
	var seq uint64
	err := l.db.View(func(s *store.Snapshot) error {
		seq = getU64(bucketOf(s, bMeta), keySeq)
		if v := s.Get(bAccounts, []byte(id)); v != nil {
			a.Balance, a.Nonce = decodeAccount(v)
		}
		return nil
	})
	return a, seq, err
}

// Supply returns the totals and the seq the read saw.
func (l *Ledger) Supply() (Supply, uint64, error) {
	var sp Supply
	var seq uint64
	err := l.db.View(func(s *store.Snapshot) error {
		meta := bucketOf(s, bMeta)
		sp = Supply{Issued: getU64(meta, keyIssued), Burned: getU64(meta, keyBurned)}
		seq = getU64(meta, keySeq)
		return nil
	})
	return sp, seq, err
}

// Receipt returns the receipt with transaction id txID, or ErrNotFound.
func (l *Ledger) Receipt(txID string) (Receipt, error) {
	var rc Receipt
	seq, ok := ParseTxID(txID)
	if !ok {
		return rc, ErrNotFound
	}
	err := l.db.View(func(s *store.Snapshot) error {
		v := s.Get(bReceipts, u64(seq))
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
	err := l.db.Scan(func(s *store.Snapshot) error {
		// Seqs have no gaps: every seq up to the last has its receipt.
		for seq := after + 1; seq > after && len(out) < limit; seq++ {
			v := s.Get(bReceipts, u64(seq))
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
	err := l.db.View(func(s *store.Snapshot) error {
		v := s.Get(bIdem, []byte(key))
		if v == nil {
			return nil
		}
		rc, err := decodeRecord(v, bucketOf(s, bReceipts))
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

// Expired reports whether an idempotency record has expired and waits
// for a sweep. It reads a snapshot, so a sweeper can ask it without
// queueing a group when there is nothing to sweep.
func (l *Ledger) Expired() (bool, error) {
	now := uint64(l.now().UnixNano())
	expired := false
	err := l.db.View(func(s *store.Snapshot) error {
		s.Ascend(bIdemExp, nil, nil, func(k, _ []byte) bool {
			expired = len(k) >= 8 && binary.BigEndian.Uint64(k) <= now
			return false
		})
		return nil
	})
	return expired, err
}

// Sweep applies a sweep (KindSweep) of up to limit expired idempotency
// records as a group of its own, and returns how many it deleted. The
// wallet submits sweeps to its committer instead, which may group them
// with other operations; Sweep is for tests and tools. Expired records
// are already ignored by lookups; sweeping only reclaims their space.
func (l *Ledger) Sweep(ctx context.Context, limit int) (int, error) {
	res, err := l.Apply(ctx, []Op{{Kind: KindSweep, Limit: limit}})
	if err != nil {
		return 0, fmt.Errorf("sweep idempotency records: %w", err)
	}
	return res[0].Swept, nil
}

// Probe writes one small record, the time, as a group of its own: a write
// and fdatasync of the log that changes nothing a reader sees, to learn
// whether the disk takes writes again. A ledger that a disk error failed
// must be reopened first.
func (l *Ledger) Probe() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	err := l.db.Update(func(tx *store.Tx) error {
		return tx.Put(bMeta, keyProbed, u64(uint64(l.now().UnixNano())))
	})
	if err != nil {
		return fmt.Errorf("probe the ledger's disk: %w", err)
	}
	return nil
}

// Audit scans the whole ledger and returns its totals, so that callers
// can check supply = issued − burned = the sum of balances. It is O(size
// of the ledger): for tests and operators' checks, not for requests.
func (l *Ledger) Audit() (Audit, error) {
	var a Audit
	err := l.db.Scan(func(s *store.Snapshot) error {
		meta := bucketOf(s, bMeta)
		a.Issued, a.Burned, a.Seq = getU64(meta, keyIssued), getU64(meta, keyBurned), getU64(meta, keySeq)
		s.Ascend(bAccounts, nil, nil, func(_, v []byte) bool {
			bal, _ := decodeAccount(v)
			var carry uint64
			a.Balances, carry = bits.Add64(a.Balances, bal, 0)
			a.Overflow = a.Overflow || carry != 0
			a.Accounts++
			return true
		})
		s.Ascend(bReceipts, nil, nil, func(_, _ []byte) bool {
			a.Receipts++
			return true
		})
		return nil
	})
	return a, err
}

// getter reads one bucket.
type getter interface{ Get(k []byte) []byte }

type bucketGetter struct {
	r store.Reader
	b int
}

func (g bucketGetter) Get(k []byte) []byte { return g.r.Get(g.b, k) }

func bucketOf(r store.Reader, b int) getter { return bucketGetter{r, b} }

// txState applies operations of one group on the store's transaction.
// Accounts are read once, changed in memory and written once by flush,
// so an account that several operations of a group touch costs one
// write.
type txState struct {
	l   *Ledger
	now time.Time
	tx  *store.Tx

	seq, issued, burned uint64
	// The totals as the group found them, so that flush writes only
	// what changed.
	seq0, issued0, burned0 uint64
	cache                  map[string]*acct
}

type acct struct {
	balance, nonce uint64
	dirty          bool
}

func (l *Ledger) newTxState(tx *store.Tx) *txState {
	s := &txState{l: l, now: l.now().UTC(), tx: tx, cache: map[string]*acct{}}
	meta := s.bucket(bMeta)
	s.seq, s.issued, s.burned = getU64(meta, keySeq), getU64(meta, keyIssued), getU64(meta, keyBurned)
	s.seq0, s.issued0, s.burned0 = s.seq, s.issued, s.burned
	return s
}

func (s *txState) get(b int, k []byte) []byte { return s.tx.Get(b, k) }
func (s *txState) bucket(b int) getter        { return bucketOf(s.tx, b) }
func (s *txState) put(b int, k, v []byte) error {
	return s.tx.Put(b, k, v)
}
func (s *txState) del(b int, k []byte) error { return s.tx.Delete(b, k) }

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
	if op.Kind == KindSweep {
		n, err := s.sweep(op.Limit)
		return Result{Sweep: true, Swept: n}, err
	}
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
	v, err := encodeRecord(rec, res.ReceiptJSON, seq)
	if err != nil {
		return nil, err
	}
	if err := s.put(bIdem, key, v); err != nil {
		return nil, err
	}
	if err := s.put(bIdemExp, expKey(uint64(rec.Expires.UnixNano()), key), nil); err != nil {
		return nil, err
	}
	return rec, nil
}

// sweep deletes up to limit idempotency records expired at the group's
// time, oldest first, with their sweep index entries, and returns how
// many. A record replaced earlier in the group took its old index entry
// with it, so every entry found names a record that expired.
func (s *txState) sweep(limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	now := uint64(s.now.UnixNano())
	var expired [][]byte
	s.tx.Ascend(bIdemExp, nil, nil, func(k, _ []byte) bool {
		if len(k) < 8 || binary.BigEndian.Uint64(k) > now {
			return false
		}
		expired = append(expired, bytes.Clone(k))
		return len(expired) < limit
	})
	for _, k := range expired {
		if err := s.del(bIdemExp, k); err != nil {
			return 0, err
		}
		if err := s.del(bIdem, k[8:]); err != nil {
			return 0, err
		}
	}
	return len(expired), nil
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
func encodeRecord(r *Record, receipt []byte, seq uint64) ([]byte, error) {
	if r.Status < 0 || r.Status >= recordRef {
		return nil, fmt.Errorf("record status %d out of range", r.Status)
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
		return append(b, r.Body...), nil
	}
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status)|recordRef)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(receipt, castagnoli))
	return append(b, r.Body[len(receipt):]...), nil
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
