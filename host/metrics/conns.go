package metrics

import "github.com/prometheus/client_golang/prometheus"

// Conns holds the metrics of the ingress's connection and stream limits.
type Conns struct {
	// Open counts open connections, by listener ("ingress", "admin").
	Open *prometheus.GaugeVec
	// Refused counts connections refused at the listener, by listener and
	// reason ("max_conns", "max_conns_per_ip").
	Refused *prometheus.CounterVec
	// Streams counts a plugin's open streams.
	Streams *prometheus.GaugeVec
	// StreamsCut counts streams the host ended, by plugin and reason
	// ("write_timeout", "lifetime").
	StreamsCut *prometheus.CounterVec
	// StreamRejections counts streams refused with 429, by plugin and
	// reason ("max_streams", "max_streams_per_ip").
	StreamRejections *prometheus.CounterVec
	// FDLimit is the host's file descriptor limit, by limit ("soft",
	// "hard").
	FDLimit *prometheus.GaugeVec
}

func newConns(r *prometheus.Registry) *Conns {
	c := &Conns{
		Open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_connections",
			Help: "Open connections, by listener.",
		}, []string{"listener"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_connections_refused_total",
			Help: "Connections answered 503 and closed at accept because a connection cap was reached, by listener and reason.",
		}, []string{"listener", "reason"}),
		Streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_streams",
			Help: "Open requests to a plugin's streaming routes.",
		}, []string{"plugin"}),
		StreamsCut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_streams_cut_total",
			Help: "Streams the host ended: their client accepted no bytes for stream_write_timeout, or they reached stream_max_lifetime.",
		}, []string{"plugin", "reason"}),
		StreamRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_stream_rejections_total",
			Help: "Requests to streaming routes refused with 429, by plugin and the cap reached.",
		}, []string{"plugin", "reason"}),
		FDLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_fd_limit",
			Help: "The host's file descriptor limit (RLIMIT_NOFILE) as it runs, soft and hard.",
		}, []string{"limit"}),
	}
	r.MustRegister(c.Open, c.Refused, c.Streams, c.StreamsCut, c.StreamRejections, c.FDLimit)
	return c
}

// forget deletes a plugin's stream series.
func (c *Conns) forget(l prometheus.Labels) {
	for _, v := range []*prometheus.MetricVec{c.Streams.MetricVec, c.StreamsCut.MetricVec, c.StreamRejections.MetricVec} {
		v.DeletePartialMatch(l)
	}
}
