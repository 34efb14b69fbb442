package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/api"
	"github.com/plughost/plughost/plugins/wallet/internal/bus"
	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/plugins/wallet/internal/view"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/breaker"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/group"
	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/workq"
)

// version is the plugin's version, reported to the host.
const version = "0.1.0"

// Scrubbing: every scrubInterval the scrubber verifies the checksums of
// scrubSlice more values of the ledger file, so a pass over a file of N
// values takes N / scrubSlice intervals.
const (
	scrubInterval = time.Second
	scrubSlice    = 1024
)

// SyncFaultPoint is the fault point inside the write-ahead log's write:
// after the record is written, before its fdatasync. A delay there is a
// stalled disk; an error, a failed fdatasync.
const SyncFaultPoint = "ledger.sync"

// config is the plugin's config block; its json tags are the attributes
// declared in schema, and the host has applied the defaults. Numbers are
// float64 so that check can say what is wrong with 1.5.
type config struct {
	QueueCapacity   float64        `json:"queue_capacity"`
	Committers      float64        `json:"committers"`
	MaxBatch        float64        `json:"max_batch"`
	CommitTimeout   sdk.Duration   `json:"commit_timeout"`
	IdempotencyTTL  sdk.Duration   `json:"idempotency_ttl"`
	StalenessWindow sdk.Duration   `json:"staleness_window"`
	EventsBuffer    float64        `json:"events_buffer"`
	Breaker         *breakerConfig `json:"breaker"` // null when the block is absent
}

type breakerConfig struct {
	Failures    float64      `json:"failures"`
	FailureRate float64      `json:"failure_rate"`
	Window      sdk.Duration `json:"window"`
	CoolDown    sdk.Duration `json:"cool_down"`
	Probes      float64      `json:"probes"`
}

// defaultBreaker is the breaker block's defaults, for when it is absent.
var defaultBreaker = breakerConfig{Failures: 20, FailureRate: 0.5, Window: sdk.Duration(10 * time.Second), CoolDown: sdk.Duration(5 * time.Second), Probes: 10}

// settings are the checked config values.
type settings struct {
	queueCapacity, committers, maxBatch, eventsBuffer int
	commitTimeout, idempotencyTTL, stalenessWindow    time.Duration
	breaker                                           breaker.Settings
}

func schema() sdk.Schema {
	return sdk.Schema{
		Attrs: []sdk.Attr{
			{Name: "queue_capacity", Type: sdk.TypeNumber, Default: 512, Description: "operations waiting to commit; beyond it POSTs get 429"},
			{Name: "committers", Type: sdk.TypeNumber, Default: 0, Description: "committer goroutines; 0 means the number of CPUs"},
			{Name: "max_batch", Type: sdk.TypeNumber, Default: 256, Description: "most operations per group commit (one write-ahead log record and fdatasync)"},
			{Name: "commit_timeout", Type: sdk.TypeDuration, Default: "1s", Description: "deadline of one commit attempt"},
			{Name: "idempotency_ttl", Type: sdk.TypeDuration, Default: "24h", Description: "how long an Idempotency-Key's outcome is kept for replay"},
			{Name: "staleness_window", Type: sdk.TypeDuration, Default: "250ms", Description: "the most a read's snapshot may be behind; 0 reads the ledger every time"},
			{Name: "events_buffer", Type: sdk.TypeNumber, Default: 1024, Description: "receipts buffered per event stream before the oldest are dropped"},
		},
		Blocks: []sdk.Block{{
			Name:        "breaker",
			Description: "the ledger circuit breaker",
			Schema: sdk.Schema{Attrs: []sdk.Attr{
				{Name: "failures", Type: sdk.TypeNumber, Default: 20, Description: "failed or timed-out commits that open it: in a row, or within window when they are at least failure_rate of its commits"},
				{Name: "failure_rate", Type: sdk.TypeNumber, Default: 0.5, Description: "share of the window's commits that must have failed to open it"},
				{Name: "window", Type: sdk.TypeDuration, Default: "10s", Description: "the rolling window of failure_rate"},
				{Name: "cool_down", Type: sdk.TypeDuration, Default: "5s", Description: "how long it stays open before probing"},
				{Name: "probes", Type: sdk.TypeNumber, Default: 10, Description: "commits let through at once while half-open, and successes that close it"},
			}},
		}},
	}
}

