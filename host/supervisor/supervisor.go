// Package supervisor runs plugins: one state machine and one goroutine per
// plugin that starts it through the catalog, configures it, checks its
// health, restarts it with jittered exponential backoff when it exits or
// stops answering, gives up after too many restarts, and drains it with a
// deadline. It does not route requests; the ingress asks it for a plugin's
// current connection.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/dataplane"
	"github.com/plughost/plughost/host/metrics"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/backoff"
)

// Spec is what the supervisor needs to run one plugin.
type Spec struct {
	Name        string
	Path        string
	SHA256      string
	Mount       string
	MaxInflight int
	Required    bool
	DataDir     string
	// Dir is the plugin process's working directory
	// (catalog.Options.Dir): the config file's.
	Dir string
	// Env holds variables set in the plugin's environment on top of the
	// host variables it inherits (catalog.Options.ExtraEnv).
	Env map[string]string
	// Decode turns the plugin's declared schema into its config JSON. It
	// is called after every Describe, since a restarted binary may declare
	// a different schema. Its error is a config error.
	Decode func(schema *pluginv1.Schema) ([]byte, error)
	// Locate, if set, says where in the operator's config file the path
	// a refusal of the plugin's Configure names (sdk.ConfigError.Attribute,
	// never empty here) is, as "FILE:LINE:COL", or "" when it cannot say.
	// The refusal's error then starts with it and ": ", in the log, in
	// Status.LastError and in what Start returns, so that the operator
	// sees the same place as a reload's diagnostic shows.
	Locate func(attribute string) string
	// Fingerprint identifies the spec's content; a reload restarts the
	// plugin when it changes.
	Fingerprint string
	// MaxStreams caps the plugin's concurrent requests to streaming
	// routes, which do not count against MaxInflight.
	MaxStreams int
	// MaxBodyBytes is the plugin's request body limit
	// (config.PluginBlock.MaxBodyBytes), sent in Configure's Limits in
	// place of Policy.Limits' one; 0 keeps that one.
	MaxBodyBytes int64
	// UnreadyWhenDegraded makes the host's aggregate readiness count the
	// plugin, if Required, as not ready while it reports itself degraded
	// (config.PluginBlock.UnreadyWhenDegraded).
	UnreadyWhenDegraded bool
	// LogLimit limits the plugin's relayed output records
	// (config.PluginBlock.LogRate and LogBurst); the supervisor counts
	// what it drops in plughost_plugin_log_dropped_lines_total.
	LogLimit catalog.LogLimit
}

// Policy holds the restart and health settings.
type Policy struct {
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// Jitter is the fraction of each backoff delay drawn at random, as
	// backoff.Policy.Jitter: zero means backoff.DefaultJitter (each delay
	// drawn from [0.8·d, d]), a negative value none. The host config does
	// not set it; tests turn it off to check exact delays.
	Jitter         float64
	MaxRestarts    int
	Window         time.Duration
	StableAfter    time.Duration
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	HealthFailures int
	StartTimeout   time.Duration
	Limits         *pluginv1.Limits
}

// Options configure New.
type Options struct {
	Logger  hclog.Logger
	Metrics *metrics.Host
	Policy  Policy
	// Host is served to every plugin for callbacks.
	Host pluginv1.HostServer
	// OnChange is called, without locks held, when a plugin's state or
	// manifest changes. It must not block.
	OnChange func()
	// Restarts is the restart count the Process starts with: a Process
	// that replaces another carries its count on.
	Restarts int
	// SocketDir is where plugin processes make their go-plugin sockets
	// (catalog.Options.SocketDir); "" for their TMPDIR.
	SocketDir string
	// RetryConfigure makes a failed Configure hook (an *sdk.ConfigError)
	// no error of Start: the plugin shows the failure as its last error.
	// The host sets it: a plugin that cannot start must not take it down.
	// What follows depends on whether the plugin blamed its config:
	//
	//   - A failure that names no attribute (a full disk, unreadable data)
	//     is a failure to start, retried with backoff for as long as it
	//     lasts (counted as a restart, but not against
	//     Policy.MaxRestarts, a budget for crashes), so that the plugin
	//     comes up by itself once the cause is gone.
	//   - A refusal that names an attribute is a config error: the same
	//     config would be refused again, so the plugin is left failed,
	//     without a restart, until Restart (or the host replaces it with a
	//     new config).
	//
	// Without it any Configure failure is final, as a config the schema
	// refuses always is: Start returns it, and a later one leaves the
	// plugin failed until Restart.
	RetryConfigure bool
}

