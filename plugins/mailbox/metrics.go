package main

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plughost/plughost/sdk/durable"
)

// metrics are the mailbox's own series; the committer registers its own
// (sdk/durable). Every label value is bounded: an endpoint, op, kind or
// reason the code names, or a shard below ready_shards.
type metrics struct {
	busy        *prometheus.CounterVec
	integrity   *prometheus.CounterVec
	redeliv     prometheus.Counter
	dlq         prometheus.Counter
	latency     *prometheus.HistogramVec
	spawned     prometheus.Counter // kind="maintenance": the sweeper and the redriver
	requeueBack prometheus.Counter
	// lapsed is io_timeouts_total{op="recv"}: deliveries whose visibility
	// ended with no ack, nack or terminate, counted when a receive meets
	// their message again.
	lapsed prometheus.Counter
	// wakeJitter is scanner_wake_jitter_seconds, the seed's
	// scanner_wake_jitter_ms in the base unit promlint asks for: how late
	// a long poll or a stream woke past the deadline its timer was set to.
	wakeJitter prometheus.Summary
	// canceled is tasks_canceled_total by kind: recv and recv_stream, the
	// long polls and streams the drain ended while they waited; redrive,
	// the redrive the drain stopped before it moved its max.
	canceled map[string]prometheus.Counter
	// abandoned is tasks_aborted_total{kind="redrive"}: redrives answered
	// 202 that were still queued when the drain began, never started.
	abandoned prometheus.Counter
	// reorderMax is reorder_depth_max{shard}.
	reorderMax *prometheus.GaugeVec
	reorder    *reorder
}

// canceledKinds are tasks_canceled_total's kinds of the mailbox's own.
var canceledKinds = []string{"recv", "recv_stream", "redrive"}

func newMetrics(shards int) metrics {
	m := metrics{
		busy: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "busy_rejections_total",
			Help: "Requests refused with 429 because a bounded queue was full, by endpoint."}, []string{"endpoint"}),
		integrity: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "integrity_fail_total",
			Help: "Stored messages whose payload failed its BLAKE3 hash at delivery, by reason."}, []string{"reason"}),
		redeliv: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailbox_redeliveries_total",
			Help: "Deliveries of messages delivered before."}),
		dlq: prometheus.NewCounter(prometheus.CounterOpts{Name: "mailbox_dlq_total",
			Help: "Messages moved to a dead-letter queue (max_attempts, integrity or terminate)."}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "request_latency_seconds",
			Help: "Time to answer a request, by operation.", Buckets: prometheus.DefBuckets}, []string{"op"}),
		spawned: prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksSpawnedName,
			Help: durable.TasksSpawnedHelp, ConstLabels: prometheus.Labels{"kind": "maintenance"}}),
		requeueBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "requeue_backoff_total",
			Help: "Messages put back with a full-jitter backoff delay (a nack without delay_ms or a failed delivery)."}),
		lapsed: prometheus.NewCounter(prometheus.CounterOpts{Name: durable.IOTimeoutsName,
			Help: durable.IOTimeoutsHelp, ConstLabels: prometheus.Labels{"op": "recv"}}),
		wakeJitter: prometheus.NewSummary(prometheus.SummaryOpts{Name: "scanner_wake_jitter_seconds",
			Help:       "Seconds a long poll or stream woke after the nearest visibility deadline of its topic that its timer was set to.",
			Objectives: map[float64]float64{0.5: 0.05, 0.9: 0.01, 0.99: 0.001}}),
		canceled: map[string]prometheus.Counter{},
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksAbortedName,
			Help: durable.TasksAbortedHelp, ConstLabels: prometheus.Labels{"kind": "redrive"}}),
		reorderMax: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "reorder_depth_max",
			Help: "Most messages of one topic sent after a message and first delivered before it, among its shard's last " +
				strconv.Itoa(reorderWindow) + " first deliveries, since start, by shard."}, []string{"shard"}),
		reorder: &reorder{shards: make([]reorderShard, shards)},
	}
	for _, k := range canceledKinds {
		m.canceled[k] = prometheus.NewCounter(prometheus.CounterOpts{Name: durable.TasksCanceledName,
			Help: durable.TasksCanceledHelp, ConstLabels: prometheus.Labels{"kind": k}})
	}
	for i := range shards {
		m.reorderMax.WithLabelValues(strconv.Itoa(i))
	}
	// Every label value from 0, so that rate() and increase() see the
	// first event.
	for _, endpoint := range []string{"send", "recv", "redrive"} {
		m.busy.WithLabelValues(endpoint)
	}
	m.integrity.WithLabelValues("hash")
	return m
}

// collectors are m's series, and per shard its intake's queue_depth and
// saturation, read from intake.
func (m *metrics) collectors(intake []atomic.Int64, capacity int) []prometheus.Collector {
	cols := []prometheus.Collector{m.busy, m.integrity, m.redeliv, m.dlq, m.latency, m.spawned, m.requeueBack,
		m.lapsed, m.wakeJitter, m.abandoned, m.reorderMax}
	for _, k := range canceledKinds {
		cols = append(cols, m.canceled[k])
	}
	for i := range intake {
		sh := strconv.Itoa(i)
		cols = append(cols,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "queue_depth", Help: "Items waiting in a bounded queue, by queue.",
				ConstLabels: prometheus.Labels{"queue": "intake_shard_" + sh},
			}, func() float64 { return float64(intake[i].Load()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "saturation", Help: "How full a bounded queue is, 0 to 1: its items over its capacity, by queue and shard.",
				ConstLabels: prometheus.Labels{"queue": "intake", "shard": sh},
			}, func() float64 { return float64(intake[i].Load()) / float64(capacity) }))
	}
	return cols
}

// wokeLate observes how late a timer set to the deadline next (unix ms
// of running.now) fired, at now.
func (m *metrics) wokeLate(next int64, now time.Time) {
	late := now.Sub(time.UnixMilli(next))
	m.wakeJitter.Observe(max(0, late.Seconds()))
}

// reorderWindow is how many of a shard's latest first deliveries a first
// delivery is compared with: reorder_depth_max cannot exceed it.
const reorderWindow = 64

// reorder measures how far first deliveries depart from send order, per
// shard. A message's id is its place in send order; its reorder depth at
// its first delivery (the first since its send or its redrive) is how
// many messages of its topic with a greater id, among the shard's last
// reorderWindow first deliveries, were delivered before it. The mutex
// guards only the windows.
type reorder struct {
	mu     sync.Mutex
	shards []reorderShard
}

type reorderShard struct {
	recent [reorderWindow]firstDelivery // a ring
	next   int
	max    int
}

type firstDelivery struct {
	topic string
	id    uint64
}

// deliver records the first deliveries ids of topic in shard, in their
// order, and returns the shard's deepest reorder since start.
func (r *reorder) deliver(shard int, topic string, ids []uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.shards[shard]
	for _, id := range ids {
		depth := 0
		for _, d := range s.recent {
			if d.id > id && d.topic == topic {
				depth++
			}
		}
		s.max = max(s.max, depth)
		s.recent[s.next] = firstDelivery{topic, id}
		s.next = (s.next + 1) % reorderWindow
	}
	return s.max
}
