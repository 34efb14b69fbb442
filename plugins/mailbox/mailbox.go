package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/idem"
	"github.com/plughost/plughost/sdk/store"
)

// version is the plugin's version, reported to the host.
const version = "0.1.0"

// sweepEvery is how often expired idempotency records are swept, and
// sweepLimit the most per sweep.
const (
	sweepEvery = 10 * time.Second
	sweepLimit = 1024
)

// committer is the SDK's group committer over the mailbox's store.
type committer = durable.Committer[op, result]

// mailbox is the plugin. configure builds a running mailbox; the
// handlers and hooks use it once it is there.
type mailbox struct {
	// clock, if set, is the mailbox's clock; tests set it.
	clock clock
	// jitter, if set, draws backoff delays in [0, n); tests set it.
	jitter func(n int64) int64
	// faults, if set, stands in for the Runtime's fault points; tests set
	// it to hold commits without the host's admin API.
	faults durable.Injector

	running atomic.Pointer[running]
	// life supplies the Drain, Close and Health hooks.
	life durable.Lifecycle[op, result]
}

// running is a configured mailbox. Every field is set once in configure.
type running struct {
	s      settings
	logger hclog.Logger
	db     *store.DB
	c      *committer
	claims idem.Claims
	clock  clock
	// start and startMono are the wall and the monotonic clock's
	// readings at configure: now counts from them.
	start     time.Time
	startMono time.Duration
	wakers    wakers
	flight    inflight
	intake    []atomic.Int64  // sends in progress, per shard
	stop      <-chan struct{} // closed when the drain begins
	sweeper   sync.WaitGroup  // the sweeper and the redriver
	// redrives is the redriver's bounded intake (the seed's reproc_tx):
	// a redrive that finds it full is refused with 429.
	redrives chan redriveJob
	// redriveMu orders queueing a redrive (queueRedrive) against the
	// redriver's abandoning the queue when it stops: once redrivesShut
	// is set, none is queued, so each accepted redrive is either run or
	// counted as aborted.
	redriveMu    sync.Mutex
	redrivesShut bool
	m            metrics
	auth         *authority // nil when auth is not enabled
}

func definition() sdk.Plugin { return newDefinition(&mailbox{}) }

// newDefinition describes the plugin around mb, which tests keep to set
// its clock.
func newDefinition(mb *mailbox) sdk.Plugin {
	mux := sdk.NewMux()
	mb.routes(mux)
	return sdk.Plugin{
		Name:    "mailbox",
		Version: version,
		Routes:  mux,
		Config:  schema(),
		// The store's files take an exclusive lock.
		SingleInstance: true,
		Configure:      mb.configure,
		Drain:          mb.life.Drain,
		Close:          mb.life.Close,
		Health:         mb.life.Health,
	}
}