// Endpoint is a snapshot of a ready plugin that the ingress sends requests to.
// It belongs to one plugin process: a restarted plugin gets a new Endpoint.
type Endpoint struct {
	RPC pluginv1.PluginClient
	// aborted is set when the supervisor killed this process at a drain
	// deadline, so the ingress can count the requests that failed.
	aborted *atomic.Bool
	// data carries the process's requests; closed once the process is gone.
	data dataplane.Transport
	// calls counts the host's calls to the process (StartCall).
	calls *callCount
}

// NewEndpoint returns the Endpoint of a ready plugin process reached through rpc
// (its control plane) and data (its requests). The supervisor makes one
// per process; the test kit (host/plugintest) makes one for a plugin it
// serves in-process.
func NewEndpoint(rpc pluginv1.PluginClient, data dataplane.Transport) *Endpoint {
	return &Endpoint{RPC: rpc, aborted: &atomic.Bool{}, data: data, calls: &callCount{}}
}

// StartCall counts a call to the process, from before it is sent until
// EndCall, once its answer has been read. When the plugin reports that its
// drain has finished, its last answers can still be on their way: the
// supervisor waits for the counted calls, up to the drain deadline, before
// it stops the process, so that none is lost.
func (c *Endpoint) StartCall() { c.calls.add(1) }

// EndCall ends a call counted by StartCall.
func (c *Endpoint) EndCall() { c.calls.add(-1) }

// waitAnswers waits until the host has read every answer of ep's
// process or ctx ends, and reports whether it has.
func (p *Process) waitAnswers(ctx context.Context, ep *Endpoint) bool {
	if n := ep.calls.count(); n > 0 {
		p.logger.Debug("plugin drained; waiting for answers in transit", "calls", n)
	}
	return ep.calls.wait(ctx)
}

// callCount counts calls in progress and lets one wait for none.
type callCount struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n reaches 0; nil while nobody waits
}

