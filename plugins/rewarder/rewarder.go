package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/workq"
)

// version is the plugin's version.
const version = "0.1.0"

// Supervision of the compute workers and settlement emitters: a goroutine
// that panics is restarted after a jittered backoff; more than maxRestarts
// restarts within restartWindow make the plugin not ready.
const (
	restartMin    = 100 * time.Millisecond
	restartMax    = 400 * time.Millisecond
	restartCap    = 5 * time.Second
	maxRestarts   = 5
	restartWindow = time.Minute
	// drainMargin is how long before the drain deadline the work still
	// running is canceled (at most a quarter of the time left).
	drainMargin = 200 * time.Millisecond
)

// rewarder is the plugin; its clock and jitter are set before Configure
// (tests set them), run and life once it is configured.
type rewarder struct {
	now    func() time.Time
	jitter func(lo, hi time.Duration) time.Duration
	run    *running
	// life supplies the Drain, Close and Health hooks.
	life durable.Lifecycle[op, error]
}

func definition() sdk.Plugin { return newDefinition(&rewarder{}) }

// newDefinition describes the plugin around rw, which tests keep.
func newDefinition(rw *rewarder) sdk.Plugin {
	mux := sdk.NewMux()
	rw.routes(mux)
	return sdk.Plugin{
		Name:    "rewarder",
		Version: version,
		Routes:  mux,
		Config:  schema(),
		// The store's files take an exclusive lock.
		SingleInstance: true,
		Configure:      rw.configure,
		Drain:          rw.life.Drain,
		Close:          rw.life.Close,
		Health:         rw.life.Health,
	}
}

// op is one store write, applied in a group commit; it returns an error
// (and writes nothing) to refuse.
type op struct{ fn func(tx *store.Tx) error }

// running is a configured rewarder: the store and its committer, the
// queues and the goroutines that own them.
type running struct {
	s      settings
	log    hclog.Logger
	db     *store.DB
	c      *durable.Committer[op, error]
	host   sdk.Host
	now    func() time.Time
	jitter func(lo, hi time.Duration) time.Duration
	m      metrics

	// work carries epochs to compute (the seed's work queue), intents
	// epochs to settle (the seed's intents queue). Both reject when full;
	// an epoch refused by intents stays stored and the rescanner offers
	// it again.
	work    *workq.Queue[string]
	intents *workq.Queue[string]
	// results carries computed epochs from the compute workers to the
	// artifact writer (the seed's results queue): a blocking send, so
	// that a slow disk holds the workers back; the drain closes it once
	// the workers are done, and the writer flushes it.
	results chan result
	// bus broadcasts the state changes to GET /v1/events.
	bus *feed

	// mu guards active, the epochs queued, computing or settling in this
	// process: one run per epoch.
	mu       sync.Mutex
	active   map[string]bool
	restarts []time.Time

	draining atomic.Bool
	stop     chan struct{}      // closed when the drain begins
	ctx      context.Context    // canceled at the drain deadline
	cancel   context.CancelFunc //
	workers  sync.WaitGroup     // the compute workers, results' senders
	wg       sync.WaitGroup     // every other goroutine
}

