package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/plugins/gateway/internal/drr"
	"github.com/plughost/plughost/plugins/gateway/internal/shed"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/breaker"
)

// version is the plugin's version, reported to the host.
const version = "0.1.0"

// drainMargin is the part of the drain deadline kept to answer the
// requests whose upstream calls are aborted at its end.
const drainMargin = 250 * time.Millisecond

// gatewayPlugin is the plugin. configure builds a gateway; the handler and
// the hooks use it once it is there.
type gatewayPlugin struct {
	running atomic.Pointer[gateway]
}

// gateway is a configured gateway. Every field is set once in configure.
type gateway struct {
	s         settings
	logger    hclog.Logger
	m         *metrics
	tenancy   *tenancy
	upstreams map[string]*upstream
	// sched is nil when one tenant shares the workers with nobody: its
	// requests call the upstream on their own goroutines (the seed's
	// single-tenant bypass), bounded by the host's max_inflight.
	sched *drr.Scheduler
	// shed keeps the load-shedding level; used only with sched.
	shed      *shed.Shedder
	shedLevel atomic.Int32 // the last level logged
	// transport pools the connections of the url upstreams.
	transport *transport
	// now is the clock of the token buckets and of the shedder.
	now func() time.Time
}

// definition describes the plugin; main serves it.
func definition() sdk.Plugin {
	p := &gatewayPlugin{}
	mux := sdk.NewMux()
	// One subtree of any method: the gateway's own routes are in its
	// config, and it answers 404 for a path none of them matches.
	mux.Handle("/", http.HandlerFunc(p.serveHTTP))
	return sdk.Plugin{
		Name:      "gateway",
		Version:   version,
		Routes:    mux,
		Config:    schema(),
		Configure: p.configure,
		Drain:     p.drain,
		Health:    p.health,
	}
}

// configure checks the config and builds the gateway: tenants, upstreams,
// the scheduler and its workers, and the metrics.
func (p *gatewayPlugin) configure(_ context.Context, rt *sdk.Runtime) error {
	var c config
	if err := rt.DecodeConfig(&c); err != nil {
		return err
	}
	s, err := c.check()
	if err != nil {
		return err
	}
	g := &gateway{s: s, logger: rt.Logger, m: newMetrics(), tenancy: newTenancy(s), upstreams: map[string]*upstream{}, now: time.Now, shed: shed.New(s.shedHold)}
	g.transport = newTransport()
	for _, us := range s.upstreams {
		g.upstreams[us.name] = newUpstream(us, rt.Host, g.transport, breaker.Settings{
			FailureThreshold: int(s.breaker.Failures),
			FailureRate:      s.breaker.FailureRate,
			Window:           s.breaker.Window.Std(),
			Cooldown:         s.breaker.CoolDown.Std(),
			HalfOpenMax:      int(s.breaker.Probes),
			SuccessThreshold: int(s.breaker.Probes),
			OnStateChange:    g.breakerChanged,
		})
		g.upstreams[us.name].seconds = g.m.upstreamSeconds.WithLabelValues(us.name)
	}
	for _, t := range g.tenancy.all() {
		t.served = g.m.requests.WithLabelValues(t.name, outcomeServed)
	}
	if g.tenancy.count() > 1 {
		var ts []drr.Tenant
		for _, t := range g.tenancy.tenants {
			ts = append(ts, drr.Tenant{Name: t.name, Quantum: t.quantum, MaxQueue: t.mq})
		}
		if d := g.tenancy.deflt; d != nil {
			ts = append(ts, drr.Tenant{Name: d.name, Quantum: d.quantum, MaxQueue: d.mq})
		}
		g.sched, err = drr.New(drr.Options{Tenants: ts, Workers: s.workers, Reserved: s.reserved, IntakeCap: s.workQueue, SchedCap: s.schedQueue})
		if err != nil {
			return err
		}
	}
	if err := g.m.register(rt.Registerer, s, g.sched, func() float64 {
		if g.degraded() != "" {
			return 1
		}
		return 0
	}); err != nil {
		if g.sched != nil {
			g.sched.Close(context.Background())
		}
		return err
	}
	p.running.Store(g)
	rt.Logger.Info("configured", "routes", len(s.routes), "upstreams", len(s.upstreams),
		"tenants", g.tenancy.count(), "workers", s.workers, "reserved_workers", s.reserved, "fair_queuing", g.sched != nil)
	return nil
}

// breakerChanged logs a breaker's move. The breaker calls it without its
// lock held.
func (g *gateway) breakerChanged(name string, from, to breaker.State) {
	g.logger.Warn("upstream breaker changed state", "upstream", name, "from", from.String(), "to", to.String())
}

// shedLevelNow records the queues' load and returns the shedding level,
// logging each change of level.
func (g *gateway) shedLevelNow() int {
	if g.sched == nil || !g.s.shedding {
		return shed.None
	}
	level := g.shed.Update(g.now(), g.sched.Load())
	if old := g.shedLevel.Swap(int32(level)); int(old) != level {
		g.logger.Warn("load shedding level changed", "from", old, "to", level, "load", g.sched.Load())
	}
	return level
}

// degraded says why the gateway is degraded, or "": shedding, or
// upstreams whose breakers are not closed.
func (g *gateway) degraded() string {
	var reasons, open []string
	if level := g.shedLevelNow(); level != shed.None {
		reasons = append(reasons, fmt.Sprintf("overloaded (%.0f%% of work_queue in use): %s", 100*g.sched.Load(), shed.Describe(level)))
	}
	for name, u := range g.upstreams {
		if u.breaker.State() != breaker.StateClosed {
			open = append(open, name)
		}
	}
	slices.Sort(open)
	if len(open) > 0 {
		reasons = append(reasons, fmt.Sprintf("circuit breaker open or probing for upstream %s: its requests get 503", strings.Join(open, ", ")))
	}
	return strings.Join(reasons, "; ")
}

// health answers from memory: degraded while load is shed or a breaker
// is not closed.
func (p *gatewayPlugin) health(context.Context) sdk.Health {
	g := p.running.Load()
	if g == nil {
		return sdk.Health{Status: sdk.StatusNotReady, Reason: "not configured"}
	}
	if why := g.degraded(); why != "" {
		return sdk.Health{Status: sdk.StatusDegraded, Reason: why}
	}
	return sdk.Health{Status: sdk.StatusReady}
}

// drain stops dispatching, answers the queued requests 503, and lets the
// running ones finish until shortly before the host's deadline; then it
// cancels their upstream calls, which answer 503, and counts them in
// tasks_aborted_total{kind="worker"}.
func (p *gatewayPlugin) drain(ctx context.Context) error {
	g := p.running.Load()
	if g == nil {
		return nil
	}
	defer g.transport.CloseIdleConnections()
	if g.sched == nil {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-min(drainMargin, time.Until(dl)/4)))
		defer cancel()
	}
	if n := g.sched.Close(ctx); n > 0 {
		g.logger.Warn("upstream calls aborted at the drain deadline", "count", n)
	}
	return nil
}