func (c *callCount) add(d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += d
	if c.n == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

func (c *callCount) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// wait waits until no call is in progress or ctx ends, and reports
// whether none is.
func (c *callCount) wait(ctx context.Context) bool {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return true
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	idle := c.idle
	c.mu.Unlock()
	select {
	case <-idle:
		return true
	case <-ctx.Done():
		return false
	}
}

// Aborted reports whether the process was killed at a drain deadline.
func (c *Endpoint) Aborted() bool { return c.aborted.Load() }

// RoundTrip sends one request to the process over its data plane (see
// dataplane.Transport). Once the process is gone it fails with
// dataplane.ErrUnavailable.
func (c *Endpoint) RoundTrip(ctx context.Context, req *dataplane.Request) (*dataplane.Response, error) {
	return c.data.RoundTrip(ctx, req)
}

// Status is a plugin's status for /readyz and /v1/plugins.
type Status struct {
	Name   string `json:"name"`
	State  State  `json:"state"`
	Health string `json:"health,omitempty"`
	// HealthReason is the reason the plugin gave with a degraded or
	// not-ready health. It is for the admin API only: it can name files.
	HealthReason string `json:"health_reason,omitempty"`
	Pid          int    `json:"pid"`
	// Started is when the running process was launched; zero when none
	// runs.
	Started  time.Time `json:"started,omitzero"`
	Restarts int       `json:"restarts"`
	// RestartsInWindow is how many restarts after a failure happened
	// within Policy.Window, the budget Policy.MaxRestarts caps; operator
	// restarts are not among them.
	RestartsInWindow int    `json:"restarts_in_window"`
	Version          string `json:"version"`
	LastError        string `json:"last_error"`
	Required         bool   `json:"required"`
	Mount            string `json:"mount"`
	// DataPlaneConns is how many of the running process's data-plane
	// connections the host has not seen break.
	DataPlaneConns int `json:"data_plane_conns"`
}

// Process supervises one plugin block: it runs the plugin's process, one at
// a time, through starts, health checks, restarts and drains.
type Process struct {
	spec   Spec
	opts   Options
	logger hclog.Logger

	cmds   chan command
	done   chan struct{}
	cancel context.CancelFunc // ends a start or backoff that outlives a Stop deadline

	mu       sync.Mutex
	state    State
	health   string
	reason   string // the plugin's reason for health
	inst     *catalog.Instance
	started  time.Time // when inst was launched
	ep       *Endpoint
	manifest *pluginv1.DescribeResponse
	restarts int
	recent   []time.Time
	lastErr  string
	// lastErrSet is whether lastErr is what SetLastError showed.
	lastErrSet bool
	// first is closed once the first start attempt has ended, ready or
	// not, with firstErr set.
	first    chan struct{}
	firstErr error
	// strict makes any failure of the first start attempt final
	// (StartStandby).
	strict bool
	// active says the Process publishes its state to the metrics; a
	// standby one does not until Activate, a retired one no more.
	active atomic.Bool
}

type commandKind int

const (
	cmdRestart commandKind = iota
	cmdStop
)

type command struct {
	kind     commandKind
	deadline time.Time
	done     chan struct{}
}

// Start launches the plugin's goroutine. It returns once the first start
// attempt has ended: with the plugin ready, or with a config error (the
// plugin's schema or, unless Options.RetryConfigure, its Configure
// refused the config), which is returned and the plugin stopped. A
// plugin that reports its storage corrupt (sdk.ErrStorageCorrupt), or
// whose Configure refuses an attribute under Options.RetryConfigure, is
// left in the failed state with the plugin's message as its last error,
// until Restart, and Start returns nil. Any other failure is left to the
// restart loop and Start returns nil.
func Start(ctx context.Context, spec Spec, opts Options) (*Process, error) {
	return start(ctx, spec, opts, false)
}

// StartStandby starts a process to replace a running one. It returns once
// the process is ready, or else the first attempt's error, whatever it
// was (the binary is not a plugin, fails its pin, crashes, times out or
// refuses its config), and then nothing is left running. The Process
// publishes its state to the metrics only once Activate is called, so
// that the series of the plugin it replaces, which share its name, stay
// right until then.
func StartStandby(ctx context.Context, spec Spec, opts Options) (*Process, error) {
	return start(ctx, spec, opts, true)
}

// Activate makes a Process started with StartStandby publish its state
// to the metrics, as the plugin's current process.
func (p *Process) Activate() {
	p.active.Store(true)
	p.publish()
}

// Retire stops the Process publishing its state to the metrics: another
// Process of the same name has taken its place, and this one is only
// draining. Call Stop as well.
func (p *Process) Retire() { p.active.Store(false) }

// SetLastError shows err as the plugin's last error (Status.LastError),
// such as a replacement that failed while this process kept serving.
func (p *Process) SetLastError(err error) {
	p.mu.Lock()
	p.lastErr, p.lastErrSet = capText(err.Error()), true
	p.mu.Unlock()
	p.publish()
}

// ClearSetLastError clears the error SetLastError showed, unless an error
// of the process's own has replaced it since: what it told of (a
// replacement that failed) no longer stands, such as when the config asks
// again for what this process runs.
func (p *Process) ClearSetLastError() {
	p.mu.Lock()
	cleared := p.lastErrSet
	if cleared {
		p.lastErr, p.lastErrSet = "", false
	}
	p.mu.Unlock()
	if cleared {
		p.publish()
	}
}

func start(ctx context.Context, spec Spec, opts Options, standby bool) (*Process, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &Process{
		cancel: cancel,
		spec:   spec,
		opts:   opts,
		logger: opts.Logger.With("plugin", spec.Name),
		// One slot: a Restart never waits for a plugin that is starting;
		// the loop picks the command up when it can.
		cmds:     make(chan command, 1),
		done:     make(chan struct{}),
		state:    StateStarting,
		first:    make(chan struct{}),
		strict:   standby,
		restarts: opts.Restarts,
	}
	p.active.Store(!standby)
	if opts.Metrics != nil {
		opts.Metrics.InitPlugin(spec.Name)
		opts.Metrics.PluginHungKills.WithLabelValues(spec.Name)
		opts.Metrics.PluginLogDropped.WithLabelValues(spec.Name)
		opts.Metrics.PluginScrapeErrs.WithLabelValues(spec.Name)
	}
	p.publish()
	go p.run(ctx)
	<-p.first
	if p.firstErr != nil {
		p.Stop(time.Now())
		return nil, p.firstErr
	}
	return p, nil
}

// Spec returns the plugin's spec.
func (p *Process) Spec() Spec { return p.spec }

// Name returns the plugin's instance name.
func (p *Process) Name() string { return p.spec.Name }

// Endpoint returns the ready plugin's endpoint, or nil when it is not
// ready (or is ready but reports itself not ready).
func (p *Process) Endpoint() *Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != StateReady || p.health == "not_ready" {
		return nil
	}
	return p.ep
}