// configure opens the store, starts the committer, the compute workers,
// the settlement emitters and the rescanner. An error refuses the config;
// nothing is left running.
func (rw *rewarder) configure(_ context.Context, rt *sdk.Runtime) (err error) {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	s, err := c.check(rt.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.artifactDir, 0o755); err != nil {
		return sdk.FileConfigError("artifact_dir", err)
	}
	r := &running{s: s, log: rt.Logger, host: rt.Host, now: rw.now, jitter: rw.jitter,
		active: map[string]bool{}, stop: make(chan struct{}), results: make(chan result, resultsCapacity)}
	if r.now == nil {
		r.now = time.Now
	}
	if r.jitter == nil {
		r.jitter = func(lo, hi time.Duration) time.Duration { return lo + rand.N(hi-lo+1) }
	}
	r.db, err = store.Open(filepath.Join(rt.DataDir, storeFile), storeOpts)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = r.db.Close()
		}
	}()
	if err := index(r.db, r.now().UTC()); err != nil {
		return err
	}
	if r.m, err = newMetrics(rt.Registerer, r); err != nil {
		return err
	}
	if r.bus, err = newFeed(s, rt.Registerer, r.stop); err != nil {
		return err
	}
	if r.work, err = workq.New[string](workq.Options{Name: "work", Capacity: s.workQueue, Registerer: rt.Registerer}); err != nil {
		return err
	}
	if r.intents, err = workq.New[string](workq.Options{Name: "intents", Capacity: 512, Registerer: rt.Registerer}); err != nil {
		return err
	}
	r.c, err = durable.New(durable.Options[op, error]{
		Store: r.db,
		Apply: func(ctx context.Context, ops []op) ([]error, error) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			out := make([]error, len(ops))
			err := r.db.Update(func(tx *store.Tx) error {
				for i, o := range ops {
					out[i] = o.fn(tx)
				}
				return nil
			})
			return out, err
		},
		Probe:         func() error { return r.db.Update(func(*store.Tx) error { return nil }) },
		Scrub:         func() (bool, error) { st, err := r.db.Scrub(1024); return st.Wrapped, err },
		Logger:        rt.Logger.Named("committer"),
		Registerer:    rt.Registerer,
		Metrics:       durable.Names{Prefix: "rewarder", Service: "store", Queue: "commit"},
		QueueCapacity: s.queueCapacity,
		MaxBatch:      s.maxBatch,
		CommitTimeout: s.commitTimeout,
	})
	if err != nil {
		return err
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.supervise(&r.workers, "worker", s.computeWorkers, r.computeLoop)
	r.supervise(&r.wg, "writer", 1, r.writeLoop)
	r.supervise(&r.wg, "emitter", s.ioInflight, r.settleLoop)
	r.supervise(&r.wg, "rescanner", 1, r.rescanLoop)
	rw.run = r
	rw.life.Start(durable.Parts[op, error]{Store: r.db, Committer: r.c, Logger: rt.Logger, Drain: r.stopTasks, Health: r.health})
	return nil
}

// supervise starts n goroutines running fn in wg, each restarted after a
// jittered, growing backoff when fn panics, until fn returns.
func (r *running) supervise(wg *sync.WaitGroup, task string, n int, fn func(ctx context.Context)) {
	for range n {
		r.m.spawned[task].Inc()
		wg.Go(func() {
			delay := restartMin
			for {
				if !r.protect(task, fn) {
					return
				}
				r.m.restarts.WithLabelValues(task).Inc()
				r.mu.Lock()
				r.restarts = append(r.restarts, r.now())
				r.mu.Unlock()
				select {
				case <-r.ctx.Done():
					return
				case <-time.After(r.jitter(delay, delay*4)):
				}
				delay = min(delay*2, restartCap)
			}
		})
	}
}

// protect runs fn and reports whether it panicked.
func (r *running) protect(task string, fn func(ctx context.Context)) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("task panicked; restarting it", "task", task, "panic", fmt.Sprint(v))
			panicked = true
		}
	}()
	fn(r.ctx)
	return false
}

func (r *running) stopping() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// commit writes fn in a group commit and waits for its outcome.
func (r *running) commit(ctx context.Context, fn func(tx *store.Tx) error) error {
	done := make(chan error, 1)
	if err := r.c.Submit(op{fn}, func(res error, err error) {
		if err == nil {
			err = res
		}
		done <- err
	}); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("commit: %w", ctx.Err())
	}
}

// claim marks id active; it reports false if it already was.
func (r *running) claim(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active[id] {
		return false
	}
	r.active[id] = true
	return true
}

func (r *running) release(id string) {
	r.mu.Lock()
	delete(r.active, id)
	r.mu.Unlock()
}

// errBusy is a compute refused because the work queue stayed full.
var errBusy = errors.New("the work queue is full")

// schedule queues id for a compute worker unless it is already active.
// A full queue is tried once more after 50–150 ms; then errBusy.
func (r *running) schedule(ctx context.Context, id string) error {
	if !r.claim(id) {
		return nil
	}
	err := r.work.TryEnqueue(id)
	if errors.Is(err, workq.ErrBusy) {
		r.m.retries.Inc()
		select {
		case <-ctx.Done():
		case <-time.After(r.jitter(50*time.Millisecond, 150*time.Millisecond)):
		}
		err = r.work.TryEnqueue(id)
	}
	if err != nil {
		r.release(id)
		if errors.Is(err, workq.ErrBusy) {
			return errBusy
		}
		return err
	}
	return nil
}

