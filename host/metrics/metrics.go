// Package metrics defines the host's own Prometheus metrics and merges every
// plugin's metric families into the host's single exposition, each with a
// plugin label. It does not serve HTTP; the admin package does.
package metrics

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// ReservedPrefix starts every host metric name; plugin families with it are
// dropped so a plugin cannot impersonate the host.
const ReservedPrefix = "plughost_"

// Host holds the host's metrics.
type Host struct {
	Registry *prometheus.Registry

	PluginUp    *prometheus.GaugeVec
	PluginState *prometheus.GaugeVec
	// PluginRestarts counts a plugin's restarts by reason, one of
	// RestartReasons; call InitPlugin to export every reason at 0.
	PluginRestarts *prometheus.CounterVec
	// PluginHealth is 1 for the health a ready plugin last reported, one
	// of HealthStatuses, and 0 for the others; all 0 while the plugin is
	// not ready (plughost_plugin_state says why).
	PluginHealth *prometheus.GaugeVec
	// PluginHungKills counts the plugin processes killed at once, with
	// no graceful exit, after they failed their health checks.
	PluginHungKills *prometheus.CounterVec
	Requests        *prometheus.CounterVec
	RequestDuration *prometheus.HistogramVec
	Inflight        *prometheus.GaugeVec
	BusyRejections  *prometheus.CounterVec
	// BodyBytes is the memory request bodies hold in the host, against
	// each plugin's budget.
	BodyBytes        *prometheus.GaugeVec
	DrainAborted     *prometheus.CounterVec
	PluginScrapeErrs *prometheus.CounterVec
	// Conns holds the connection and stream metrics.
	Conns *Conns
	// HeldRequests and HoldRejections are the queue of a plugin's
	// requests held while it is replaced (ingress.Hold).
	HeldRequests   *prometheus.GaugeVec
	HoldRejections *prometheus.CounterVec
	// PluginLogDropped counts the records of a plugin's output dropped
	// over its log_rate: by the host, or by the SDK in the plugin, which
	// reports them.
	PluginLogDropped *prometheus.CounterVec
	// Reloads counts config reloads by result, one of ReloadResults.
	Reloads *prometheus.CounterVec
}

// ReloadResults are the values of plughost_config_reloads_total's result
// label: the new config applied; rejected with errors in the file, a
// binary or a plugin's schema check, the running config kept; or
// applied, but a changed or new plugin refused its new config.
var ReloadResults = []string{"applied", "rejected", "plugins_refused"}

// Values of plughost_plugin_restarts_total's reason label.
const (
	// RestartFailure: the plugin went down (its process exited, its start
	// or Configure failed, or it failed its health checks) and the
	// supervisor started it again.
	RestartFailure = "failure"
	// RestartOperator: an operator restarted it (POST
	// /v1/plugins/{name}/restart).
	RestartOperator = "operator"
	// RestartUpgrade: an operator upgraded it to the binary now on disk
	// (POST /v1/plugins/{name}/upgrade).
	RestartUpgrade = "upgrade"
)

// HealthStatuses are the values of plughost_plugin_health's status
// label: the answers of a plugin's Health hook.
var HealthStatuses = []string{"ready", "degraded", "not_ready"}

// RestartReasons are the values of plughost_plugin_restarts_total's
// reason label. Only RestartFailure is a fault: alerts count it alone.
var RestartReasons = []string{RestartFailure, RestartOperator, RestartUpgrade}

// InitPlugin exports a plugin's restart counters, one for each of
// RestartReasons, at 0, so that increase() sees the first restart of each.
func (h *Host) InitPlugin(plugin string) {
	for _, r := range RestartReasons {
		h.PluginRestarts.WithLabelValues(plugin, r)
	}
}