// Manifest returns the last Describe answer, or nil before the first.
func (p *Process) Manifest() *pluginv1.DescribeResponse {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.manifest
}

// Status returns a snapshot for the admin API and /readyz.
func (p *Process) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Status{
		Name: p.spec.Name, State: p.state, Health: p.health, HealthReason: p.reason, Restarts: p.restarts,
		LastError: p.lastErr, Required: p.spec.Required, Mount: p.spec.Mount,
	}
	if p.inst != nil {
		s.Pid = p.inst.Pid()
		s.Started = p.started
	}
	now := time.Now()
	for _, t := range p.recent {
		if now.Sub(t) < p.opts.Policy.Window {
			s.RestartsInWindow++
		}
	}
	if p.ep != nil {
		s.DataPlaneConns = p.ep.data.Live()
	}
	if p.manifest != nil {
		s.Version = p.manifest.GetVersion()
	}
	return s
}

// Ready reports whether the plugin serves requests.
func (p *Process) Ready() bool { return p.Endpoint() != nil }

// Families returns the plugin's metric families; it implements
// metrics.Source.
func (p *Process) Families(ctx context.Context) ([][]byte, error) {
	c := p.Endpoint()
	if c == nil {
		return nil, errors.New("plugin is not ready")
	}
	resp, err := c.RPC.Metrics(ctx, &pluginv1.MetricsRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetFamilies(), nil
}

// SetFaults replaces the faults at the ready plugin's fault points and
// returns those now set. Faults live in the plugin process: a restart
// clears them.
func (p *Process) SetFaults(ctx context.Context, faults []*pluginv1.FaultSpec) ([]*pluginv1.FaultSpec, error) {
	c := p.Endpoint()
	if c == nil {
		return nil, ErrNotReady
	}
	resp, err := c.RPC.SetFaults(ctx, &pluginv1.SetFaultsRequest{Faults: faults})
	if err != nil {
		return nil, fmt.Errorf("set faults: %w", err)
	}
	return resp.GetFaults(), nil
}

// ErrNotReady is returned for calls that need a ready plugin.
var ErrNotReady = errors.New("plugin is not ready")

// Restart drains the plugin (with the given deadline) and starts it again,
// also from the failed state. It returns once the restart has begun.
func (p *Process) Restart(deadline time.Time) {
	select {
	case p.cmds <- command{kind: cmdRestart, deadline: deadline}:
	case <-p.done:
	default:
		// A command is already pending; it restarts or stops the plugin.
	}
}

// Stop drains the plugin until deadline, kills what is left and waits for
// the supervisor goroutine to end. It is safe to call more than once.
func (p *Process) Stop(deadline time.Time) {
	// A plugin that is still starting cannot take the command; at the
	// deadline its start is cancelled instead.
	t := time.AfterFunc(time.Until(deadline), p.cancel)
	defer t.Stop()
	defer p.cancel()
	select {
	case p.cmds <- command{kind: cmdStop, deadline: deadline}:
	case <-p.done:
	}
	<-p.done
}

// maxStatusText bounds Status.LastError and Status.HealthReason: they
// come from the plugin (a refusal, a health reason, its last words), and
// every status read (GET /v1/plugins, the status page) carries them.
const maxStatusText = 4 << 10

// capText returns s cut to maxStatusText bytes, at a character's start,
// with a marker saying how much was cut.
func capText(s string) string {
	if len(s) <= maxStatusText {
		return s
	}
	cut := maxStatusText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes cut)", s[:cut], len(s)-cut)
}