// configure opens the store and starts the committer and the sweeper. An
// error refuses the config; nothing is left running.
func (mb *mailbox) configure(_ context.Context, rt *sdk.Runtime) error {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	s, err := c.check()
	if err != nil {
		return err
	}
	s.rules.jitter = mb.jitter
	s.rules.floors = &floors{}
	clk := mb.clock
	if clk == nil {
		clk = systemClock{}
	}
	var auth *authority
	if s.auth.Enabled {
		if auth, err = newAuthority(s.auth.RootKeyFile, s.capCacheTTL); err != nil {
			return sdk.FileConfigError("auth.root_key_file", err)
		}
	}
	path := filepath.Join(rt.DataDir, storeFile)
	db, err := store.Open(path, storeOpts)
	if err != nil {
		var ce *store.CorruptError
		if errors.As(err, &ce) {
			return ce // the store's message names the file and the remedy
		}
		return err
	}
	if rec := db.Recovery(); rec.Trimmed != nil {
		rt.Logger.Warn("left out a torn record at the end of the write-ahead log, from a write that never completed",
			"file", rec.Trimmed.File, "record", rec.Trimmed.Record, "offset", rec.Trimmed.Offset)
	}
	run := &running{s: s, logger: rt.Logger, db: db, clock: clk, start: clk.Now(), startMono: clk.Mono(),
		stop: rt.Context().Done(), auth: auth, intake: make([]atomic.Int64, s.readyShards)}
	run.m = newMetrics(s.readyShards)
	if err := db.Scan(func(sn *store.Snapshot) error {
		hs, err := holds(sn, run.now())
		run.flight.apply(hs)
		return err
	}); err != nil {
		_ = db.Close()
		return fmt.Errorf("count the deliveries in flight: %w", err)
	}
	for _, col := range run.m.collectors(run.intake, s.shardCapacity) {
		if err := rt.Registerer.Register(col); err != nil {
			_ = db.Close()
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	faults := mb.faults
	if faults == nil {
		faults = rt.Faults()
	}
	run.c, err = durable.New(durable.Options[op, result]{
		Store: db,
		Apply: func(ctx context.Context, ops []op) ([]result, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			return s.rules.commit(db, run.now(), ops)
		},
		Probe:    func() error { return db.Update(func(*store.Tx) error { return nil }) },
		Announce: run.announce,
		Settled: func(ops []op) {
			for _, o := range ops {
				if o.key != "" {
					run.claims.Release(idemKey(o.topic, o.key))
				}
				if o.kind == opRecv {
					run.flight.release(o.max) // its reserved slots
				}
			}
		},
		Kind:          func(o op) string { return o.kind.String() },
		Kinds:         opNames[:],
		Scrub:         func() (bool, error) { st, err := db.Scrub(1024); return st.Wrapped, err },
		ScrubEvery:    time.Second,
		Faults:        faults,
		Logger:        rt.Logger.Named("committer"),
		Registerer:    rt.Registerer,
		Metrics:       durable.Names{Prefix: "mailbox", Service: "store", Queue: "commit"},
		QueueCapacity: s.queueCapacity,
		Committers:    s.committers,
		MaxBatch:      s.maxBatch,
		CommitTimeout: s.commitTimeout,
	})
	if err != nil {
		_ = db.Close()
		return err
	}
	run.redrives = make(chan redriveJob, redriveQueue)
	run.m.spawned.Add(2)
	run.sweeper.Add(2)
	go func() {
		defer run.sweeper.Done()
		run.sweep(rt.Context())
	}()
	go func() {
		defer run.sweeper.Done()
		run.redrive(rt.Context())
	}()
	mb.running.Store(run)
	// The drain stops the sweeper first; long polls end as it begins
	// (Runtime.Context).
	mb.life.Start(durable.Parts[op, result]{Store: db, Committer: run.c, Logger: rt.Logger,
		Drain: func(context.Context) error { run.sweeper.Wait(); return nil }})
	rt.Logger.Info("configured", "path", path, "ready_shards", s.readyShards, "committers", s.committers)
	return nil
}

// clock is where the mailbox reads the time. Deadlines are stored as unix
// milliseconds of the wall clock, so that they survive a restart; while
// the mailbox runs it measures them on the monotonic clock (running.now),
// so that a step of the wall clock (an NTP correction, an operator's
// date) makes no delivery reappear early or late.
type clock interface {
	// Now reads the wall clock.
	Now() time.Time
	// Mono reads the monotonic clock: the time since a fixed point, which
	// never steps.
	Mono() time.Duration
}

// systemClock is the machine's clock.
type systemClock struct{}

// monoOrigin is systemClock's fixed point: time.Since of a reading that
// carries a monotonic reading measures on the monotonic clock.
var monoOrigin = time.Now()

func (systemClock) Now() time.Time      { return time.Now() }
func (systemClock) Mono() time.Duration { return time.Since(monoOrigin) }

// now is the mailbox's time: the wall clock's reading at configure moved
// on by the monotonic clock since. Every deadline is written, and
// compared, as unix milliseconds of it. At configure it is the wall
// clock, so a stored deadline D is the monotonic instant start + (D −
// start): a deadline survives a restart as far as the wall clock is
// right across it, and a step of the wall clock while the mailbox runs
// moves none.
func (run *running) now() time.Time { return run.start.Add(run.clock.Mono() - run.startMono) }

// announce runs after each committed group: it counts what the group did
// and wakes the long polls of the topics it made messages visible in.
func (run *running) announce(rs []result) {
	for _, r := range rs {
		if r.integ > 0 {
			run.m.integrity.WithLabelValues("hash").Add(float64(r.integ))
		}
		run.m.requeueBack.Add(float64(r.backoffs))
		run.m.redeliv.Add(float64(r.redeliv))
		run.m.dlq.Add(float64(r.dlq))
		run.m.lapsed.Add(float64(r.lapsed))
		run.reordered(r)
		for _, t := range r.wake {
			run.wakers.wake(t)
		}
		run.flight.apply(r.held)
	}
}

// reordered records receive r's first deliveries in reorder_depth_max.
func (run *running) reordered(r result) {
	var ids []uint64
	for _, d := range r.msgs {
		if d.Attempts == 1 {
			ids = append(ids, d.ID)
		}
	}
	if len(ids) == 0 {
		return
	}
	sh := run.shard(r.topic)
	deepest := run.m.reorder.deliver(sh, r.topic, ids)
	run.m.reorderMax.WithLabelValues(strconv.Itoa(sh)).Set(float64(deepest))
}

// sweep reclaims expired idempotency records through the committer until
// ctx ends. A sweep refused (busy, draining) is tried at the next tick.
func (run *running) sweep(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = run.c.Submit(op{kind: opSweep, max: sweepLimit}, func(result, error) {})
		}
	}
}

