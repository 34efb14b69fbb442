// Package view serves the wallet's reads (account states and the supply)
// from snapshots at most a staleness window old, and lets a reader wait for
// a snapshot that includes a given receipt seq.
//
// A snapshot is one short bbolt read transaction's answer, kept in memory
// with the time it was read (AsOf) and the ledger seq it saw. A cached
// snapshot is served until it is older than the window, or until a commit
// touching the account announces itself through Advance, which drops it.
// Reads therefore never wait for a commit, and keep answering while
// commits fail or stall; a reader that needs its own write passes its
// receipt's seq as minSeq.
//
// The lifecycle is New → Advance (from the committer's in-order
// announcements) and reads from any goroutine. The package must not write
// the ledger, start goroutines, or hold its lock across a ledger read.
package view

import (
	"context"
	"sync"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// DefaultMaxEntries bounds the cached account snapshots when
// Options.MaxEntries is zero.
const DefaultMaxEntries = 1 << 16

// Source reads the ledger; *ledger.Ledger is one.
type Source interface {
	Account(id string) (ledger.Account, uint64, error)
	Supply() (ledger.Supply, uint64, error)
}

// Options configure New.
type Options struct {
	Source Source
	// Window is the most a served snapshot may be behind; zero reads the
	// ledger every time.
	Window time.Duration
	// MaxEntries bounds the cache; when full, a random entry is dropped.
	// Default DefaultMaxEntries.
	MaxEntries int
	// Stop, when closed, ends every wait for a seq at once (the plugin is
	// draining); the reads still answer.
	Stop <-chan struct{}
	// Now returns the current time; default time.Now.
	Now func() time.Time
}

// Account is an account's state in a snapshot.
type Account struct {
	ledger.Account
	// Seq is the ledger seq the snapshot includes: every receipt up to it.
	Seq uint64
	// AsOf is when the snapshot was read.
	AsOf time.Time
}

// Supply is the totals in a snapshot.
type Supply struct {
	ledger.Supply
	Seq  uint64
	AsOf time.Time
}

// View is the snapshot cache. It is safe for concurrent use.
type View struct {
	src        Source
	window     time.Duration
	maxEntries int
	stop       <-chan struct{}
	now        func() time.Time

	// mu guards everything below. It is never held across a ledger read
	// or a wait. Lock order: the committer's announcing lock before mu.
	mu       sync.Mutex
	seq      uint64 // highest seq announced through Advance
	changed  chan struct{}
	accounts map[string]Account
	supply   *Supply
}

// New returns a view of opts.Source whose announced seq starts at seq,
// the ledger's current one.
func New(opts Options, seq uint64) *View {
	v := &View{
		src:        opts.Source,
		window:     opts.Window,
		maxEntries: opts.MaxEntries,
		stop:       opts.Stop,
		now:        opts.Now,
		seq:        seq,
		changed:    make(chan struct{}),
		accounts:   map[string]Account{},
	}
	if v.maxEntries <= 0 {
		v.maxEntries = DefaultMaxEntries
	}
	if v.now == nil {
		v.now = time.Now
	}
	return v
}

// Advance records that every receipt up to seq is committed and that the
// listed accounts changed: their snapshots and the supply's are dropped,
// and readers waiting for seq wake up. It never blocks.
func (v *View) Advance(seq uint64, accounts []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, id := range accounts {
		delete(v.accounts, id)
	}
	v.supply = nil
	if seq > v.seq {
		v.seq = seq
		close(v.changed)
		v.changed = make(chan struct{})
	}
}

// Seq returns the highest announced seq.
func (v *View) Seq() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seq
}

// Account returns a snapshot of account id at most the window old. If
// minSeq is above the announced seq it first waits, up to wait, for the
// seq to reach it; when the wait ends without that (timer, Stop) it
// answers the freshest snapshot anyway, whose Seq tells the caller. It
// returns ctx's error if ctx ends during the wait, and the ledger's if the
// read fails.
func (v *View) Account(ctx context.Context, id string, minSeq uint64, wait time.Duration) (Account, error) {
	if err := v.await(ctx, minSeq, wait); err != nil {
		return Account{}, err
	}
	now := v.now()
	v.mu.Lock()
	s, ok := v.accounts[id]
	v.mu.Unlock()
	if ok && s.Seq >= minSeq && now.Sub(s.AsOf) <= v.window {
		return s, nil
	}
	a, seq, err := v.src.Account(id)
	if err != nil {
		return Account{}, err
	}
	// AsOf is taken before the read, so the age it implies is never
	// less than the truth.
	s = Account{Account: a, Seq: seq, AsOf: now}
	if v.window > 0 {
		v.mu.Lock()
		if _, ok := v.accounts[id]; !ok && len(v.accounts) >= v.maxEntries {
			for k := range v.accounts { // map order is random: random eviction
				delete(v.accounts, k)
				break
			}
		}
		v.accounts[id] = s
		v.mu.Unlock()
	}
	return s, nil
}

// Supply returns a snapshot of the totals; minSeq and wait work as for
// Account.
func (v *View) Supply(ctx context.Context, minSeq uint64, wait time.Duration) (Supply, error) {
	if err := v.await(ctx, minSeq, wait); err != nil {
		return Supply{}, err
	}
	now := v.now()
	v.mu.Lock()
	s := v.supply
	v.mu.Unlock()
	if s != nil && s.Seq >= minSeq && now.Sub(s.AsOf) <= v.window {
		return *s, nil
	}
	sup, seq, err := v.src.Supply()
	if err != nil {
		return Supply{}, err
	}
	fresh := Supply{Supply: sup, Seq: seq, AsOf: now}
	if v.window > 0 {
		v.mu.Lock()
		v.supply = &fresh
		v.mu.Unlock()
	}
	return fresh, nil
}

// await waits until the announced seq reaches minSeq, wait passes, Stop
// is closed or ctx ends; only the last is an error.
func (v *View) await(ctx context.Context, minSeq uint64, wait time.Duration) error {
	v.mu.Lock()
	reached := v.seq >= minSeq
	v.mu.Unlock()
	if reached || wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		v.mu.Lock()
		reached, changed := v.seq >= minSeq, v.changed
		v.mu.Unlock()
		if reached {
			return nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return nil
		case <-v.stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