// check refuses what the schema cannot express, naming the attribute.
func (c config) check() (settings, error) {
	var s settings
	var ck sdk.ConfigChecker
	s.queueCapacity = ck.Whole("queue_capacity", c.QueueCapacity, 1, 1<<20)
	s.committers = ck.Whole("committers", c.Committers, 0, 1024)
	s.maxBatch = ck.Whole("max_batch", c.MaxBatch, 1, 4096)
	s.eventsBuffer = ck.Whole("events_buffer", c.EventsBuffer, 1, 1<<20)
	s.commitTimeout = ck.Duration("commit_timeout", c.CommitTimeout, time.Millisecond, time.Minute)
	s.idempotencyTTL = ck.Duration("idempotency_ttl", c.IdempotencyTTL, time.Second, 365*24*time.Hour)
	s.stalenessWindow = ck.Duration("staleness_window", c.StalenessWindow, 0, time.Minute)
	b := defaultBreaker
	if c.Breaker != nil {
		b = *c.Breaker
	}
	// The host names attributes of nested blocks by their block.
	failures := ck.Whole("breaker", b.Failures, 1, 1<<20)
	coolDown := ck.Duration("breaker", b.CoolDown, time.Millisecond, time.Hour)
	probes := ck.Whole("breaker", b.Probes, 1, 1024)
	window := ck.Duration("breaker", b.Window, 100*time.Millisecond, time.Hour)
	if !(b.FailureRate > 0 && b.FailureRate <= 1) {
		ck.Refuse("breaker", "failure_rate must be above 0 and at most 1, got %v", b.FailureRate)
	}
	if err := ck.Err(); err != nil {
		return s, err
	}
	if s.committers == 0 {
		s.committers = runtime.NumCPU()
	}
	s.breaker = breaker.Settings{FailureThreshold: failures, FailureRate: b.FailureRate, Window: window,
		Cooldown: coolDown, HalfOpenMax: probes, SuccessThreshold: probes}
	return s, nil
}

// wallet is the plugin. configure builds a running wallet; the handler,
// health and drain hooks use it once it is there.
type wallet struct {
	// faults, if set, stands in for the Runtime's fault points; tests set
	// it to hold or fail commits without the host's admin API.
	faults durable.Injector
	// now, if set, is the ledger's clock (receipts' committed_at and
	// idempotency expiry); tests set it to the suite's clock.
	now func() time.Time

	running atomic.Pointer[running]
	// life supplies the Drain and Health hooks, and Close's steps.
	life durable.Lifecycle[ledger.Op, ledger.Result]
}

// running is a configured wallet. Every field is set once in configure.
type running struct {
	logger hclog.Logger
	ledger *ledger.Ledger
	api    *api.API
}

// definition describes the plugin; main serves it.
func definition() sdk.Plugin { return newDefinition(&wallet{}) }

// newDefinition describes the plugin around w, which tests keep to reach
// its ledger.
func newDefinition(w *wallet) sdk.Plugin {
	mux := sdk.NewMux()
	api.Register(mux, w.api)
	return sdk.Plugin{
		Name:    "wallet",
		Version: version,
		Routes:  mux,
		Config:  schema(),
		// The ledger's files take an exclusive lock: a second process
		// could not open them until this one has exited.
		SingleInstance: true,
		Configure:      w.configure,
		Drain:          w.life.Drain,
		Close:          w.close,
		Health:         w.life.Health,
	}
}