// redriveQueue is the redriver's intake capacity, the seed's reproc_tx.
const redriveQueue = 256

// redriveJob is one accepted redrive: up to max messages of topic.dlq
// back to topic, at most rate a second (0: as fast as commits go).
type redriveJob struct {
	topic string
	max   int
	rate  float64
}

// redrive runs the accepted redrives one at a time until ctx ends: each
// in chunks through the committer, a chunk of up to rate messages (or
// maxRedriveChunk) every second, until max are moved or the DLQ is empty.
// A chunk the committer refuses is tried again a second later. When ctx
// ends, the redrive in progress counts in tasks_canceled_total and those
// still queued in tasks_aborted_total, kind redrive.
func (run *running) redrive(ctx context.Context) {
	for {
		var j redriveJob
		select {
		case <-ctx.Done():
			run.abandonRedrives()
			return
		case j = <-run.redrives:
		}
		if !run.redriveOne(ctx, j) {
			run.m.canceled["redrive"].Inc()
			run.abandonRedrives()
			return
		}
	}
}

// abandonRedrives shuts the redrive queue and empties it, counting what
// it held.
func (run *running) abandonRedrives() {
	run.redriveMu.Lock()
	defer run.redriveMu.Unlock()
	run.redrivesShut = true
	for {
		select {
		case <-run.redrives:
			run.m.abandoned.Inc()
		default:
			return
		}
	}
}

// errRedrivesFull: redriveQueue redrives already wait.
var errRedrivesFull = errors.New("the redrive queue is full")

// queueRedrive hands j to the redriver: errRedrivesFull when its queue is
// full, durable.ErrDraining once a drain has begun or the redriver has
// stopped (nothing would run j).
func (run *running) queueRedrive(j redriveJob) error {
	run.redriveMu.Lock()
	defer run.redriveMu.Unlock()
	if run.redrivesShut || isClosed(run.stop) {
		return fmt.Errorf("redrive: %w", durable.ErrDraining)
	}
	select {
	case run.redrives <- j:
		return nil
	default:
		return errRedrivesFull
	}
}

