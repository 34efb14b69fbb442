package committer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/breaker"
)

// The names and help of the families the wallet fills from more than one
// place, each with its own constant label value: the committer's queue
// and goroutines here, the events bus and the sweeper in package main.
const (
	QueueDroppedName = "queue_dropped_total"
	QueueDroppedHelp = "Items a bounded queue did not deliver, by queue: refused when full (commit) or dropped oldest for a slow reader (events)."
	TasksSpawnedName = "tasks_spawned_total"
	TasksSpawnedHelp = "Goroutines started, by kind."
)

// Values of the result label of wallet_commits_total.
const (
	resultCommitted         = "committed"
	resultReplayed          = "replayed"
	resultInsufficientFunds = "insufficient_funds"
	resultNonceMismatch     = "nonce_mismatch"
	resultSupplyOverflow    = "supply_overflow"
	resultInvalid           = "invalid"
	resultFailed            = "failed"
	resultAborted           = "aborted"
)

var results = []string{
	resultCommitted, resultReplayed, resultInsufficientFunds, resultNonceMismatch,
	resultSupplyOverflow, resultInvalid, resultFailed, resultAborted,
}

// resultLabel names the outcome of one operation of a committed group.
func resultLabel(r ledger.Result) string {
	switch {
	case r.Replayed:
		return resultReplayed
	case r.Err == nil:
		return resultCommitted
	case errors.Is(r.Err, ledger.ErrInsufficientFunds):
		return resultInsufficientFunds
	case errors.Is(r.Err, ledger.ErrNonceMismatch):
		return resultNonceMismatch
	case errors.Is(r.Err, ledger.ErrSupplyOverflow):
		return resultSupplyOverflow
	default:
		return resultInvalid
	}
}

// metrics are the committer's series, named by the plugin guide's rule:
// the seed's concurrency metrics by their seed names, the wallet's own
// with the wallet_ prefix. The label values are the committer's: op
// "ledger_commit", svc "ledger", kind "commit" for abandoned operations
// and group commits and "committer" for goroutines, queue "commit". Families the wallet
// also fills elsewhere (queue_dropped_total, tasks_spawned_total) carry
// the label as a constant, so that each registration owns its series.
type metrics struct {
	inflight     prometheus.Gauge
	timeouts     prometheus.Counter
	retries      prometheus.Counter
	aborted      prometheus.Counter
	dropped      prometheus.Counter
	spawned      prometheus.Counter
	canceled     prometheus.Counter
	upstreamFail prometheus.Counter
	commits      *prometheus.CounterVec
	batchSize    prometheus.Histogram
	seconds      prometheus.Histogram

	checkpoints       *prometheus.CounterVec
	checkpointSeconds prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, c *Committer) (*metrics, error) {
	timeouts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "io_timeouts_total",
		Help: "I/O operations that outlasted their deadline, by operation.",
	}, []string{"op"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "backoff_retries_total",
		Help: "Retries after a backoff delay, by service and operation.",
	}, []string{"svc", "op"})
	canceled := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tasks_canceled_total",
		Help: "Work in progress stopped by cancellation, by kind: group commits abandoned at the drain deadline (commit).",
	}, []string{"kind"})
	upstreamFail := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "upstream_fail_total",
		Help: "Operations refused because a service's circuit breaker was open, by service.",
	}, []string{"svc"})
	aborted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tasks_aborted_total",
		Help: "Accepted work abandoned at the drain deadline, by kind.",
	}, []string{"kind"})
	m := &metrics{
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "worker_inflight",
			Help: "Committer goroutines committing a group now.",
		}),
		timeouts:     timeouts.WithLabelValues("ledger_commit"),
		retries:      retries.WithLabelValues("ledger", "ledger_commit"),
		aborted:      aborted.WithLabelValues("commit"),
		canceled:     canceled.WithLabelValues("commit"),
		upstreamFail: upstreamFail.WithLabelValues("ledger"),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        QueueDroppedName,
			Help:        QueueDroppedHelp,
			ConstLabels: prometheus.Labels{"queue": "commit"},
		}),
		spawned: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        TasksSpawnedName,
			Help:        TasksSpawnedHelp,
			ConstLabels: prometheus.Labels{"kind": "committer"},
		}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wallet_commits_total",
			Help: "Operations through the commit pipeline, by kind and result.",
		}, []string{"kind", "result"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "wallet_commit_batch_size",
			Help:    "Operations per group commit (one write-ahead log record and fdatasync).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10), // 1 … 512
		}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "wallet_commit_seconds",
			Help:    "Duration of one commit attempt: the fault point, applying the group and its write-ahead log record with fdatasync.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms … 4s
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wallet_checkpoints_total",
			Help: "Checkpoints of the write-ahead log into the bbolt file, by result (committed, failed).",
		}, []string{"result"}),
		checkpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "wallet_checkpoint_seconds",
			Help:    "Duration of one checkpoint: switching the write-ahead log to its next generation, then the bbolt transaction of the frozen groups, with its fsyncs; groups commit alongside.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5ms … 4s
		}),
	}
	for _, r := range []string{resultCommitted, resultFailed} {
		m.checkpoints.WithLabelValues(r)
	}
	for _, k := range ledger.Kinds {
		for _, r := range results {
			m.commits.WithLabelValues(k.String(), r)
		}
	}
	if reg == nil {
		return m, nil
	}
	state := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wallet_breaker_state",
		Help: "State of the ledger circuit breaker: 0 closed, 1 open, 2 half-open.",
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
	for _, col := range []prometheus.Collector{m.inflight, timeouts, retries, aborted, canceled, upstreamFail, m.dropped, m.spawned, m.commits, m.batchSize, m.seconds, m.checkpoints, m.checkpointSeconds, state} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) commit(k ledger.Kind, result string) {
	m.commits.WithLabelValues(k.String(), result).Inc()
}