func (p *Process) setState(s State, lastErr error) {
	p.mu.Lock()
	p.state = s
	if lastErr != nil {
		p.lastErr, p.lastErrSet = capText(lastErr.Error()), false
	}
	if s != StateReady {
		p.health, p.reason = "", ""
	}
	p.mu.Unlock()
	p.publish()
}

// publish updates metrics and tells the owner; never called with mu held.
func (p *Process) publish() {
	st := p.Status()
	if m := p.opts.Metrics; m != nil && p.active.Load() {
		for _, s := range States {
			v := 0.0
			if s == st.State {
				v = 1
			}
			m.PluginState.WithLabelValues(p.spec.Name, string(s)).Set(v)
		}
		up := 0.0
		if p.Ready() {
			up = 1
		}
		m.PluginUp.WithLabelValues(p.spec.Name).Set(up)
		health := st.Health
		if health == "" {
			health = "ready"
		}
		for _, h := range metrics.HealthStatuses {
			v := 0.0
			if st.State == StateReady && h == health {
				v = 1
			}
			m.PluginHealth.WithLabelValues(p.spec.Name, h).Set(v)
		}
	}
	if p.opts.OnChange != nil {
		p.opts.OnChange()
	}
}

// firstPending reports whether the first start attempt is still going on.
func (p *Process) firstPending() bool {
	select {
	case <-p.first:
		return false
	default:
		return true
	}
}

func (p *Process) firstDone(err error) {
	select {
	case <-p.first:
	default:
		p.firstErr = err
		close(p.first)
	}
}

// run is the plugin's state machine. It owns inst; others read snapshots
// under mu.
func (p *Process) run(ctx context.Context) {
	defer close(p.done)
	pol := p.opts.Policy
	bo := backoff.Backoff{Policy: backoff.Policy{Initial: pol.InitialBackoff, Max: pol.MaxBackoff, Jitter: pol.Jitter}}
	for {
		p.setState(StateStarting, nil)
		inst, err := p.launch(ctx)
		if errors.Is(err, sdk.ErrStorageCorrupt) {
			// Starting again would find the same damage: the plugin
			// waits, failed, for an operator who repaired or restored
			// its data. Its own message is the last error. Only a
			// replacement's first attempt reports it to the caller.
			p.logger.Error("plugin found its storage corrupt; not restarting it", "error", err)
			if p.strict && p.firstPending() {
				p.firstDone(err)
			} else {
				p.firstDone(nil)
			}
			if !p.waitFailed(ctx, err) {
				return
			}
			bo.Reset()
			continue
		}
		refused := errors.Is(err, ErrConfigRefused) && !p.retries(err)
		if refused || err != nil && p.strict && p.firstPending() {
			switch {
			case refused && p.strict && p.firstPending():
				// A replacement: the host keeps the process it replaces.
				p.logger.Error("replacement process refused its config; not starting it", "error", err)
			case refused:
				p.logger.Error("plugin refused its config; not restarting it", "error", err)
			case ctx.Err() != nil:
				// The host is shutting down: not a failure to report.
				p.logger.Info("replacement process start cancelled by the shutdown", "error", err)
			default:
				p.logger.Error("replacement process did not start", "error", err)
			}
			if p.strict || p.configureFailure(err) == nil {
				p.firstDone(err)
			} else {
				// Contained: the plugin is listed, failed, with why.
				p.firstDone(nil)
			}
			if !p.waitFailed(ctx, err) {
				return
			}
			bo.Reset()
			continue
		}
		if err != nil {
			p.firstDone(nil) // the restart loop takes it from here
		}
		var reason error
		if err == nil {
			data := inst.Transport()
			p.logger.Info("plugin ready", "pid", inst.Pid(), "version", inst.Manifest().GetVersion(), "data_plane_conns", data.Live())
			var cmd *command
			ep := NewEndpoint(inst.RPC(), data)
			cmd, reason = p.watch(ctx, inst, ep, &bo)
			if cmd != nil {
				switch cmd.kind {
				case cmdStop:
					p.drainAndKill(inst, ep, cmd.deadline)
					p.setState(StateStopped, nil)
					return
				case cmdRestart:
					// An operator's restart is counted, but not against
					// max_restarts: that budget is for crashes.
					p.drainAndKill(inst, ep, cmd.deadline)
					p.countRestart(metrics.RestartOperator, false)
					bo.Reset()
					continue
				}
			}
			if errors.Is(reason, errUnhealthy) {
				// A process that does not answer health checks would not
				// answer go-plugin's graceful shutdown either: waiting
				// for it would only lengthen the outage.
				p.logger.Warn("killing plugin that failed its health checks", "pid", inst.Pid())
				if m := p.opts.Metrics; m != nil {
					m.PluginHungKills.WithLabelValues(p.spec.Name).Inc()
				}
				inst.ForceKill()
			} else {
				inst.Kill()
			}
			p.mu.Lock()
			p.inst, p.ep = nil, nil
			p.mu.Unlock()
		} else {
			reason = err
		}
		p.logger.Warn("plugin down", "error", reason)
		// A Configure that refused under RetryConfigure is no crash: the
		// plugin ran and said why it cannot start yet (a full disk, say).
		// It is retried at the backoff's pace for as long as it refuses,
		// without spending max_restarts, so that it comes up by itself
		// once the cause is gone, however long that takes.
		if p.countRestart(metrics.RestartFailure, err == nil || !p.retries(err)) {
			p.logger.Error("plugin failed: too many restarts", "max_restarts", pol.MaxRestarts, "window", pol.Window, "error", reason)
			if !p.waitFailed(ctx, reason) {
				return
			}
			bo.Reset()
			continue
		}
		d := bo.Next()
		p.setState(StateBackoff, reason)
		p.logger.Info("restarting plugin after backoff", "backoff", d)
		if cmd := p.sleep(ctx, d); cmd != nil {
			if cmd.kind == cmdStop {
				p.setState(StateStopped, nil)
				return
			}
			bo.Reset()
		}
	}
}

