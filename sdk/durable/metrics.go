package durable

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/breaker"
)

// Values of the result label of <prefix>_commits_total and
// <prefix>_checkpoints_total that the committer sets itself.
const (
	// ResultCommitted: the checkpoint, or the operation, committed (the
	// default Options.Result).
	ResultCommitted = "committed"
	// ResultFailed: the operation's commit, or the checkpoint, failed.
	ResultFailed = "failed"
	// ResultAborted: the operation was aborted at the drain deadline.
	ResultAborted = "aborted"
)

// The names and help texts of the families the committer fills that a
// plugin also fills for work of its own, each with its own label value
// (kind, op): a registry refuses one family with two help texts.
const (
	TasksSpawnedName  = "tasks_spawned_total"
	TasksSpawnedHelp  = "Goroutines started, by kind."
	TasksAbortedName  = "tasks_aborted_total"
	TasksAbortedHelp  = "Accepted work abandoned by the drain, by kind."
	TasksCanceledName = "tasks_canceled_total"
	TasksCanceledHelp = "Work in progress stopped by cancellation, by kind."
	IOTimeoutsName    = "io_timeouts_total"
	IOTimeoutsHelp    = "I/O operations that outlasted their deadline, by operation."
)

// StoreCorruptionName is the counter the committer exports for a Store
// that is a CorruptionCounter, with no label of its own (the host adds
// plugin): one name for every plugin's store, which alerts and the
// dashboard select without knowing the plugin's prefix.
const StoreCorruptionName = "store_corruption_total"

// metrics are the committer's series. The families the design names
// keep their names, with the committer's label values: op
// <service>_commit, svc <service>, kind "commit" for operations and group
// commits and "committer" for goroutines; its own start with the prefix.
// Families a plugin may also fill elsewhere carry their label as a
// constant, so that each registration owns its series. The intake
// queue's series are the queue's own (sdk/workq).
type metrics struct {
	inflight     prometheus.Gauge
	timeouts     prometheus.Counter
	retries      prometheus.Counter
	aborted      prometheus.Counter
	spawned      prometheus.Counter
	canceled     prometheus.Counter
	upstreamFail prometheus.Counter
	commits      *prometheus.CounterVec
	batchSize    prometheus.Histogram
	seconds      prometheus.Histogram

	checkpoints       *prometheus.CounterVec
	checkpointSeconds prometheus.Histogram
	scrubPasses       prometheus.Counter

	reg        prometheus.Registerer
	registered []prometheus.Collector
}

func newMetrics[Op, Res any](opts Options[Op, Res], c *Committer[Op, Res]) (*metrics, error) {
	p := opts.Metrics.Prefix + "_"
	op := c.svc + "_commit"
	constant := func(name, help, label, value string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{label: value}})
	}
	m := &metrics{
		reg: opts.Registerer,
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "worker_inflight",
			Help: "Committer goroutines committing a group now.",
		}),
		timeouts:     constant(IOTimeoutsName, IOTimeoutsHelp, "op", op),
		aborted:      constant(TasksAbortedName, TasksAbortedHelp, "kind", "commit"),
		canceled:     constant(TasksCanceledName, TasksCanceledHelp, "kind", "commit"),
		upstreamFail: constant("upstream_fail_total", "Operations refused because a service's circuit breaker was open, by service.", "svc", c.svc),
		spawned:      constant(TasksSpawnedName, TasksSpawnedHelp, "kind", "committer"),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "backoff_retries_total",
			Help:        "Retries after a backoff delay, by service and operation.",
			ConstLabels: prometheus.Labels{"svc": c.svc, "op": op},
		}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "commits_total",
			Help: "Operations through the commit pipeline, by kind and result.",
		}, []string{"kind", "result"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    p + "commit_batch_size",
			Help:    "Operations per group commit (one write-ahead log record and fdatasync).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 … 512
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    p + "commit_seconds",
			Help:    "Duration of one commit attempt: the fault point, applying the group and its write-ahead log record with fdatasync.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms … 4s
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: p + "checkpoints_total",
			Help: "Checkpoints of the write-ahead log into the main file, by result (committed, failed).",
		}, []string{"result"}),
		checkpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    p + "checkpoint_seconds",
			Help:    "Duration of one checkpoint: switching the write-ahead log to its next generation, then writing the frozen groups into the main file, with its fsyncs; groups commit alongside.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms … 4s
		}),
		scrubPasses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: p + "scrub_passes_total",
			Help: "Passes of the scrubber over every stored value completed.",
		}),
	}
	for _, r := range []string{ResultCommitted, ResultFailed} {
		m.checkpoints.WithLabelValues(r)
	}
	results := slices.Clone(opts.Results)
	for _, r := range []string{ResultFailed, ResultAborted} {
		if !slices.Contains(results, r) {
			results = append(results, r)
		}
	}
	for _, k := range opts.Kinds {
		for _, r := range results {
			m.commits.WithLabelValues(k, r)
		}
	}
	if m.reg == nil {
		return m, nil
	}
	state := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: p + "breaker_state",
		Help: "State of the " + c.svc + " circuit breaker: 0 closed, 1 open, 2 half-open.",
	}, func() float64 {
		switch c.breaker.State() {
		case breaker.StateOpen:
			return 1
		case breaker.StateHalfOpen:
			return 2
		default:
			return 0
		}
	})
	cols := []prometheus.Collector{m.inflight, m.timeouts, m.retries, m.aborted, m.canceled, m.upstreamFail, m.spawned, m.commits, m.batchSize, m.seconds, m.checkpoints, m.checkpointSeconds, state}
	if opts.Scrub != nil {
		cols = append(cols, m.scrubPasses)
	}
	if cc, ok := opts.Store.(CorruptionCounter); ok {
		cols = append(cols, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: StoreCorruptionName,
			Help: "Damaged values or pages the store met while running (reads and the scrubber); the first makes it refuse writes.",
		}, func() float64 { return float64(cc.Corruptions()) }))
	}
	for _, col := range cols {
		if err := m.reg.Register(col); err != nil {
			m.unregister()
			return nil, fmt.Errorf("register metrics: %w", err)
		}
		m.registered = append(m.registered, col)
	}
	return m, nil
}

// unregister takes back what newMetrics registered, after a failed New.
func (m *metrics) unregister() {
	for _, col := range m.registered {
		m.reg.Unregister(col)
	}
	m.registered = nil
}

func (m *metrics) commit(kind, result string) {
	m.commits.WithLabelValues(kind, result).Inc()
}