// offer hands a claimed epoch to the settlement emitters; if their queue
// is full, the epoch stays stored as it is and the rescanner offers it
// again.
func (r *running) offer(id string) {
	if err := r.intents.TryEnqueue(id); err != nil {
		r.release(id)
	}
}

// rescanLoop offers stored epochs that wait for work but are not active,
// as the pending index lists them: at start (a restart resumes where the
// last process stopped), and every rescan period (a full queue refused
// them). Each pass then prunes the settled epochs past retention.
func (r *running) rescanLoop(ctx context.Context) {
	t := time.NewTicker(r.s.rescan)
	defer t.Stop()
	for {
		r.rescan(ctx)
		r.prune(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

func (r *running) rescan(ctx context.Context) {
	var compute, settle []string
	err := r.db.View(func(s *store.Snapshot) error {
		var err error
		s.Ascend(bucketPending, nil, nil, func(k, _ []byte) bool {
			var e epoch
			e, _, err = getEpoch(s, string(k))
			switch e.State {
			case stateQueued, stateComputing:
				compute = append(compute, e.Epoch)
			case stateComputed, stateSettling:
				settle = append(settle, e.Epoch)
			}
			return err == nil
		})
		return err
	})
	if err != nil {
		r.log.Error("rescan the stored epochs", "error", err)
		return
	}
	for _, id := range compute {
		if r.stopping() {
			return
		}
		if r.claim(id) {
			if r.work.TryEnqueue(id) != nil {
				r.release(id)
			}
		}
	}
	for _, id := range settle {
		if r.stopping() {
			return
		}
		if r.claim(id) {
			r.offer(id)
		}
	}
}

// health is not ready while draining or when tasks restart too often;
// otherwise the committer's health stands.
func (r *running) health() (sdk.Health, bool) {
	if r.draining.Load() {
		return sdk.Health{Status: sdk.StatusNotReady, Reason: "draining"}, true
	}
	r.mu.Lock()
	cut := r.now().Add(-restartWindow)
	n := 0
	for _, t := range r.restarts {
		if t.After(cut) {
			n++
		}
	}
	r.mu.Unlock()
	if n > maxRestarts {
		r.m.degraded.WithLabelValues("restarts").Set(1)
		return sdk.Health{Status: sdk.StatusNotReady, Reason: fmt.Sprintf("%d task restarts in the last minute", n)}, true
	}
	r.m.degraded.WithLabelValues("restarts").Set(0)
	return sdk.Health{}, false
}

// stopTasks, the first step of the drain, stops taking computes, lets the
// computations and settlement attempts in flight finish until ctx ends,
// then cancels the rest: their state is stored, and a restart resumes
// them. The committer closes after it.
func (r *running) stopTasks(ctx context.Context) error {
	r.draining.Store(true)
	close(r.stop)
	r.work.Close()
	r.intents.Close()
	// Cancel what is still running a little before the deadline, so that
	// the committer can store its outcome and Drain returns in time.
	wait := ctx
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, d.Add(-min(drainMargin, time.Until(d)/4)))
		defer cancel()
	}
	aborted := false
	waitFor := func(wg *sync.WaitGroup) {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-wait.Done():
			if !aborted {
				aborted = true
				r.m.aborted.Inc()
				r.cancel()
			}
			<-done
		}
	}
	// The workers finish their computations first; then nothing sends on
	// results, and the writer flushes it.
	waitFor(&r.workers)
	close(r.results)
	waitFor(&r.wg)
	r.cancel()
	for res := range r.results { // what the deadline left unwritten
		r.m.droppedResults.Inc()
		r.release(res.id)
	}
	return nil
}

// metrics are the plugin's own series; the queues and the committer
// register theirs.
type metrics struct {
	busy     *prometheus.CounterVec
	spawned  map[string]prometheus.Counter // by task, each its own series: the committer registers kind="committer"
	restarts *prometheus.CounterVec
	retries  prometheus.Counter
	// walletTimeouts are the wallet calls past their deadline, by op: the
	// committer owns io_timeouts_total{op}, the store's.
	walletTimeouts *prometheus.CounterVec
	aborted        prometheus.Counter
	degraded       *prometheus.GaugeVec
	quarantine     *prometheus.CounterVec
	epochs         *prometheus.CounterVec
	computeTime    prometheus.Histogram
	pruned         prometheus.Counter
	droppedResults prometheus.Counter
	canceled       map[string]prometheus.Counter // by kind, each its own series, as spawned
}