// New registers the host's metrics, with Go runtime and process collectors,
// on a new registry.
func New() *Host {
	r := prometheus.NewRegistry()
	h := &Host{
		Registry: r,
		PluginUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_plugin_up",
			Help: "1 when the plugin is ready to serve, else 0.",
		}, []string{"plugin"}),
		PluginState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_plugin_state",
			Help: "1 for the plugin's current supervisor state, 0 for the others.",
		}, []string{"plugin", "state"}),
		PluginRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_plugin_restarts_total",
			Help: "Restarts of a plugin, by reason: failure (it exited, failed to start or configure, or failed health checks), operator (an operator's restart) or upgrade (an operator's upgrade).",
		}, []string{"plugin", "reason"}),
		PluginHealth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_plugin_health",
			Help: "1 for the health a ready plugin last reported (ready, degraded or not_ready) to the host's health checks, 0 for the others; all 0 while it is not ready.",
		}, []string{"plugin", "status"}),
		PluginHungKills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_plugin_hung_kills_total",
			Help: "Plugin processes SIGKILLed without a graceful exit because they failed health.failures health checks in a row.",
		}, []string{"plugin"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_http_requests_total",
			Help: "Ingress requests answered, by plugin and status code.",
		}, []string{"plugin", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "plughost_http_request_duration_seconds",
			Help:    "Time from ingress request to the end of the response, by plugin.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"plugin"}),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_inflight_requests",
			Help: "Requests being served by a plugin.",
		}, []string{"plugin"}),
		BusyRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_busy_rejections_total",
			Help: "Requests refused with 429 because the plugin was at max_inflight.",
		}, []string{"plugin"}),
		BodyBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_request_body_bytes",
			Help: "Bytes of memory the host holds for request bodies to the plugin, arriving or in flight.",
		}, []string{"plugin"}),
		DrainAborted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_drain_aborted_total",
			Help: "Requests still in flight when a drain deadline passed, answered with 503.",
		}, []string{"plugin"}),
		PluginScrapeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_plugin_metrics_errors_total",
			Help: "Failed or rejected collections of a plugin's own metrics.",
		}, []string{"plugin"}),
		HeldRequests: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "plughost_held_requests",
			Help: "Requests waiting for a plugin that is being replaced.",
		}, []string{"plugin"}),
		HoldRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_hold_rejections_total",
			Help: "Requests answered 503 because the queue of a plugin being replaced was full or its wait ran out.",
		}, []string{"plugin"}),
		PluginLogDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_plugin_log_dropped_lines_total",
			Help: "Lines of a plugin's output (stdout, stderr and its logger's records) dropped from the host log over the plugin's log_rate, by the host or, as it reports them, by the SDK in the plugin.",
		}, []string{"plugin"}),
		Reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plughost_config_reloads_total",
			Help: "Config reloads (SIGHUP), by result: applied, rejected (the running config kept) or plugins_refused (applied, but a plugin refused its new config).",
		}, []string{"result"}),
	}
	// Every result is exported from the start, so that increase() and
	// alerts see the first reload of each.
	for _, res := range ReloadResults {
		h.Reloads.WithLabelValues(res)
	}
	r.MustRegister(h.PluginUp, h.PluginState, h.PluginRestarts, h.PluginHealth, h.PluginHungKills, h.Requests, h.RequestDuration,
		h.Inflight, h.BusyRejections, h.BodyBytes, h.DrainAborted, h.PluginScrapeErrs, h.HeldRequests, h.HoldRejections,
		h.PluginLogDropped, h.Reloads, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	h.Conns = newConns(r)
	return h
}

// ReportReadiness exports plughost_ready: 1 while ready reports true (the
// host's /readyz answers 200), else 0. Call it once.
func (h *Host) ReportReadiness(ready func() bool) {
	h.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "plughost_ready",
		Help: "1 while the host's /readyz answers 200 (not draining, every required plugin serving), else 0.",
	}, func() float64 {
		if ready() {
			return 1
		}
		return 0
	}))
}

// Forget removes a plugin's labelled series, for plugins removed on reload.
func (h *Host) Forget(plugin string) {
	l := prometheus.Labels{"plugin": plugin}
	for _, v := range []*prometheus.MetricVec{h.PluginUp.MetricVec, h.PluginState.MetricVec, h.PluginHealth.MetricVec,
		h.Requests.MetricVec, h.Inflight.MetricVec, h.BusyRejections.MetricVec, h.BodyBytes.MetricVec,
		h.DrainAborted.MetricVec, h.PluginScrapeErrs.MetricVec, h.PluginRestarts.MetricVec, h.PluginHungKills.MetricVec,
		h.RequestDuration.MetricVec, h.HeldRequests.MetricVec, h.HoldRejections.MetricVec,
		h.PluginLogDropped.MetricVec} {
		v.DeletePartialMatch(l)
	}
	h.Conns.forget(l)
}

