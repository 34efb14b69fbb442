package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/mod/sumdb/note"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
	"github.com/plughost/plughost/sdk/bus"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/group"
	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/workq"
)

// version is the plugin's version, reported to the host.
const version = "0.1.0"

// retentionQueue is the capacity of the retention goroutine's commands.
const retentionQueue = 8

// committer is the SDK's group committer over the registry's store, with
// one goroutine: the single writer of HEAD, the entries and the tree.
type committer = durable.Committer[op, result]

// registry is the plugin. configure builds a running registry; the
// handlers and hooks use it once it is there.
type registry struct {
	// now, if set, is the registry's clock; tests set it.
	now func() time.Time
	// verifyEvery, if set, spaces the deep verifier's slices; tests
	// shorten it.
	verifyEvery time.Duration
	// faults, if set, stands in for the Runtime's fault points; tests set
	// it to hold commits without the host's admin API.
	faults durable.Injector
	// started, if set, runs as each background task starts, and again at
	// each restart, with the task's kind; tests make it panic.
	started func(kind string)

	running atomic.Pointer[running]
	// life supplies the Drain, Close and Health hooks.
	life durable.Lifecycle[op, result]
}

// signedCheckpoint is a checkpoint as published: its size and signed note.
type signedCheckpoint struct {
	n    uint64
	note []byte
}

// running is a configured registry. Every field is set once in configure,
// except the atomics.
type running struct {
	s      settings
	logger hclog.Logger
	db     *store.DB
	c      *committer
	rules  rules
	now    func() time.Time
	vkey   string // the checkpoint verifier key, note format

	head    atomic.Pointer[head]             // the head last committed
	ckpt    atomic.Pointer[signedCheckpoint] // the latest checkpoint, once persisted
	pruned  atomic.Uint64                    // the first version whose data is kept
	corrupt atomic.Pointer[string]           // set by the deep verifier: writes refused

	proposals, approvals atomic.Int64    // operations in the committer's queue, by intake
	retention            chan uint64     // checkpoint sizes for the retention goroutine
	bus                  *bus.Bus[event] // committed entries to the streams
	tasks                *group.Group    // checkpointer, retention, verifier, sweeper
	started              func(kind string)
	m                    metrics

	mu     sync.Mutex  // guards panics
	panics []time.Time // when background tasks panicked, the last maxPanics+1
}

type metrics struct {
	busy      *prometheus.CounterVec
	dropped   map[string]prometheus.Counter // by queue: proposals, approvals, retention
	casFail   prometheus.Counter
	timeouts  prometheus.Counter
	spawned   map[string]prometheus.Counter // by kind: checkpointer, retention, verifier, sweeper
	panicked  *prometheus.CounterVec        // by kind, as spawned
	headV     prometheus.Gauge
	verifyErr prometheus.Counter
	ckpts     prometheus.Counter
	swept     prometheus.Counter
}

// taskKinds are the registry's background tasks.
var taskKinds = []string{"checkpointer", "retention", "verifier", "sweeper"}

func droppedCounter(queue string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: workq.DroppedName, Help: workq.DroppedHelp,
		ConstLabels: prometheus.Labels{"queue": queue}})
}

func spawnedCounter(kind string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksSpawnedName, Help: durable.TasksSpawnedHelp,
		ConstLabels: prometheus.Labels{"kind": kind}})
}

func newMetrics() metrics {
	m := metrics{
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "busy_rejections_total",
			Help: "Requests refused with 429 because a bounded queue was full, by endpoint."}, []string{"endpoint"}),
		dropped: map[string]prometheus.Counter{"proposals": droppedCounter("proposals"), "approvals": droppedCounter("approvals"),
			"retention": droppedCounter("retention")},
		casFail: prometheus.NewCounter(prometheus.CounterOpts{Name: "commit_cas_fail_total",
			Help: "Commits refused because the stored HEAD was not the head last committed."}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: durable.IOTimeoutsName,
			Help: durable.IOTimeoutsHelp, ConstLabels: prometheus.Labels{"op": "commit"}}),
		spawned: map[string]prometheus.Counter{},
		panicked: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tasks_panicked_total",
			Help: "Background tasks that panicked and were restarted, by kind."}, []string{"kind"}),
		headV: prometheus.NewGauge(prometheus.GaugeOpts{Name: "registry_head_version",
			Help: "The version of the last committed entry."}),
		verifyErr: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_verify_failures_total",
			Help: "Mismatches the deep verifier found in the stored chain or tree."}),
		ckpts: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_checkpoints_total",
			Help: "Checkpoints signed and persisted."}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{Name: "registry_proposals_swept_total",
			Help: "Proposals deleted by the sweep because they expired before their quorum."}),
	}
	for _, k := range taskKinds {
		m.spawned[k] = spawnedCounter(k)
		m.panicked.WithLabelValues(k)
	}
	return m
}