// countRestart records a restart about to happen, for reason (one of
// metrics.RestartReasons). For a crash it first checks the budget: when
// the plugin has already restarted MaxRestarts times within Window it
// reports true, and no restart is counted because none will happen.
func (p *Process) countRestart(reason string, crash bool) (failed bool) {
	now := time.Now()
	p.mu.Lock()
	if crash {
		keep := p.recent[:0]
		for _, t := range p.recent {
			if now.Sub(t) < p.opts.Policy.Window {
				keep = append(keep, t)
			}
		}
		p.recent = keep
		if len(p.recent) >= p.opts.Policy.MaxRestarts {
			p.mu.Unlock()
			return true
		}
		p.recent = append(p.recent, now)
	}
	p.restarts++
	p.mu.Unlock()
	if m := p.opts.Metrics; m != nil {
		m.PluginRestarts.WithLabelValues(p.spec.Name, reason).Inc()
	}
	return false
}

// waitFailed parks the plugin in the failed state until an operator
// restarts it. It returns false when the plugin should stop.
func (p *Process) waitFailed(ctx context.Context, reason error) bool {
	p.setState(StateFailed, reason)
	select {
	case cmd := <-p.cmds:
		if cmd.kind == cmdStop {
			p.setState(StateStopped, nil)
			return false
		}
		p.mu.Lock()
		p.recent = nil
		p.mu.Unlock()
		return true
	case <-ctx.Done():
		p.setState(StateStopped, nil)
		return false
	}
}

// sleep waits out a backoff; a command cuts it short.
func (p *Process) sleep(ctx context.Context, d time.Duration) *command {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case cmd := <-p.cmds:
		return &cmd
	case <-ctx.Done():
		return &command{kind: cmdStop, deadline: time.Now()}
	}
}

// ErrConfigRefused is wrapped by the error of a start whose config was
// refused, by the plugin's declared schema (the error also wraps the
// decoder's diagnostics) or by the plugin's Configure hook (it also wraps
// the plugin's *sdk.ConfigError). Such a start is not retried, unless
// the plugin's Configure failed without naming an attribute and
// Options.RetryConfigure is set.
var ErrConfigRefused = errors.New("config refused")

