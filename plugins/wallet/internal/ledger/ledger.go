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
)

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
)

// appendFillPercent is how full the pages of the append-mostly buckets are
// split (bbolt's default is 0.5, for random inserts).
const appendFillPercent = 0.9

// format is the newest file layout version, written in meta. Version 2
// added idempotency records that refer to their receipt (encodeRecord).
// A new file starts at version 1, and the transaction that writes its
// first such record sets version 2: until then, a binary that knows only
// version 1 can still open it; after, it refuses the file rather than
// misread the records. Version 1 records all still read.
const format = 2

// Options configure Open. The zero Options is usable.
type Options struct {
	// IdempotencyTTL is how long an idempotency record is kept after its
	// commit; default DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration
	// LockTimeout bounds the wait for the file's lock, which another
	// process holding the file keeps; default DefaultLockTimeout.
	LockTimeout time.Duration
	// Render turns a recorded result into the response stored with its
	// idempotency record. It runs inside the committing transaction, so it
	// must be quick and must not call the Ledger. The default stores the
	// receipt's JSON with 200, or the error text with 422.
	Render func(Result) (status int, body []byte)
	// Now returns the current time; tests set it to move expiry. Default
	// time.Now.
	Now func() time.Time
}

// Ledger is the wallet's bbolt file. It is safe for concurrent use; bbolt
// serializes Apply and Sweep and runs lookups alongside them. Create one
// with Open and call Close.
type Ledger struct {
	db     *bolt.DB
	ttl    time.Duration
	render func(Result) (int, []byte)
	now    func() time.Time
	seq    atomic.Uint64 // highest committed receipt seq
	closed atomic.Bool
	// refs is set once the file's format is 2, which allows records that
	// refer to receipts.
	refs atomic.Bool
}

// Open opens or creates the ledger file at path. If another process holds
// the file it fails after Options.LockTimeout instead of waiting for ever.
func Open(path string, opts Options) (*Ledger, error) {
	l := &Ledger{ttl: opts.IdempotencyTTL, render: opts.Render, now: opts.Now}
	if l.ttl <= 0 {
		l.ttl = DefaultIdempotencyTTL
	}
	if l.render == nil {
		l.render = defaultRender
	}
	if l.now == nil {
		l.now = time.Now
	}
	timeout := opts.LockTimeout
	if timeout <= 0 {
		timeout = DefaultLockTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: timeout,
		// The freelist is rebuilt by a scan at open instead of being
		// written by every commit: fewer pages per fsync.
		NoFreelistSync:  true,
		FreelistType:    bolt.FreelistMapType,
		InitialMmapSize: initialMmapSize,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open ledger %s: %w for %v: another process (another wallet on the same data dir?) has it open", path, ErrLocked, timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	var seq uint64
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketAccounts, bucketReceipts, bucketIdem, bucketIdemExp} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get(keyFormat); {
		case v == nil:
			if err := meta.Put(keyFormat, u64(1)); err != nil {
				return err
			}
		case len(v) == 8 && binary.BigEndian.Uint64(v) == 1:
		case len(v) == 8 && binary.BigEndian.Uint64(v) == format:
			l.refs.Store(true)
		default:
			return fmt.Errorf("file format %x is not 1 or %d", v, format)
		}
		seq = getU64(meta, keySeq)
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	l.db = db
	l.seq.Store(seq)
	return l, nil
}

// Close closes the file, waiting for transactions in progress. Later calls
// of every method return ErrClosed. Calling Close more than once is safe.
func (l *Ledger) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	if err := l.db.Close(); err != nil {
		return fmt.Errorf("close ledger: %w", err)
	}
	return nil
}

// Closed reports whether Close has been called.
func (l *Ledger) Closed() bool { return l.closed.Load() }

// Seq returns the seq of the last committed receipt, 0 for none. Every
// receipt up to it is on disk and visible to lookups.
func (l *Ledger) Seq() uint64 { return l.seq.Load() }

// Apply commits ops in one transaction and returns one result per op, in
// order. The ops are applied one after another, each seeing what the
// earlier ones did; a refused op (Result.Err) changes nothing. All
// receipts share one CommittedAt. A non-nil error means nothing was
// committed, and the same ops may be applied again. Apply cannot be
// interrupted once the transaction has begun: ctx is checked before.
func (l *Ledger) Apply(ctx context.Context, ops []Op) ([]Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if l.closed.Load() {
		return nil, ErrClosed
	}
	now := l.now().UTC()
	results := make([]Result, len(ops))
	var last uint64
	var upgraded bool
	err := l.db.Update(func(tx *bolt.Tx) error {
		s := newTxState(tx, l, now)
		for i := range ops {
			r, err := s.apply(&ops[i])
			if err != nil {
				return err
			}
			results[i] = r
		}
		last, upgraded = s.seq, s.upgraded
		return s.flush()
	})
	if err != nil {
		// Results of a rolled-back transaction must not leak out.
		return nil, fmt.Errorf("commit %d operations: %w", len(ops), l.mapErr(err))
	}
	if upgraded {
		l.refs.Store(true)
	}
	for {
		cur := l.seq.Load()
		if last <= cur || l.seq.CompareAndSwap(cur, last) {
			break
		}
	}
	return results, nil
}

