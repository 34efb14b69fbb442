package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/plugins/gateway/internal/drr"
)

// The closed sets of label values. Each is exported from 0.
var (
	// rejectReasons are rejected_total's reasons: the decompression guard's,
	// then tenancy's.
	rejectReasons = []string{reasonRatio, reasonSize, reasonBodySize, reasonEncoding, reasonCorrupt, reasonUnauthorized, reasonRate, reasonShed}
	// outcomes are gateway_tenant_requests_total's outcomes.
	outcomes = []string{outcomeServed, outcomeRateLimited, outcomeShed, outcomeQueueFull, outcomeDropped, outcomeUnavailable, outcomeTimeout, outcomeDraining, outcomeCancelled}
	// timeoutOps are io_timeouts_total's ops.
	timeoutOps = []string{"read", "write", "connect"}
)

const (
	reasonRatio        = "decoded-ratio"
	reasonSize         = "decoded-size"
	reasonBodySize     = "body-size"
	reasonEncoding     = "unsupported-encoding"
	reasonCorrupt      = "corrupt-encoding"
	reasonUnauthorized = "unauthorized"
	reasonRate         = "rate-limited"
	reasonShed         = "shed"

	outcomeServed      = "served"
	outcomeRateLimited = "rate_limited"
	outcomeShed        = "shed"
	outcomeQueueFull   = "queue_full"
	outcomeDropped     = "dropped"
	outcomeUnavailable = "unavailable"
	outcomeTimeout     = "timeout"
	outcomeDraining    = "draining"
	outcomeCancelled   = "cancelled"
)

// metrics are the gateway's own series. The seed's concurrency metrics
// keep the seed's names, unprefixed; the rest are gateway_.
type metrics struct {
	busy            *prometheus.CounterVec // busy_rejections_total{endpoint}
	rejected        *prometheus.CounterVec // rejected_total{reason}
	abandoned       prometheus.Counter     // tasks_canceled_total{kind="abandoned"}
	ioTimeouts      *prometheus.CounterVec // io_timeouts_total{op}
	retries         prometheus.Counter     // backoff_retries_total{op="upstream"}
	requests        *prometheus.CounterVec // gateway_tenant_requests_total{tenant,outcome}
	upstreamSeconds *prometheus.HistogramVec
}

func newMetrics() *metrics {
	return &metrics{
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "busy_rejections_total",
			Help: "Requests refused 429 because the queues were full, by endpoint: intake (all tenant queues) or tenant (the tenant's own max_queue).",
		}, []string{"endpoint"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rejected_total",
			Help: "Requests refused before reaching a queue, by reason.",
		}, []string{"reason"}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "tasks_canceled_total",
			Help:        "Requests that left without running: queued when the drain began (kind queued), or whose caller left while they waited (kind abandoned).",
			ConstLabels: prometheus.Labels{"kind": "abandoned"},
		}),
		ioTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "io_timeouts_total",
			Help: "Upstream calls that ran out of the request's deadline, by the step that did: connect, write or read.",
		}, []string{"op"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "backoff_retries_total",
			Help:        "Retries of idempotent upstream calls after a backoff.",
			ConstLabels: prometheus.Labels{"op": "upstream"},
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_tenant_requests_total",
			Help: "Requests of each tenant that got past authentication, by outcome.",
		}, []string{"tenant", "outcome"}),
		upstreamSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_upstream_seconds",
			Help:    "Duration of each upstream call, to the response's head, by upstream.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"upstream"}),
	}
}

// register registers m, with every known label value at 0, and the
// scheduler's series when there is one.
func (m *metrics) register(reg prometheus.Registerer, s settings, sched *drr.Scheduler, degraded func() float64) error {
	for _, e := range []string{"intake", "tenant"} {
		m.busy.WithLabelValues(e)
	}
	for _, r := range rejectReasons {
		m.rejected.WithLabelValues(r)
	}
	for _, op := range timeoutOps {
		m.ioTimeouts.WithLabelValues(op)
	}
	names := []string{}
	for _, t := range s.tenants {
		names = append(names, t.name)
	}
	if s.defaultTenant != nil {
		names = append(names, defaultTenantName)
	}
	for _, n := range names {
		for _, o := range outcomes {
			m.requests.WithLabelValues(n, o)
		}
	}
	for _, u := range s.upstreams {
		m.upstreamSeconds.WithLabelValues(u.name)
	}
	cs := []prometheus.Collector{m.busy, m.rejected, m.ioTimeouts, m.retries, m.requests, m.upstreamSeconds,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gateway_degraded",
			Help: "1 while the gateway reports itself degraded (shedding load, or an upstream's breaker open), else 0.",
		}, degraded)}
	if sched != nil {
		stat := func(f func(drr.Stats) int64) func() float64 {
			return func() float64 { return float64(f(sched.Stats())) }
		}
		cs = append(cs, m.abandoned,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "queue_depth", Help: "Requests waiting, by queue: intake (all tenant queues) or sched (dispatched, waiting for a worker).",
				ConstLabels: prometheus.Labels{"queue": "intake"}}, stat(func(s drr.Stats) int64 { return s.Intake })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "queue_depth", Help: "Requests waiting, by queue: intake (all tenant queues) or sched (dispatched, waiting for a worker).",
				ConstLabels: prometheus.Labels{"queue": "sched"}}, stat(func(s drr.Stats) int64 { return s.Sched })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "queue_dropped_total", Help: "Requests dropped from a full queue with 503, by queue: sched (the oldest, displaced).",
				ConstLabels: prometheus.Labels{"queue": "sched"}}, stat(func(s drr.Stats) int64 { return s.Dropped })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gateway_reserved_total", Help: "Requests started at once on a reserved worker: their tenant had nothing running or waiting, and every worker was busy."},
				stat(func(s drr.Stats) int64 { return s.Reserved })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gateway_reserve_full_total", Help: "Requests queued that a free reserved worker would have started: their tenant had nothing running or waiting, every worker was busy, and so was every reserved worker. Raise reserved_workers if it grows."},
				stat(func(s drr.Stats) int64 { return s.ReserveFull })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tasks_spawned_total", Help: "Goroutines started, by kind: worker (the workers and the reserved workers).",
				ConstLabels: prometheus.Labels{"kind": "worker"}}, stat(func(s drr.Stats) int64 { return s.Spawned })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tasks_aborted_total", Help: "Requests still running on a worker at the drain deadline, whose upstream calls were cancelled, by kind: worker.",
				ConstLabels: prometheus.Labels{"kind": "worker"}}, stat(func(s drr.Stats) int64 { return s.Aborted })),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tasks_canceled_total", Help: "Requests that left without running: queued when the drain began (kind queued), or whose caller left while they waited (kind abandoned).",
				ConstLabels: prometheus.Labels{"kind": "queued"}}, stat(func(s drr.Stats) int64 { return s.CanceledOnClose })),
		)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	return nil
}