// configureFailure returns the *sdk.ConfigError of err, a failed start,
// when its Configure failed and Options.RetryConfigure contains that;
// otherwise nil.
func (p *Process) configureFailure(err error) *sdk.ConfigError {
	var ce *sdk.ConfigError
	if p.opts.RetryConfigure && errors.As(err, &ce) {
		return ce
	}
	return nil
}

// retries reports whether the refused start err goes to the restart
// loop: a failure of Configure that names no attribute, under
// Options.RetryConfigure.
func (p *Process) retries(err error) bool {
	ce := p.configureFailure(err)
	return ce != nil && ce.Attribute == ""
}

// refusal is a refused config: err, which it reads as, and ErrConfigRefused.
type refusal struct{ err error }

func (e *refusal) Error() string   { return e.err.Error() }
func (e *refusal) Unwrap() []error { return []error{ErrConfigRefused, e.err} }

// launch starts the plugin and configures it. A config that the schema or
// the plugin refused is an error wrapping ErrConfigRefused.
func (p *Process) launch(ctx context.Context) (*catalog.Instance, error) {
	limit := p.spec.LogLimit
	if m := p.opts.Metrics; m != nil {
		dropped := m.PluginLogDropped.WithLabelValues(p.spec.Name)
		limit.Dropped = func(n int) { dropped.Add(float64(n)) }
	}
	started := time.Now()
	inst, err := catalog.Launch(ctx, p.spec.Path, p.spec.SHA256, catalog.Options{
		Logger:       p.opts.Logger.Named(p.spec.Name).With("plugin", p.spec.Name),
		StartTimeout: p.opts.Policy.StartTimeout,
		ExtraEnv:     p.spec.Env,
		Dir:          p.spec.Dir,
		Host:         p.opts.Host,
		SocketDir:    p.opts.SocketDir,
		LogLimit:     limit,
	})
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	m := inst.Manifest()
	p.mu.Lock()
	p.manifest = m
	p.inst, p.started = inst, started
	p.mu.Unlock()
	cfg, err := p.spec.Decode(m.GetConfigSchema())
	if err != nil {
		inst.Kill()
		p.clearInst()
		return nil, fmt.Errorf("plugin %q config: %w", p.spec.Name, &refusal{err})
	}
	if err := os.MkdirAll(p.spec.DataDir, 0o750); err != nil {
		inst.Kill()
		p.clearInst()
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.opts.Policy.StartTimeout)
	defer cancel()
	if err := inst.Configure(cctx, p.spec.Name, cfg, p.spec.DataDir, configureLimits(p.spec, p.opts.Policy.Limits)); err != nil {
		inst.Kill()
		p.clearInst()
		var ce *sdk.ConfigError
		if !errors.As(err, &ce) {
			return nil, err
		}
		err = fmt.Errorf("plugin %q config: %w", p.spec.Name, &refusal{err})
		if ce.Attribute != "" && p.spec.Locate != nil {
			if at := p.spec.Locate(ce.Attribute); at != "" {
				err = &LocatedError{At: at, Err: err}
			}
		}
		return nil, err
	}
	return inst, nil
}

// LocatedError is a refusal of the plugin's Configure with the place in
// the config file it blames (Spec.Locate): "At: Err".
type LocatedError struct {
	At  string
	Err error
}

func (e *LocatedError) Error() string { return e.At + ": " + e.Err.Error() }
func (e *LocatedError) Unwrap() error { return e.Err }

func (p *Process) clearInst() {
	p.mu.Lock()
	p.inst, p.ep = nil, nil
	p.mu.Unlock()
}

// errUnhealthy is wrapped by the reason watch gives for a process that
// failed Policy.HealthFailures health checks in a row, and so starts its
// last error. Such a process is hung or wedged: run SIGKILLs it at once,
// without the graceful shutdown over its control connection that it
// could not answer, before it goes down as any other failed process.
var errUnhealthy = errors.New("unhealthy")