// Source yields one plugin's encoded metric families.
type Source interface {
	// Name is the plugin instance name used as the plugin label.
	Name() string
	// Families returns io.prometheus.client.MetricFamily messages encoded
	// with protobuf, or an error when the plugin cannot answer.
	Families(ctx context.Context) ([][]byte, error)
}

// Gatherer gathers the host's metrics and every source's, labelled.
type Gatherer struct {
	Host    *Host
	Sources func() []Source
	Timeout time.Duration
	Logger  hclog.Logger
}

// Gather implements prometheus.Gatherer. A plugin that fails to answer
// within Timeout is left out of this scrape and counted; it never fails the
// whole exposition.
func (g *Gatherer) Gather() ([]*dto.MetricFamily, error) {
	own, err := g.Host.Registry.Gather()
	if err != nil {
		return own, err
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range own {
		byName[mf.GetName()] = mf
	}
	srcs := g.Sources()
	results := make([][]*dto.MetricFamily, len(srcs))
	var wg sync.WaitGroup
	for i, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = g.collect(s)
		}()
	}
	wg.Wait()
	for i, fams := range results {
		for _, mf := range fams {
			have, ok := byName[mf.GetName()]
			if !ok {
				byName[mf.GetName()] = mf
				continue
			}
			if have.GetType() != mf.GetType() {
				// Two sources disagree on a family's type; keep the first
				// so the exposition stays valid, and say so.
				g.Host.PluginScrapeErrs.WithLabelValues(srcs[i].Name()).Inc()
				g.Logger.Warn("plugin metric family dropped: its type differs from another source's",
					"plugin", srcs[i].Name(), "family", mf.GetName(), "type", mf.GetType().String(), "kept_type", have.GetType().String())
				continue
			}
			have.Metric = append(have.Metric, mf.Metric...)
		}
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, mf := range byName {
		out = append(out, mf)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

func (g *Gatherer) collect(s Source) []*dto.MetricFamily {
	ctx, cancel := context.WithTimeout(context.Background(), g.Timeout)
	defer cancel()
	raw, err := s.Families(ctx)
	if err != nil {
		g.Host.PluginScrapeErrs.WithLabelValues(s.Name()).Inc()
		g.Logger.Debug("plugin metrics unavailable", "plugin", s.Name(), "error", err)
		return nil
	}
	fams, err := Relabel(s.Name(), raw)
	if err != nil {
		g.Host.PluginScrapeErrs.WithLabelValues(s.Name()).Inc()
		g.Logger.Warn("plugin metrics rejected", "plugin", s.Name(), "error", err)
	}
	return fams
}

// Relabel decodes a plugin's families and adds plugin="name" to every
// metric. Families with reserved names, or whose metrics already carry a
// plugin label, are dropped and reported in the returned error; the rest
// are returned.
func Relabel(plugin string, raw [][]byte) ([]*dto.MetricFamily, error) {
	var problems []string
	out := make([]*dto.MetricFamily, 0, len(raw))
	for _, b := range raw {
		mf := &dto.MetricFamily{}
		if err := proto.Unmarshal(b, mf); err != nil {
			problems = append(problems, fmt.Sprintf("undecodable family: %v", err))
			continue
		}
		if strings.HasPrefix(mf.GetName(), ReservedPrefix) {
			problems = append(problems, fmt.Sprintf("%s: names starting with %q are reserved for the host", mf.GetName(), ReservedPrefix))
			continue
		}
		if err := addLabel(mf, plugin); err != nil {
			problems = append(problems, err.Error())
			continue
		}
		out = append(out, mf)
	}
	if len(problems) > 0 {
		return out, fmt.Errorf("plugin %q metrics: %s", plugin, strings.Join(problems, "; "))
	}
	return out, nil
}

func addLabel(mf *dto.MetricFamily, plugin string) error {
	for _, m := range mf.Metric {
		for _, lp := range m.Label {
			if lp.GetName() == "plugin" {
				return fmt.Errorf("%s: label \"plugin\" is reserved for the host", mf.GetName())
			}
		}
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("plugin"), Value: proto.String(plugin)})
		sort.Slice(m.Label, func(i, j int) bool { return m.Label[i].GetName() < m.Label[j].GetName() })
	}
	return nil
}