// newBus returns the stream's bus: a consumer a whole stream_buffer
// behind is cut off, since it can resume from the store.
func newBus(s settings, reg prometheus.Registerer, drain <-chan struct{}) (*bus.Bus[event], error) {
	return bus.New[event](bus.Options{Policy: bus.CutOff, Consumers: s.streamConsumers, Drain: drain, Registerer: reg, Help: laggedHelp})
}

// laggedHelp is bus_lagged_total's help text.
const laggedHelp = "Stream consumers cut off because they fell a whole buffer behind, by consumer: a name in stream_consumers, or other."

func definition() sdk.Plugin { return newDefinition(&registry{}) }

// newDefinition describes the plugin around rg, which tests keep to set
// its clock.
func newDefinition(rg *registry) sdk.Plugin {
	mux := sdk.NewMux()
	rg.routes(mux)
	return sdk.Plugin{
		Name:    "registry",
		Version: version,
		Routes:  mux,
		Config:  schema(),
		// The store's files take an exclusive lock.
		SingleInstance: true,
		Configure:      rg.configure,
		Drain:          rg.life.Drain,
		Close:          rg.life.Close,
		Health:         rg.life.Health,
	}
}

// configure loads the signing key, opens the store and starts the
// committer, the checkpointer, retention and the deep verifier. An error
// refuses the config; nothing is left running.
func (rg *registry) configure(_ context.Context, rt *sdk.Runtime) error {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	s, err := c.check()
	if err != nil {
		return err
	}
	now := rg.now
	if now == nil {
		now = time.Now
	}
	signer, vkey, err := loadSigner(rt.DataDir, s.signingKeyFile, s.origin)
	if err != nil {
		return sdk.FileConfigError("signing_key_file", err)
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
	run := &running{s: s, logger: rt.Logger, db: db, now: now, vkey: vkey,
		rules:     rules{quorum: s.quorum, ttl: s.proposalTTL, origin: s.origin, signer: signer, keep: s.keepAfter},
		retention: make(chan uint64, retentionQueue), m: newMetrics()}
	if err := run.load(); err != nil {
		_ = db.Close()
		return err
	}
	cols := []prometheus.Collector{run.m.busy, run.m.dropped["proposals"], run.m.dropped["approvals"], run.m.dropped["retention"], run.m.casFail, run.m.timeouts,
		run.m.panicked, run.m.headV, run.m.verifyErr, run.m.ckpts, run.m.swept,
		depthGauge("proposals", &run.proposals), depthGauge("approvals", &run.approvals),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: workq.DepthName, Help: workq.DepthHelp,
			ConstLabels: prometheus.Labels{"queue": "retention"}}, func() float64 { return float64(len(run.retention)) }),
	}
	for _, k := range taskKinds {
		cols = append(cols, run.m.spawned[k])
	}
	for _, col := range cols {
		if err := rt.Registerer.Register(col); err != nil {
			_ = db.Close()
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	if run.bus, err = newBus(s, rt.Registerer, rt.Context().Done()); err != nil {
		_ = db.Close()
		return err
	}
	var faults durable.Injector = rt.Faults()
	if rg.faults != nil {
		faults = rg.faults
	}
	run.c, err = durable.New(durable.Options[op, result]{
		Store:    db,
		Apply:    run.apply,
		Probe:    func() error { return db.Update(func(*store.Tx) error { return nil }) },
		Wrote:    func(rs []result) bool { return anyWrote(rs) },
		Announce: run.announce,
		Kind:     func(o op) string { return o.kind.String() },
		Kinds:    opNames[:],
		Scrub:    func() (bool, error) { st, err := db.Scrub(1024); return st.Wrapped, err },
		Faults:   faults,
		Logger:   rt.Logger.Named("committer"),
		// One goroutine commits: the single writer of HEAD.
		Committers:    1,
		Registerer:    rt.Registerer,
		Metrics:       durable.Names{Prefix: "registry_store", Queue: "commit"},
		QueueCapacity: s.proposalsQueue + s.approvalsQueue + retentionQueue + 1,
		MaxBatch:      s.maxBatch,
		CommitTimeout: s.commitTimeout,
		// The seed's retries of idempotent storage operations: jittered
		// 50–100ms, capped at 2s, at most 3 tries.
		Retry: backoff.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5},
		Tries: 3,
	})
	if err != nil {
		_ = db.Close()
		return err
	}
	every := rg.verifyEvery
	if every == 0 {
		every = time.Second
	}
	run.started = rg.started
	run.start(rt.Context(), every)
	rg.running.Store(run)
	// The drain stops the background tasks first: they end with
	// Runtime.Context, as streams do, and submit nothing after.
	rg.life.Start(durable.Parts[op, result]{Store: db, Committer: run.c, Logger: rt.Logger,
		Drain: run.tasks.Stop, Health: run.health})
	if len(s.approvers) == 0 {
		rt.Logger.Warn("no approver blocks: nothing can commit; serving the log read-only")
	}
	h := run.head.Load()
	rt.Logger.Info("configured", "path", path, "head_version", h.Version, "approvers", len(s.approvers), "quorum", s.quorum, "origin", s.origin)
	return nil
}