// exitGrace is how long a plugin whose data plane broke is given to be
// seen exiting, which is the likelier reason.
const exitGrace = time.Second

// watch keeps a ready plugin: it health-checks it and waits for it to exit
// or for a command. It returns the command, or why the plugin went down.
func (p *Process) watch(ctx context.Context, inst *catalog.Instance, ep *Endpoint, bo *backoff.Backoff) (*command, error) {
	pol := p.opts.Policy
	p.mu.Lock()
	p.ep = ep
	p.mu.Unlock()
	p.setState(StateReady, nil)
	p.firstDone(nil)

	stable := time.NewTimer(pol.StableAfter)
	defer stable.Stop()
	tick := time.NewTicker(pol.HealthInterval)
	defer tick.Stop()
	fails := 0
	for {
		select {
		case <-inst.Exited():
			return nil, inst.ExitError("")
		case <-ep.data.Done():
			// No request can reach the process any more. Most often it
			// has died, and its sockets closed a moment before its exit
			// is seen: say so if it has.
			select {
			case <-inst.Exited():
				return nil, inst.ExitError("")
			case <-time.After(exitGrace):
				return nil, errors.New("every data-plane connection broke")
			}
		case cmd := <-p.cmds:
			return &cmd, nil
		case <-ctx.Done():
			return &command{kind: cmdStop, deadline: time.Now()}, nil
		case <-stable.C:
			p.logger.Debug("plugin stable; the next restart waits the initial backoff", "stable_after", pol.StableAfter)
			bo.Reset()
		case <-tick.C:
			h, reason, err := p.check(ctx, inst)
			if err != nil {
				fails++
				p.logger.Warn("health check failed", "consecutive", fails, "error", err)
				if fails >= pol.HealthFailures {
					return nil, fmt.Errorf("%w: %d consecutive failed health checks, killed as hung: %w", errUnhealthy, fails, err)
				}
				continue
			}
			fails = 0
			reason = capText(reason)
			p.mu.Lock()
			changed := p.health != h || p.reason != reason
			p.health, p.reason = h, reason
			p.mu.Unlock()
			if changed {
				p.publish()
			}
		}
	}
}

// check asks the plugin for its health: "degraded", "not_ready" or ""
// for ready, with the plugin's reason.
func (p *Process) check(ctx context.Context, inst *catalog.Instance) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Policy.HealthTimeout)
	defer cancel()
	resp, err := inst.RPC().Health(ctx, &pluginv1.HealthRequest{})
	if err != nil {
		return "", "", err
	}
	switch resp.GetStatus() {
	case pluginv1.HealthResponse_STATUS_DEGRADED:
		return "degraded", resp.GetReason(), nil
	case pluginv1.HealthResponse_STATUS_NOT_READY:
		return "not_ready", resp.GetReason(), nil
	}
	return "", "", nil
}

// drainAndKill asks the plugin to drain until deadline, then ends it: once
// nothing is left in flight and the host has read every answer (StartCall), or
// by SIGKILL when the deadline passed before that. Then it closes ep.
func (p *Process) drainAndKill(inst *catalog.Instance, ep *Endpoint, deadline time.Time) {
	p.setState(StateDraining, nil)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	resp, err := inst.RPC().Drain(ctx, &pluginv1.DrainRequest{DeadlineUnixNano: deadline.UnixNano()})
	switch {
	case err != nil:
		p.logger.Warn("drain did not finish; killing plugin", "error", err)
		ep.aborted.Store(true)
		inst.ForceKill()
	case resp.GetAbandoned() > 0:
		p.logger.Warn("drain deadline passed; killing plugin", "completed", resp.GetCompleted(), "abandoned", resp.GetAbandoned())
		ep.aborted.Store(true)
		inst.ForceKill()
	case !p.waitAnswers(ctx, ep):
		// The plugin answered everything, yet answers were still not
		// read at the deadline: they are lost with the process.
		p.logger.Warn("drain deadline passed with answers in transit; killing plugin", "completed", resp.GetCompleted())
		ep.aborted.Store(true)
		inst.ForceKill()
	default:
		p.logger.Info("plugin drained", "completed", resp.GetCompleted())
		inst.Kill()
	}
	p.clearInst()
}