// rewarder_tasks_canceled_total's kinds: work the drain ended before it was done,
// left stored for the next process.
const (
	kindCompute = "compute" // a queued epoch a worker took as the drain began
	kindSettle  = "settle"  // a settlement round the drain ended
)

func newMetrics(reg prometheus.Registerer, r *running) (metrics, error) {
	m := metrics{
		busy:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "busy_rejections_total", Help: "Requests refused with 429 because a bounded queue was full, by endpoint."}, []string{"endpoint"}),
		spawned:  map[string]prometheus.Counter{},
		canceled: map[string]prometheus.Counter{},
		droppedResults: prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped_results_total",
			Help: "Computed epochs whose results the drain deadline left unstored; the next process computes them again."}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "service_restarts_total", Help: "Supervised goroutines restarted after a panic, by task."}, []string{"task"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Name: "backoff_retries_total", Help: "Retries after a backoff delay, by service and operation.",
			ConstLabels: prometheus.Labels{"svc": "rewarder", "op": "settle"}}),
		walletTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rewarder_wallet_timeouts_total",
			Help: "Calls to the wallet plugin that outlasted settle.timeout, by op (account: the pool's nonce; batch: a settlement part)."}, []string{"op"}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksAbortedName, Help: durable.TasksAbortedHelp,
			ConstLabels: prometheus.Labels{"kind": "epoch"}}),
		degraded:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "readyz_degraded", Help: "1 while the plugin reports not ready for a cause, by cause."}, []string{"cause"}),
		quarantine:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quarantine_total", Help: "Epochs quarantined, by reason."}, []string{"reason"}),
		epochs:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rewarder_epochs_total", Help: "Epochs that reached a state, by state."}, []string{"state"}),
		pruned:      prometheus.NewCounter(prometheus.CounterOpts{Name: "rewarder_epochs_pruned_total", Help: "Settled epochs whose inputs, outbox and artifacts were removed after retention."}),
		computeTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "rewarder_compute_seconds", Help: "Time from the start of an epoch's reward computation to its artifacts written, the wait in the results queue included.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
	}
	m.busy.WithLabelValues("compute")
	// Every reason from 0, so that rate() and increase() see the first.
	for _, reason := range quarantineReasons {
		m.quarantine.WithLabelValues(reason)
	}
	m.walletTimeouts.WithLabelValues(walletOpAccount)
	m.walletTimeouts.WithLabelValues(walletOpBatch)
	cols := []prometheus.Collector{m.busy, m.restarts, m.retries, m.walletTimeouts, m.aborted, m.degraded, m.quarantine, m.epochs, m.computeTime, m.pruned, m.droppedResults,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: workq.DepthName, Help: workq.DepthHelp, ConstLabels: prometheus.Labels{"queue": "results"}},
			func() float64 { return float64(len(r.results)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: workq.CapacityName, Help: workq.CapacityHelp, ConstLabels: prometheus.Labels{"queue": "results"}},
			func() float64 { return float64(cap(r.results)) })}
	for _, kind := range []string{kindCompute, kindSettle} {
		// Not tasks_canceled_total: the committer registers that family
		// with a help text of its own kind, and a registry takes one help
		// per family.
		m.canceled[kind] = prometheus.NewCounter(prometheus.CounterOpts{Name: "rewarder_tasks_canceled_total", Help: "Work the drain ended before it was done, left stored for the next process, by kind (compute, settle).",
			ConstLabels: prometheus.Labels{"kind": kind}})
		cols = append(cols, m.canceled[kind])
	}
	for _, task := range []string{"worker", "writer", "emitter", "rescanner"} {
		m.spawned[task] = prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksSpawnedName, Help: durable.TasksSpawnedHelp, ConstLabels: prometheus.Labels{"kind": task}})
		m.restarts.WithLabelValues(task)
		cols = append(cols, m.spawned[task])
	}
	for _, s := range states {
		m.epochs.WithLabelValues(s)
	}
	for _, c := range cols {
		if err := reg.Register(c); err != nil {
			return m, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}