// redriveOne runs redrive j; it reports false if ctx ended first.
func (run *running) redriveOne(ctx context.Context, j redriveJob) bool {
	chunk, every := min(j.max, maxRedriveChunk), time.Duration(0)
	if j.rate > 0 {
		chunk = max(1, min(chunk, int(j.rate)))
		every = time.Duration(float64(chunk) / j.rate * float64(time.Second))
	}
	for moved := 0; moved < j.max; {
		n := min(chunk, j.max-moved)
		res, err := run.do(ctx, op{kind: opRedrive, topic: j.topic, max: n}, nil)
		switch {
		case ctx.Err() != nil:
			return false
		case err != nil:
			run.logger.Warn("redrive chunk refused; trying again", "topic", j.topic, "error", err)
			every = max(every, time.Second)
		default:
			moved += res.redriven
			if res.redriven < n {
				moved = j.max // the DLQ is empty
			}
		}
		if every > 0 && moved < j.max {
			t := time.NewTimer(every)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C:
			}
		}
	}
	return true
}

// shard is the shard topic hashes to.
func (run *running) shard(topic string) int {
	h := fnv.New32a()
	h.Write([]byte(topic))
	return int(h.Sum32() % uint32(len(run.intake)))
}

// wakers are the long polls' wake-up channels, one per topic being
// waited on: closed, and forgotten, when a commit makes a message of the
// topic visible. The mutex guards only the map, never a wait.
type wakers struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

// waiter returns the channel that the next wake of topic closes.
func (w *wakers) waiter(topic string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(map[string]chan struct{})
	}
	c, ok := w.ch[topic]
	if !ok {
		c = make(chan struct{})
		w.ch[topic] = c
	}
	return c
}

func (w *wakers) wake(topic string) {
	w.mu.Lock()
	c, ok := w.ch[topic]
	delete(w.ch, topic)
	w.mu.Unlock()
	if ok {
		close(c)
	}
}

// inflight are the deliveries holding their message, by message id, with
// their deadlines (unix ms), and the slots of receives in progress: the
// global_inflight cap's count. Expired ones are pruned when the count
// reaches the cap. The mutex guards only the map and the slots.
type inflight struct {
	mu sync.Mutex
	m  map[uint64]int64
	// reserved are the slots receives in progress hold (reserve): the
	// most their deliveries can add to m.
	reserved int
}

func (f *inflight) apply(hs []hold) {
	if len(hs) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[uint64]int64)
	}
	for _, h := range hs {
		if h.until == 0 {
			delete(f.m, h.id)
		} else {
			f.m[h.id] = h.until
		}
	}
}

// reserve takes up to n of limit's slots for a receive at now and
// returns how many it took, 0 when the deliveries holding their message
// and the slots other receives hold already make limit. Expired
// deliveries are pruned when they stand in the way. Taking slots under
// the same lock that counts the deliveries makes the cap exact: receives
// running at once can together take no more than limit. The receive
// takes at most that many messages, and its slots are given back with
// release once its result is announced (its deliveries are then counted
// in the map), or once its group is known not to have committed.
func (f *inflight) reserve(now time.Time, limit, n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m)+f.reserved+n > limit {
		nowMs := now.UnixMilli()
		for id, until := range f.m {
			if until <= nowMs {
				delete(f.m, id)
			}
		}
	}
	k := min(n, limit-len(f.m)-f.reserved)
	if k <= 0 {
		return 0
	}
	f.reserved += k
	return k
}

// release gives back n slots reserve took.
func (f *inflight) release(n int) {
	f.mu.Lock()
	f.reserved -= n
	f.mu.Unlock()
}

// outstanding returns the ids of held that still hold their message at
// now (not acked, nacked, terminated or expired), in held itself.
func (f *inflight) outstanding(held map[uint64]bool, now time.Time) map[uint64]bool {
	nowMs := now.UnixMilli()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range held {
		if until, ok := f.m[id]; !ok || until <= nowMs {
			delete(held, id)
		}
	}
	return held
}