func depthGauge(queue string, n *atomic.Int64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: workq.DepthName, Help: workq.DepthHelp,
		ConstLabels: prometheus.Labels{"queue": queue}}, func() float64 { return float64(n.Load()) })
}

func anyWrote(rs []result) bool {
	for _, r := range rs {
		if r.wrote {
			return true
		}
	}
	return false
}

// load reads HEAD, the latest checkpoint and the retention mark.
func (run *running) load() error {
	return run.db.View(func(sn *store.Snapshot) error {
		h, err := decodeHead(sn.Get(bucketMeta, keyHead))
		if err != nil {
			return err
		}
		run.head.Store(&h)
		run.m.headV.Set(float64(h.Version))
		if n := getU64(sn, keyCheckpoint); n > 0 {
			b := sn.Get(bucketCheckpoints, be64(n))
			if b == nil {
				return fmt.Errorf("checkpoint %d missing: %w", n, store.ErrCorrupt)
			}
			run.ckpt.Store(&signedCheckpoint{n: n, note: append([]byte(nil), b...)})
		}
		run.pruned.Store(max(getU64(sn, keyPruned), 1))
		return nil
	})
}

// apply commits a group: the durable committer's Apply, on its one
// goroutine. HEAD moves only here, from the head last announced.
func (run *running) apply(ctx context.Context, ops []op) ([]result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []result
	now := run.now()
	expected := *run.head.Load()
	err := run.db.Update(func(tx *store.Tx) (err error) {
		out, err = run.rules.apply(tx, now, expected, ops)
		return err
	})
	if errors.Is(err, errCAS) {
		run.m.casFail.Inc()
	}
	return out, err
}

// announce runs after each committed group, in commit order: it publishes
// the new head and checkpoint, and the committed entries to the stream.
func (run *running) announce(rs []result) {
	for _, r := range rs {
		switch {
		case r.fresh:
			h := r.head
			run.head.Store(&h)
			run.m.headV.Set(float64(h.Version))
			run.bus.Publish(event{Version: h.Version, Hash: r.entry.Hash})
		case r.swept > 0:
			run.m.swept.Add(float64(r.swept))
		case r.ckpt != nil && r.wrote:
			run.ckpt.Store(&signedCheckpoint{n: r.ckptN, note: r.ckpt})
			run.m.ckpts.Inc()
		case r.pruned > run.pruned.Load():
			run.pruned.Store(r.pruned)
		}
	}
}