// configure opens the ledger and starts the committers and the sweeper.
// An error refuses the config; nothing is left running.
func (w *wallet) configure(_ context.Context, rt *sdk.Runtime) (err error) {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	s, err := c.check()
	if err != nil {
		return err
	}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	faults := w.faults
	if faults == nil {
		faults = rt.Faults()
	}
	path := filepath.Join(rt.DataDir, "wallet.db")
	hooks := &store.Hooks{}
	opFaults := rt.Faults() // the operator's, not a test's gate
	opFaults.Declare(SyncFaultPoint)
	hooks.SetSync(func(f *os.File) error {
		// A fault here stalls or fails the log's own write, after the
		// record is written and before fdatasync returns.
		if err := opFaults.Inject(context.Background(), SyncFaultPoint); err != nil {
			return err
		}
		return store.Fdatasync(f)
	})
	l, err := ledger.Open(path, ledger.Options{IdempotencyTTL: s.idempotencyTTL, Render: api.Render, Hooks: hooks, Now: w.now})
	if err != nil {
		// A damaged data dir is the operator's to repair: the SDK tells
		// the host, which shows the reason and does not restart. The
		// store's own error is the whole message (file, where, what to
		// do); the wrapping would put the host's path in front of it.
		var ce *store.CorruptError
		if errors.As(err, &ce) {
			return ce
		}
		return err
	}
	if rec := l.Store().Recovery(); rec.Trimmed != nil {
		rt.Logger.Warn("left out a torn record at the end of the write-ahead log, from a write that never completed",
			"file", rec.Trimmed.File, "record", rec.Trimmed.Record, "offset", rec.Trimmed.Offset, "bytes", rec.Trimmed.Bytes)
	} else if rec.Converted || l.Converted() {
		rt.Logger.Info("converted the ledger from the previous release's format", "path", path)
	}
	cleanup = append(cleanup, func() { _ = l.Close() })

	lagged := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bus_lagged_total",
		Help: "Values dropped for slow subscribers of a bus, by bus.",
	}, []string{"bus"})
	eventsDropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name:        workq.DroppedName,
		Help:        workq.DroppedHelp,
		ConstLabels: prometheus.Labels{"queue": "events"},
	})
	events := bus.New[*ledger.Receipt](s.eventsBuffer, lagged.WithLabelValues("events"), eventsDropped)
	v := view.New(view.Options{Source: l, Window: s.stalenessWindow, Stop: rt.Context().Done()}, l.Seq())
	// The API is built after the committer, which hands it the
	// operations of stalled commits once they land.
	var apiOf atomic.Pointer[api.API]
	announce := func(rs []*ledger.Receipt) {
		var touched []string
		for _, r := range rs {
			touched = append(touched, r.Accounts()...)
		}
		v.Advance(rs[len(rs)-1].Seq, touched)
		events.Publish(rs...)
	}
	cm, err := newCommitter(l, announce, commitOptions{
		Faults:        faults,
		Logger:        rt.Logger.Named("committer"),
		Registerer:    rt.Registerer,
		QueueCapacity: s.queueCapacity,
		Committers:    s.committers,
		MaxBatch:      s.maxBatch,
		CommitTimeout: s.commitTimeout,
		Breaker:       s.breaker,
		Settled: func(ops []ledger.Op) {
			if a := apiOf.Load(); a != nil {
				a.Settled(ops)
			}
		},
		Scrub: func() (bool, error) {
			st, err := l.Store().Scrub(scrubSlice)
			return st.Wrapped, err
		},
		ScrubEvery: scrubInterval,
	})
	if err != nil {
		return err
	}
	cleanup = append(cleanup, func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.commitTimeout)
		defer cancel()
		_ = cm.Close(ctx)
	})

	eventsDepth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        workq.DepthName,
		Help:        workq.DepthHelp,
		ConstLabels: prometheus.Labels{"queue": "events"},
	}, func() float64 { return float64(events.Buffered()) })
	sweepers := prometheus.NewCounter(prometheus.CounterOpts{
		Name:        durable.TasksSpawnedName,
		Help:        durable.TasksSpawnedHelp,
		ConstLabels: prometheus.Labels{"kind": "sweeper"},
	})
	checkpointLag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wallet_checkpoint_lag_seconds",
		Help: "How long the oldest group not yet checkpointed into the ledger's bbolt file has waited in the write-ahead log; 0 exactly when none waits and no checkpoint is writing the file.",
	}, func() float64 { return l.Store().CheckpointLag().Seconds() })
	for _, col := range []prometheus.Collector{lagged, eventsDropped, sweepers, checkpointLag, eventsDepth} {
		if err := rt.Registerer.Register(col); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}

	a, err := api.New(api.Options{
		Ledger:     l,
		Committer:  cm,
		View:       v,
		Events:     events,
		Logger:     rt.Logger.Named("api"),
		Registerer: rt.Registerer,
		Drain:      rt.Context().Done(),
		Backfill:   s.eventsBuffer,
	})
	if err != nil {
		return err
	}
	apiOf.Store(a)

	sweeper := group.New(rt.Context(), group.Options{Logger: rt.Logger.Named("sweeper")})
	sweepers.Inc()
	sweeper.Go("idempotency-sweeper", func(ctx context.Context) error {
		return sweep(ctx, l, cm, sweepInterval, rt.Logger.Named("sweeper"))
	})

	w.running.Store(&running{logger: rt.Logger, ledger: l, api: a})
	// The drain stops the sweeper first: it queues no more sweeps once
	// Runtime.Context has ended, and one it queued is the committer's to
	// commit or abort, like a request's. POSTs in flight end when the
	// committer answers them, so the API closes after it.
	w.life.Start(durable.Parts[ledger.Op, ledger.Result]{Store: l, Committer: cm, Logger: rt.Logger,
		Drain: sweeper.Stop, Close: a.Close})
	rt.Logger.Info("configured", "path", path, "seq", l.Seq(), "committers", s.committers,
		"queue_capacity", s.queueCapacity, "max_batch", s.maxBatch)
	return nil
}

// api returns the API once configured, or nil.
func (w *wallet) api() *api.API {
	if run := w.running.Load(); run != nil {
		return run.api
	}
	return nil
}

// close is the lifecycle's Close, which closes the API and then the
// ledger, unless a commit is still stalled on the disk; then the process
// exits with the files open, and the next start replays the log.
func (w *wallet) close(ctx context.Context) error {
	if err := w.life.Close(ctx); err != nil {
		return err
	}
	if run := w.running.Load(); run != nil {
		run.logger.Info("drained", "seq", run.ledger.Seq())
	}
	return nil
}
