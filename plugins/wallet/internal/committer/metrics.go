package committer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
	"github.com/plughost/plughost/sdk/breaker"
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

// metrics are the committer's series. Names follow the seed's concurrency
// metrics; the op label of the retry and timeout counters is
// "ledger_commit", the kind label of the aborted counter "commit".
type metrics struct {
	inflight  prometheus.Gauge
	timeouts  prometheus.Counter
	retries   prometheus.Counter
	aborted   prometheus.Counter
	commits   *prometheus.CounterVec
	batchSize prometheus.Histogram
	seconds   prometheus.Histogram

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
		Help: "Retries after a backoff delay, by operation.",
	}, []string{"op"})
	aborted := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tasks_aborted_total",
		Help: "Accepted work abandoned at the drain deadline, by kind.",
	}, []string{"kind"})
	m := &metrics{
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "worker_inflight",
			Help: "Committer goroutines committing a group now.",
		}),
		timeouts: timeouts.WithLabelValues("ledger_commit"),
		retries:  retries.WithLabelValues("ledger_commit"),
		aborted:  aborted.WithLabelValues("commit"),
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
	for _, col := range []prometheus.Collector{m.inflight, timeouts, retries, aborted, m.commits, m.batchSize, m.seconds, m.checkpoints, m.checkpointSeconds, state} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) commit(k ledger.Kind, result string) {
	m.commits.WithLabelValues(k.String(), result).Inc()
}
