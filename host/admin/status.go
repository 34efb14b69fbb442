package admin

import (
	"time"

	"github.com/plughost/plughost/host/supervisor"
)

// rateWindow is the span the status page's rates cover.
const rateWindow = time.Minute

// Overview is GET /v1/status, and what the status page shows.
type Overview struct {
	Time time.Time `json:"time"`
	// WindowSeconds is the span the rates cover: a minute, or less
	// while the host is younger; 0 before there are two samples, when
	// the rates are null.
	WindowSeconds float64          `json:"window_seconds"`
	Plugins       []PluginOverview `json:"plugins"`
}

// PluginOverview is one plugin's status with its traffic.
type PluginOverview struct {
	supervisor.Status
	// UptimeSeconds is how long the running process has run; 0 when
	// none does.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Inflight is plughost_inflight_requests, Queued
	// plughost_held_requests (requests held while the plugin is
	// replaced).
	Inflight float64 `json:"inflight"`
	Queued   float64 `json:"queued"`
	// RequestRate and ErrorRate are requests answered, and answered with
	// a 5xx code, per second over the window; P99Seconds is the 99th
	// percentile of their durations, estimated from the duration
	// histogram's buckets, and null when no request ended in the window.
	RequestRate *float64 `json:"request_rate"`
	ErrorRate   *float64 `json:"error_rate"`
	P99Seconds  *float64 `json:"p99_seconds"`
}

// overview reads the plugins' statuses and the host's metrics now.
func (s *Server) overview() Overview {
	statuses := s.plugins.Statuses()
	cur, window, ok := s.rates.since()
	o := Overview{Time: cur.at, Plugins: make([]PluginOverview, 0, len(statuses))}
	var span time.Duration
	if ok {
		span = cur.at.Sub(window[0].at)
		o.WindowSeconds = span.Seconds()
	}
	for _, st := range statuses {
		p := PluginOverview{Status: st}
		if !st.Started.IsZero() && st.Pid > 0 {
			p.UptimeSeconds = max(cur.at.Sub(st.Started), 0).Seconds()
		}
		r := cur.plugins[st.Name]
		if r == nil {
			r = &reading{}
		}
		p.Inflight, p.Queued = r.inflight, r.held
		if ok {
			readings := make([]*reading, 0, len(window)+1)
			for _, smp := range window {
				readings = append(readings, smp.plugins[st.Name])
			}
			rt := between(append(readings, r), span)
			p.RequestRate, p.ErrorRate, p.P99Seconds = &rt.requests, &rt.errors, rt.p99
		}
		o.Plugins = append(o.Plugins, p)
	}
	return o
}