// Account returns the state of account id and the seq the read saw.
func (l *Ledger) Account(id string) (Account, uint64, error) {
	a := Account{ID: id}
	var seq uint64
	err := l.view(func(tx *bolt.Tx) error {
		seq = getU64(tx.Bucket(bucketMeta), keySeq)
		if v := tx.Bucket(bucketAccounts).Get([]byte(id)); v != nil {
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
	err := l.view(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		s = Supply{Issued: getU64(meta, keyIssued), Burned: getU64(meta, keyBurned)}
		seq = getU64(meta, keySeq)
		return nil
	})
	return s, seq, err
}

// Receipt returns the receipt with transaction id txID, or ErrNotFound.
func (l *Ledger) Receipt(txID string) (Receipt, error) {
	var r Receipt
	seq, ok := ParseTxID(txID)
	if !ok {
		return r, ErrNotFound
	}
	err := l.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketReceipts).Get(u64(seq))
		if v == nil {
			return ErrNotFound
		}
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("decode receipt %d: %w", seq, err)
		}
		return nil
	})
	return r, err
}

// Receipts returns up to limit receipts with seqs after after, in seq
// order.
func (l *Ledger) Receipts(after uint64, limit int) ([]Receipt, error) {
	var out []Receipt
	err := l.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketReceipts).Cursor()
		for k, v := c.Seek(u64(after + 1)); k != nil && len(out) < limit; k, v = c.Next() {
			if after == math.MaxUint64 {
				break // after+1 wrapped to 0
			}
			var r Receipt
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode receipt %x: %w", k, err)
			}
			out = append(out, r)
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
	err := l.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketIdem).Get([]byte(key))
		if v == nil {
			return nil
		}
		r, err := decodeRecord(v, tx.Bucket(bucketReceipts))
		if err != nil {
			return fmt.Errorf("idempotency record %q: %w", key, err)
		}
		if r.Expires.After(now) {
			rec, ok = r, true
		}
		return nil
	})
	return rec, ok, err
}

// Sweep deletes up to limit expired idempotency records, oldest first, in
// one transaction, and returns how many it deleted. Expired records are
// already ignored by lookups; sweeping only reclaims their space.
func (l *Ledger) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if l.closed.Load() {
		return 0, ErrClosed
	}
	now := uint64(l.now().UnixNano())
	n := 0
	err := l.db.Update(func(tx *bolt.Tx) error {
		idem, exp := tx.Bucket(bucketIdem), tx.Bucket(bucketIdemExp)
		var expired [][]byte
		c := exp.Cursor()
		for k, _ := c.First(); k != nil && len(expired) < limit; k, _ = c.Next() {
			if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) > now {
				break
			}
			expired = append(expired, bytes.Clone(k))
		}
		// Deleting behind a bbolt cursor can skip keys, so delete after.
		for _, k := range expired {
			if err := exp.Delete(k); err != nil {
				return err
			}
			if err := idem.Delete(k[8:]); err != nil {
				return err
			}
		}
		n = len(expired)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep idempotency records: %w", l.mapErr(err))
	}
	return n, nil
}

// Audit scans the whole ledger and returns its totals, so that callers
// can check supply = issued − burned = the sum of balances. It is O(size
// of the ledger): for tests and operators' checks, not for requests.
func (l *Ledger) Audit() (Audit, error) {
	var a Audit
	err := l.view(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		a.Issued, a.Burned, a.Seq = getU64(meta, keyIssued), getU64(meta, keyBurned), getU64(meta, keySeq)
		if err := tx.Bucket(bucketAccounts).ForEach(func(_, v []byte) error {
			bal, _ := decodeAccount(v)
			var carry uint64
			a.Balances, carry = bits.Add64(a.Balances, bal, 0)
			a.Overflow = a.Overflow || carry != 0
			a.Accounts++
			return nil
		}); err != nil {
			return err
		}
		a.Receipts = tx.Bucket(bucketReceipts).Stats().KeyN
		return nil
	})
	return a, err
}

func (l *Ledger) view(fn func(*bolt.Tx) error) error {
	if l.closed.Load() {
		return ErrClosed
	}
	return l.mapErr(l.db.View(fn))
}