// do submits o and waits for its result until ctx ends.
func (run *running) do(ctx context.Context, o op) (result, error) {
	done := make(chan struct {
		r   result
		err error
	}, 1)
	if err := run.c.Submit(o, func(r result, err error) {
		done <- struct {
			r   result
			err error
		}{r, err}
	}); err != nil {
		return result{}, err
	}
	select {
	case d := <-done:
		return d.r, d.err
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
}

// checkpointer signs a checkpoint every checkpoint_interval when the log
// has grown, and hands each to retention.
func (run *running) checkpointer(ctx context.Context) {
	tick(ctx, run.s.checkpointInterval, func() {
		if ck := run.ckpt.Load(); ck != nil && ck.n >= run.head.Load().Version {
			return
		}
		r, ok := run.background(ctx, op{kind: opCheckpoint}, "checkpoint not signed; trying at the next interval")
		if ok {
			run.retainBelow(r.ckptN)
		}
	})
}

// retainBelow hands retention a checkpoint of size n, whoever signed it:
// the checkpointer, POST /v1/checkpoint, or a start that found one
// stored. A full retention queue skips it; the next checkpoint covers
// what it would have pruned.
func (run *running) retainBelow(n uint64) {
	if !run.s.retention || n == 0 {
		return
	}
	select {
	case run.retention <- n:
	default:
		run.m.dropped["retention"].Inc()
		run.logger.Warn("retention queue full; skipping this cycle", "checkpoint", n)
	}
}

// tick calls fn every d until ctx ends.
func tick(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// background commits a background task's op within commit_deadline. A
// refusal is logged with msg, unless ctx has ended (the drain), and
// reported as !ok.
func (run *running) background(ctx context.Context, o op, msg string) (result, bool) {
	cctx, cancel := context.WithTimeout(ctx, run.s.commitDeadline)
	defer cancel()
	r, err := run.do(cctx, o)
	if err != nil && ctx.Err() == nil {
		run.logger.Warn(msg, "error", err)
	}
	return r, err == nil
}

// retain is the retention goroutine: for each checkpoint size it prunes
// the entry data below it (less keep_after_checkpoint), in batches
// through the committer.
func (run *running) retain(ctx context.Context) {
	for {
		var n uint64
		select {
		case <-ctx.Done():
			return
		case n = <-run.retention:
		}
		if n <= run.rules.keep {
			continue
		}
		below := n - run.rules.keep
		for run.pruned.Load() < below {
			r, ok := run.background(ctx, op{kind: opPrune, below: below}, "prune refused; trying at the next checkpoint")
			if !ok || !r.wrote {
				break
			}
		}
	}
}

// Supervision of the background tasks: a task that panics is restarted
// after a jittered backoff from restartBackoff; more than maxPanics
// panics within panicWindow make the plugin degraded.
var restartBackoff = backoff.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.5}

const (
	maxPanics   = 5
	panicWindow = time.Minute
)

// start starts the background tasks, supervised: the checkpointer,
// retention, the deep verifier (a slice every verifyEvery) and the
// sweep of expired proposals. Each returns once ctx ends.
func (run *running) start(ctx context.Context, verifyEvery time.Duration) {
	run.tasks = group.New(ctx, group.Options{Logger: run.logger.Named("tasks"), Backoff: restartBackoff,
		OnRestart: run.restarting})
	for kind, fn := range map[string]func(context.Context){
		"checkpointer": run.checkpointer,
		"retention":    run.retain,
		"verifier":     func(ctx context.Context) { run.verify(ctx, verifyEvery) },
		"sweeper":      func(ctx context.Context) { run.sweep(ctx, sweepEvery(run.s.proposalTTL)) },
	} {
		run.m.spawned[kind].Inc()
		run.tasks.Go(kind, func(ctx context.Context) error {
			if run.started != nil {
				run.started(kind)
			}
			fn(ctx)
			return nil
		})
	}
	// What the last process signed but did not get to prune.
	if ck := run.ckpt.Load(); ck != nil {
		run.retainBelow(ck.n)
	}
}

// restarting is the group's OnRestart: a task that panicked is counted
// in tasks_panicked_total{kind} and in the health's window.
func (run *running) restarting(kind string, reason error) {
	if !errors.Is(reason, group.ErrPanic) {
		return
	}
	run.m.panicked.WithLabelValues(kind).Inc()
	run.mu.Lock()
	defer run.mu.Unlock()
	run.panics = append(run.panics, run.now())
	if len(run.panics) > maxPanics+1 {
		run.panics = run.panics[1:]
	}
}

// sweepEvery is the sweep's interval for a proposal_ttl: a tenth of it,
// at most ten minutes, so that an expired proposal stays at most that
// long past its expiry.
func sweepEvery(ttl time.Duration) time.Duration { return min(ttl/10, 10*time.Minute) }

// sweep deletes the proposals that expired before their quorum, every
// interval, sweepBatch per operation through the committer, until none
// is left.
func (run *running) sweep(ctx context.Context, every time.Duration) {
	tick(ctx, every, func() {
		for more := true; more; {
			r, ok := run.background(ctx, op{kind: opSweep}, "sweep of expired proposals refused; trying at the next interval")
			more = ok && r.more
		}
	})
}

// health is degraded (write-unready) once the deep verifier found a
// mismatch, and degraded while background tasks panic more than
// maxPanics times within panicWindow; otherwise the committer's health
// stands.
func (run *running) health() (sdk.Health, bool) {
	if msg := run.corrupt.Load(); msg != nil {
		return sdk.Health{Status: sdk.StatusDegraded, Reason: "writes refused: the deep verifier found " + *msg + "; reads are served"}, true
	}
	run.mu.Lock()
	n := len(run.panics)
	recent := n > maxPanics && run.now().Sub(run.panics[0]) < panicWindow
	run.mu.Unlock()
	if recent {
		return sdk.Health{Status: sdk.StatusDegraded, Reason: fmt.Sprintf("background tasks panicked %d times within %v; see the log", n, panicWindow)}, true
	}
	return sdk.Health{}, false
}

// signingKeyName is the key file generated into the data dir.
const signingKeyName = "signing.key"

// loadSigner reads the note signing key from file, or from the data dir,
// where it is generated (0600) on first start, and returns its signer and
// verifier key. The key's name must be the origin.
func loadSigner(dataDir, file, origin string) (note.Signer, string, error) {
	path := file
	if path == "" {
		path = filepath.Join(dataDir, signingKeyName)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			skey, _, err := note.GenerateKey(rand.Reader, origin)
			if err != nil {
				return nil, "", err
			}
			if err := writeFileSync(path, []byte(skey+"\n")); err != nil {
				return nil, "", fmt.Errorf("write %s: %w", signingKeyName, err)
			}
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("read signing key: %w", err)
	}
	skey := strings.TrimSpace(string(b))
	signer, err := note.NewSigner(skey)
	if err != nil {
		return nil, "", fmt.Errorf("signing key: %w", err)
	}
	if signer.Name() != origin {
		return nil, "", fmt.Errorf("signing key is named %q, want the origin %q", signer.Name(), origin)
	}
	vkey, err := verifierKey(skey)
	return signer, vkey, err
}

// verifierKey derives the verifier key of an Ed25519 note signing key
// (PRIVATE+KEY+name+hash+base64(0x01 ‖ seed)).
func verifierKey(skey string) (string, error) {
	parts := strings.SplitN(skey, "+", 5) // base64 may hold '+'; the name may not
	if len(parts) != 5 {
		return "", errors.New("signing key: malformed")
	}
	b, err := base64.StdEncoding.DecodeString(parts[4])
	if err != nil || len(b) != 1+ed25519.SeedSize || b[0] != 1 {
		return "", errors.New("signing key: not an Ed25519 key")
	}
	pub := ed25519.NewKeyFromSeed(b[1:]).Public().(ed25519.PublicKey)
	return note.NewEd25519VerifierKey(parts[2], pub)
}

// writeFileSync writes b to path (0600) through a temporary file renamed
// into place, and syncs the file and its directory: a crash leaves the
// whole key or none, and a key once used survives it.
func writeFileSync(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