func (l *Ledger) mapErr(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// txState applies operations inside one transaction. Accounts are read
// once, changed in memory and written once by flush, so an account that
// several operations of a group touch costs one Put.
type txState struct {
	l        *Ledger
	now      time.Time
	meta     *bolt.Bucket
	accounts *bolt.Bucket
	receipts *bolt.Bucket
	idem     *bolt.Bucket
	idemExp  *bolt.Bucket

	seq, issued, burned uint64
	cache               map[string]*acct
	// upgraded is set when this transaction set the file's format to 2.
	upgraded bool
}

type acct struct {
	balance, nonce uint64
	dirty          bool
}

func newTxState(tx *bolt.Tx, l *Ledger, now time.Time) *txState {
	s := &txState{
		l:        l,
		now:      now,
		meta:     tx.Bucket(bucketMeta),
		accounts: tx.Bucket(bucketAccounts),
		receipts: tx.Bucket(bucketReceipts),
		idem:     tx.Bucket(bucketIdem),
		idemExp:  tx.Bucket(bucketIdemExp),
		cache:    map[string]*acct{},
	}
	// Receipts are appended in seq order and sweep index keys in expiry
	// order, so their pages can be split nearly full instead of half:
	// fewer pages for each commit to write.
	s.receipts.FillPercent = appendFillPercent
	s.idemExp.FillPercent = appendFillPercent
	s.seq, s.issued, s.burned = getU64(s.meta, keySeq), getU64(s.meta, keyIssued), getU64(s.meta, keyBurned)
	return s
}

func (s *txState) account(id string) *acct {
	if a, ok := s.cache[id]; ok {
		return a
	}
	a := &acct{}
	if v := s.accounts.Get([]byte(id)); v != nil {
		a.balance, a.nonce = decodeAccount(v)
	}
	s.cache[id] = a
	return a
}

// apply applies one operation. A returned error aborts the whole
// transaction (bbolt failed); a refusal is in the Result.
func (s *txState) apply(op *Op) (Result, error) {
	var old []byte // an expired record under op's key
	if op.Idem != nil {
		if v := s.idem.Get([]byte(op.Idem.Key)); v != nil {
			old = v
			rec, err := decodeRecord(v, s.receipts)
			if err != nil {
				return Result{}, fmt.Errorf("idempotency record %q: %w", op.Idem.Key, err)
			}
			if rec.Expires.After(s.now) {
				return Result{Record: &rec, Replayed: true}, nil
			}
		}
	}
	res := Result{Err: s.check(op)}
	var receipt []byte // as stored
	if res.Err == nil {
		res.Receipt = s.commit(op)
		receipt = res.Receipt.AppendJSON(nil)
		if err := s.receipts.Put(u64(res.Receipt.Seq), receipt); err != nil {
			return Result{}, err
		}
	}
	if op.Idem != nil && Recorded(res.Err) {
		rec, err := s.record(op.Idem, old, res, receipt)
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
// expired record if not nil, and its sweep index entry. receipt is the
// receipt as stored under its seq, if the op committed.
func (s *txState) record(idem *Idem, old []byte, res Result, receipt []byte) (*Record, error) {
	key := []byte(idem.Key)
	if len(old) >= 8 {
		if err := s.idemExp.Delete(expKey(binary.BigEndian.Uint64(old[:8]), key)); err != nil {
			return nil, err
		}
	}
	status, body := s.l.render(res)
	rec := &Record{Fingerprint: idem.Fingerprint, Status: status, Body: body, Expires: s.now.Add(s.l.ttl)}
	var seq uint64
	if res.Receipt != nil {
		seq = res.Receipt.Seq
	}
	if len(receipt) > 0 && !s.l.refs.Load() && !s.upgraded {
		// The first record that refers to a receipt makes this a
		// format 2 file, in the same transaction.
		if err := s.meta.Put(keyFormat, u64(format)); err != nil {
			return nil, err
		}
		s.upgraded = true
	}
	v, err := encodeRecord(rec, receipt, seq)
	if err != nil {
		return nil, err
	}
	if err := s.idem.Put(key, v); err != nil {
		return nil, err
	}
	if err := s.idemExp.Put(expKey(uint64(rec.Expires.UnixNano()), key), nil); err != nil {
		return nil, err
	}
	return rec, nil
}

// flush writes the changed accounts and the totals.
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
		if err := s.accounts.Put([]byte(id), encodeAccount(a.balance, a.nonce)); err != nil {
			return err
		}
	}
	for _, kv := range []struct {
		k []byte
		v uint64
	}{{keySeq, s.seq}, {keyIssued, s.issued}, {keyBurned, s.burned}} {
		if err := s.meta.Put(kv.k, u64(kv.v)); err != nil {
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
	return 200, r.Receipt.AppendJSON(nil)
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(b *bolt.Bucket, k []byte) uint64 {
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
func decodeRecord(v []byte, receipts *bolt.Bucket) (Record, error) {
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
