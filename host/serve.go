package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plughost/plughost/host/admin"
	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
)

// shutdownSlack is how long after the drain deadline the host allows for
// killing plugins, answering abandoned requests and closing listeners; the
// host exits within drain_deadline + 1s.
const shutdownSlack = 600 * time.Millisecond

// validate reports every problem it can find in one run, sorted by file
// and line: the host settings, every plugin block whose binary it can
// find (even when the host settings are broken, or the file has syntax
// errors elsewhere), each binary, and each plugin's config block as its
// schema and its Configure hook judge it.
func validate(ctx context.Context, logger hclog.Logger, path string, stdout, stderr io.Writer) error {
	cfg, diags := config.Load(path)
	diags = append(diags, checkTokenFile(cfg)...)
	binDiags, usable := checkBinaries(cfg)
	diags = append(diags, binDiags...)
	if len(usable) > 0 {
		// The plugins launched for Describe make their sockets in a
		// directory of this run's own, removed when it ends.
		sockets, _, err := catalog.OpenSocketDir("", "")
		if err != nil {
			return err
		}
		defer sockets.Close()
		diags = append(diags, describeAll(ctx, logger, cfg, usable, describeMode{strict: true, configure: true}, sockets.Path())...)
	}
	config.SortDiagnostics(diags)
	if len(diags) > 0 {
		printDiags(stderr, cfg, diags)
	}
	if diags.HasErrors() {
		return errReported
	}
	noun := "plugins"
	if len(cfg.Plugins) == 1 {
		noun = "plugin"
	}
	fmt.Fprintf(stdout, "%s: valid (%d %s)\n", path, len(cfg.Plugins), noun)
	return nil
}

// logStaleSockets says which plugin sockets a killed run of this host
// (one with the same data directory) left behind and OpenSocketDir
// removed. Directories of other dead processes of this user (another
// host's, a killed validate's) and those without sockets are no news to
// this host's operator: they are logged at debug.
func logStaleSockets(logger hclog.Logger, removed []catalog.StaleSocketDir, dataDir string) {
	var ours, others []string
	sockets := 0
	for _, d := range removed {
		if d.Owner == dataDir && d.Sockets > 0 {
			ours = append(ours, d.Path)
			sockets += d.Sockets
		} else {
			others = append(others, d.Path)
		}
	}
	if len(ours) > 0 {
		logger.Info("removed plugin sockets a killed host left behind", "sockets", sockets, "dirs", ours)
	}
	if len(others) > 0 {
		logger.Debug("removed socket directories other dead plughost processes left behind", "dirs", others)
	}
}

// host is a running host: its plugins, ingress and metrics.
type host struct {
	logger  hclog.Logger
	metrics *metrics.Host
	ingress *ingress.Ingress
	// ctx is the plugins' lifetime: its end stops them all.
	ctx context.Context
	// changes is ctx for reloads, restarts and upgrades: shutdown cancels
	// it first, so that one in progress gives up at once (see
	// startProcess and stopProcess) rather than delay the shutdown.
	changes       context.Context
	cancelChanges context.CancelFunc

	// reloadMu serialises reloads, replacements and shutdown.
	reloadMu sync.Mutex
	cfg      *config.Config
	closed   bool // shutdown has begun; under reloadMu
	// drainDeadline is cfg's drain_deadline, readable without reloadMu
	// by a shutdown that must not wait for a reload.
	drainDeadline atomic.Int64
	// background runs the reload loop, operator restarts and upgrades,
	// and the drains of replaced processes; serve waits for it.
	background sync.WaitGroup

	mu      sync.Mutex
	plugins map[string]*supervisor.Process

	// updateMu serialises routing-table rebuilds, so that a rebuild from
	// an older snapshot of plugins cannot replace a newer one.
	// writeTimeout is the ingress server's write timeout, fixed at start.
	writeTimeout time.Duration

	updateMu sync.Mutex

	// socketDir holds the plugins' go-plugin sockets (catalog.SocketDir).
	socketDir string

	// admin is the admin API, whose fault endpoints a reload of
	// debug.faults turns on or off; set before the first reload.
	admin *admin.Server
}

func serve(ctx context.Context, logger hclog.Logger, path string, stderr io.Writer) error {
	cfg, diags := config.Load(path)
	if !diags.HasErrors() {
		binDiags, _ := checkBinaries(cfg)
		diags = append(diags, binDiags...)
		diags = append(diags, checkTokenFile(cfg)...)
	}
	if diags.HasErrors() {
		printDiags(stderr, cfg, diags)
		return errReported
	}
	token, tdiags := readToken(cfg)
	if tdiags.HasErrors() {
		printDiags(stderr, cfg, tdiags)
		return errReported
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("ingress listener: %w", err)
	}
	defer ln.Close()
	adminLn, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	defer adminLn.Close()

	sockets, removed, err := catalog.OpenSocketDir("", cfg.DataDir)
	logStaleSockets(logger, removed, cfg.DataDir)
	if err != nil {
		return err
	}
	defer sockets.Close()

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	h := &host{
		logger:  logger,
		metrics: metrics.New(),
		ctx:     ctx,
		plugins: map[string]*supervisor.Process{},
	}
	h.changes, h.cancelChanges = context.WithCancel(ctx)
	defer h.cancelChanges()
	h.writeTimeout = cfg.Limits.WriteTimeout
	ln, adminLn = limitListeners(logger, h.metrics, cfg, ln, adminLn)
	h.socketDir = sockets.Path()
	h.ingress = ingress.New(logger.Named("ingress"), h.metrics, ingressLimits(cfg))
	h.ingress.HideCookie(admin.SessionCookie)
	h.metrics.ReportReadiness(h.ingress.Ready)
	if diags := h.apply(cfg); diags.HasErrors() {
		printDiags(stderr, cfg, diags)
		h.stopAll(time.Now().Add(cfg.DrainDeadline))
		return errReported
	}

	srv := &http.Server{
		Handler:           h.ingress,
		ReadTimeout:       cfg.Limits.ReadTimeout,
		ReadHeaderTimeout: cfg.Limits.ReadTimeout,
		WriteTimeout:      cfg.Limits.WriteTimeout,
		IdleTimeout:       cfg.Limits.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          logger.Named("http").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	gatherer := &metrics.Gatherer{Host: h.metrics, Sources: h.sources, Timeout: cfg.Health.Timeout, Logger: logger.Named("metrics")}
	adminHandler := admin.New(gatherer, h, admin.Options{Token: token, Faults: cfg.Debug.Faults,
		Stats: h.metrics.Registry, Logger: logger.Named("admin"), Hosts: adminHosts(cfg)})
	defer adminHandler.Close()
	h.admin = adminHandler
	adminSrv := &http.Server{
		Handler:           adminHandler,
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       adminIdleTimeout,
		// OPTIONS * then reaches the handler, which answers it the JSON
		// 404 of any target that names no endpoint.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     logger.Named("admin").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	front := ingress.NewFront(ln, h.ingress, ingress.FrontOptions{
		ReadHeaderTimeout: cfg.Limits.ReadTimeout,
		IdleTimeout:       cfg.Limits.IdleTimeout,
		WriteTimeout:      cfg.Limits.WriteTimeout,
		Direct:            h.ingress.Direct,
		Logger:            logger.Named("http"),
	})
	ingress.HookServer(srv)
	ingress.HookServer(adminSrv)
	errc := make(chan error, 3)
	go func() { errc <- front.Serve() }()
	go func() { errc <- srv.Serve(front.Listener()) }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	// Before the host says it runs: from then on an operator, systemd's
	// ExecReload or a test may send SIGHUP, whose default is to end the
	// process. Signals that arrive before the loop below wait for it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	logger.Info("plughost running", "version", version, "listen", ln.Addr().String(),
		"admin", adminLn.Addr().String(), "plugins", len(cfg.Plugins), "pid", os.Getpid())
	sd := startNotifier(logger, h.ingress.Ready)
	defer sd.close()

	// Reloads run one at a time beside the signal loop, so that SIGTERM
	// is seen while one is in progress. At most one more waits: SIGHUPs
	// that arrive meanwhile join it, as the file is read when it begins.
	reloads := make(chan struct{}, 1)
	h.background.Go(func() {
		for {
			select {
			case <-h.changes.Done():
				return
			case <-reloads:
				sd.reloading()
				h.reload(path)
				sd.reloaded()
			}
		}
	})
	for {
		select {
		case err := <-errc:
			sd.stopping()
			h.cancelChanges()
			h.stopAll(time.Now())
			h.background.Wait()
			return fmt.Errorf("serve: %w", err)
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				select {
				case reloads <- struct{}{}:
					logger.Debug("reload queued", "signal", sig.String())
				default:
					logger.Info("reload already queued; this signal joins it", "signal", sig.String())
				}
				continue
			}
			logger.Info("shutting down", "signal", sig.String(), "drain_deadline", h.drainDeadlineNow())
			sd.stopping()
			h.shutdown(front, srv, adminSrv)
			h.background.Wait()
			logger.Info("shutdown complete")
			return nil
		case <-ctx.Done():
			// The caller of run gave up; the plugins, started with ctx,
			// are already being stopped.
			logger.Info("shutting down", "reason", "context done", "drain_deadline", h.drainDeadlineNow())
			sd.stopping()
			h.shutdown(front, srv, adminSrv)
			h.background.Wait()
			logger.Info("shutdown complete")
			return nil
		}
	}
}

// drainDeadlineNow is the running config's drain_deadline.
func (h *host) drainDeadlineNow() time.Duration {
	return time.Duration(h.drainDeadline.Load())
}

// setConfig makes cfg the running config; the caller holds reloadMu.
func (h *host) setConfig(cfg *config.Config) {
	h.cfg = cfg
	h.drainDeadline.Store(int64(cfg.DrainDeadline))
}

// shutdown drains everything within the drain deadline, counted from
// now: a reload, restart or upgrade in progress gives up (a new process
// it was starting is stopped), /readyz turns 503, the listeners close,
// every plugin drains in parallel and is killed at the deadline, and the
// requests it abandoned are answered with 503. A process that was already
// draining, replaced or removed by a reload, keeps the deadline it was
// given then.
func (h *host) shutdown(front *ingress.Front, srv, adminSrv *http.Server) {
	h.cancelChanges()
	deadline := time.Now().Add(h.drainDeadlineNow())
	h.ingress.SetDraining()
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(shutdownSlack))
	defer cancel()
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := front.Shutdown(ctx); err != nil {
				h.logger.Warn("ingress did not close in time", "error", err)
			}
		})
		if err := srv.Shutdown(ctx); err != nil {
			h.logger.Warn("ingress did not close in time", "error", err)
			_ = srv.Close()
		}
		wg.Wait()
	}()
	// The change in progress, cancelled, lets go of the lock soon.
	h.stopAll(deadline)
	<-srvDone
	actx, acancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer acancel()
	if err := adminSrv.Shutdown(actx); err != nil {
		_ = adminSrv.Close()
	}
}

func (h *host) stopAll(deadline time.Time) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	h.closed = true
	h.stopAllLocked(deadline)
}

func (h *host) stopAllLocked(deadline time.Time) {
	h.mu.Lock()
	ps := make([]*supervisor.Process, 0, len(h.plugins))
	for _, p := range h.plugins {
		ps = append(ps, p)
	}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(deadline)
		}()
	}
	wg.Wait()
}

// apply makes the running plugins match cfg: removed plugins drain and
// stop, changed ones restart, new ones start. It returns config errors for
// new plugins whose config their declared schema refuses, which are not
// running, and for changed plugins whose replacement did not start, which
// keep their running process. A plugin whose Configure fails is not an
// error here: it is listed, failing, and retried under the restart
// policy.
func (h *host) apply(cfg *config.Config) hcl.Diagnostics {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	return h.applyLocked(cfg)
}

func (h *host) applyLocked(cfg *config.Config) hcl.Diagnostics {
	want := map[string]config.PluginBlock{}
	for _, p := range cfg.Plugins {
		want[p.Name] = p
	}
	deadline := time.Now().Add(cfg.DrainDeadline)
	h.mu.Lock()
	var stop, same []*supervisor.Process
	replaced := map[string]*supervisor.Process{}
	for name, p := range h.plugins {
		w, ok := want[name]
		switch {
		case !ok:
			stop = append(stop, p)
			delete(h.plugins, name)
		case fingerprint(cfg, w) != p.Spec().Fingerprint:
			replaced[name] = p
		default:
			same = append(same, p)
		}
	}
	var start []config.PluginBlock
	for _, p := range cfg.Plugins {
		if _, ok := h.plugins[p.Name]; !ok {
			start = append(start, p)
		}
	}
	h.mu.Unlock()
	h.update()
	// The config asks for what these run: a replacement an earlier reload
	// failed to make no longer stands.
	for _, p := range same {
		p.ClearSetLastError()
	}

	// Removed plugins leave the routing table at once and drain.
	var wg sync.WaitGroup
	for _, p := range stop {
		wg.Go(func() {
			h.logger.Info("stopping plugin", "plugin", p.Name())
			if h.stopProcess(p, deadline) {
				h.metrics.Forget(p.Name())
			}
		})
	}
	wg.Wait()

	prev := h.cfg
	opts := h.options(cfg)
	prevOpts := opts
	if prev != nil {
		prevOpts = h.options(prev)
	}
	diags := make([]hcl.Diagnostics, len(start)+len(replaced))
	for i, pc := range start {
		wg.Go(func() {
			p, err := h.startProcess(supervisor.Start, specFor(cfg, pc), opts)
			if err != nil {
				diags[i] = configErrDiag(pc, err)
				return
			}
			h.mu.Lock()
			h.plugins[pc.Name] = p
			h.mu.Unlock()
		})
	}
	i := len(start)
	for name, old := range replaced {
		pc, d := want[name], &diags[i]
		i++
		wg.Go(func() {
			h.logger.Info("replacing plugin", "plugin", name)
			if err := h.replace(old, specFor(cfg, pc), opts, prevOpts, cfg.DrainDeadline); err != nil {
				*d = replaceDiag(pc, err)
			}
		})
	}
	wg.Wait()
	h.setConfig(cfg)
	h.update()
	var out hcl.Diagnostics
	for _, d := range diags {
		out = append(out, d...)
	}
	return out
}

// replaceDiag turns a failed replacement into a diagnostic: the plugin's
// refusal of its config on its config block, any other failure on its
// path.
func replaceDiag(p config.PluginBlock, err error) hcl.Diagnostics {
	var ce *sdk.ConfigError
	if errors.As(err, &ce) {
		return configErrDiag(p, err)
	}
	return hcl.Diagnostics{diagErr(p.PathRange, "Plugin replacement did not start", err.Error())}
}

// options returns the supervisor options for plugins started under cfg.
func (h *host) options(cfg *config.Config) supervisor.Options {
	return supervisor.Options{
		Logger:    h.logger.Named("supervisor"),
		Metrics:   h.metrics,
		Host:      h.ingress,
		OnChange:  h.update,
		SocketDir: h.socketDir,
		// A plugin whose Configure fails is shown failing, and retried
		// unless it refused an attribute (a config error, not a passing
		// failure); the host and the other plugins keep serving.
		RetryConfigure: true,
		Policy: supervisor.Policy{
			InitialBackoff: cfg.Restart.InitialBackoff,
			MaxBackoff:     cfg.Restart.MaxBackoff,
			MaxRestarts:    cfg.Restart.MaxRestarts,
			Window:         cfg.Restart.Window,
			StableAfter:    cfg.Restart.StableAfter,
			HealthInterval: cfg.Health.Interval,
			HealthTimeout:  cfg.Health.Timeout,
			HealthFailures: cfg.Health.Failures,
			StartTimeout:   cfg.Limits.StartTimeout,
			Limits: &pluginv1.Limits{
				MaxBodyBytes:     cfg.Limits.MaxBodyBytes,
				RequestTimeoutMs: cfg.Limits.RequestTimeout.Milliseconds(),
			},
		},
	}
}

// reload re-reads the config file. A config with errors is rejected with
// its diagnostics in the log and the running plugins stay as they are.
func (h *host) reload(path string) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	if h.closed || h.changes.Err() != nil {
		return
	}
	h.logger.Info("reloading config", "file", path)
	cfg, diags := config.Load(path)
	if !diags.HasErrors() {
		binDiags, _ := checkBinaries(cfg)
		diags = append(diags, binDiags...)
	}
	if !diags.HasErrors() {
		// Check changed and new plugins against their schemas before
		// anything running is touched.
		var changed []config.PluginBlock
		h.mu.Lock()
		for _, p := range cfg.Plugins {
			if cur, ok := h.plugins[p.Name]; !ok || cur.Spec().Fingerprint != fingerprint(cfg, p) {
				changed = append(changed, p)
			}
		}
		h.mu.Unlock()
		diags = append(diags, describeAll(h.changes, h.logger, cfg, changed, describeMode{}, h.socketDir)...)
	}
	if h.changes.Err() != nil {
		h.logger.Info("config reload cut short: the host is shutting down")
		return
	}
	if diags.HasErrors() {
		var b strings.Builder
		printDiags(&b, cfg, diags)
		h.logger.Error("config reload rejected; keeping the running config", "diagnostics", b.String())
		h.metrics.Reloads.WithLabelValues("rejected").Inc()
		return
	}
	if len(diags) > 0 {
		// Warnings only, such as a changed plugin that did not start for
		// the checks: the reload goes ahead and the supervisor retries it.
		var b strings.Builder
		printDiags(&b, cfg, diags)
		h.logger.Warn("config reload has warnings", "diagnostics", b.String())
	}
	if h.cfg != nil {
		h.warnStatic(h.cfg, cfg)
		h.reloadToken(h.cfg, cfg)
		if cfg.Debug.Faults != h.cfg.Debug.Faults {
			h.reloadFaults(cfg.Debug.Faults)
		}
	}
	limits := ingressLimits(cfg)
	// The HTTP server keeps the write timeout it started with, so the
	// ingress must keep extending deadlines against that one.
	limits.WriteTimeout = h.writeTimeout
	h.ingress.SetLimits(limits)
	diags = h.applyLocked(cfg)
	if h.changes.Err() != nil {
		h.logger.Info("config reload cut short: the host is shutting down")
		return
	}
	if diags.HasErrors() {
		var b strings.Builder
		printDiags(&b, cfg, diags)
		h.logger.Error("plugins refused their new config", "diagnostics", b.String())
		h.metrics.Reloads.WithLabelValues("plugins_refused").Inc()
		return
	}
	h.logger.Info("config reloaded", "plugins", len(cfg.Plugins))
	h.metrics.Reloads.WithLabelValues("applied").Inc()
}

// warnStatic logs the settings a reload cannot change: they are bound to
// listeners and servers that keep running.
func (h *host) warnStatic(old, cfg *config.Config) {
	var keys []string
	if cfg.Listen != old.Listen {
		keys = append(keys, "listen")
	}
	if cfg.Admin.Listen != old.Admin.Listen || cfg.Admin.TokenFile != old.Admin.TokenFile ||
		!slices.Equal(cfg.Admin.Hosts, old.Admin.Hosts) {
		keys = append(keys, "admin")
	}
	if cfg.Limits.MaxConns != old.Limits.MaxConns || cfg.Limits.MaxConnsPerIP != old.Limits.MaxConnsPerIP {
		keys = append(keys, "limits.max_conns/max_conns_per_ip")
	}
	if cfg.Limits.ReadTimeout != old.Limits.ReadTimeout || cfg.Limits.IdleTimeout != old.Limits.IdleTimeout ||
		cfg.Limits.WriteTimeout != old.Limits.WriteTimeout {
		keys = append(keys, "limits.read_timeout/write_timeout/idle_timeout")
	}
	if cfg.Health.Timeout != old.Health.Timeout {
		keys = append(keys, "health.timeout (as the metrics scrape timeout; plugins started from now on use the new one)")
	}
	if len(keys) > 0 {
		h.logger.Warn("these settings do not change on reload; restart the host to apply them", "keys", strings.Join(keys, ", "))
	}
}

// reloadToken applies a reload's admin token file. When it is the file
// the host runs with and now holds another token, that token applies at
// once and every status page session ends (admin.Server.SetToken), so
// that an operator rotates the token with a reload. A file that is
// unusable is warned of, with the diagnostics run would print, and the
// running token stays; a restart would fail. Setting, removing or
// renaming token_file takes a restart (warnStatic says so).
func (h *host) reloadToken(old, cfg *config.Config) {
	if cfg.Admin.TokenFile == "" {
		return
	}
	diags := checkTokenFile(cfg)
	var token string
	if !diags.HasErrors() {
		token, diags = readToken(cfg)
	}
	if diags.HasErrors() {
		for _, d := range diags {
			d.Severity = hcl.DiagWarning
		}
		var b strings.Builder
		printDiags(&b, cfg, diags)
		h.logger.Warn("admin token file unusable; the host keeps the token it runs with, but would not start with this file",
			"diagnostics", b.String())
		return
	}
	if cfg.Admin.TokenFile == old.Admin.TokenFile && h.admin.SetToken(token) {
		h.logger.Info("admin token changed: the new token applies now, and status page sessions have ended")
	}
}

// reloadFaults applies a reload's debug.faults: the admin API's fault
// endpoints follow it at once. Turned off, it also clears the faults set
// at every plugin's fault points, which the endpoints can no longer
// clear: an operator who turns fault injection off expects none left.
func (h *host) reloadFaults(on bool) {
	h.admin.SetFaultsEnabled(on)
	if on {
		h.logger.Warn("fault injection turned on: POST /v1/plugins/NAME/faults is allowed")
		return
	}
	h.mu.Lock()
	plugins := make([]*supervisor.Process, 0, len(h.plugins))
	for _, p := range h.plugins {
		plugins = append(plugins, p)
	}
	h.mu.Unlock()
	for _, p := range plugins {
		ctx, cancel := context.WithTimeout(h.changes, 5*time.Second)
		_, err := p.SetFaults(ctx, nil)
		cancel()
		// A plugin not ready starts its next process without faults; one
		// without fault points has none.
		if err != nil && !errors.Is(err, supervisor.ErrNotReady) && status.Code(errors.Unwrap(err)) != codes.Unimplemented {
			h.logger.Warn("cannot clear the plugin's faults; restart it to clear them", "plugin", p.Spec().Name, "error", err)
		}
	}
	h.logger.Info("fault injection turned off; faults cleared")
}

func ingressLimits(cfg *config.Config) ingress.Limits {
	return ingress.Limits{
		MaxBodyBytes:   cfg.Limits.MaxBodyBytes,
		RequestTimeout: cfg.Limits.RequestTimeout,
		WriteTimeout:   cfg.Limits.WriteTimeout,
		BodyTimeout:    cfg.Limits.BodyTimeout,
		StreamLimits: ingress.StreamLimits{
			MaxStreamsPerIP:    cfg.Limits.MaxStreamsPerIP,
			StreamWriteTimeout: cfg.Limits.StreamWriteTimeout,
			StreamMaxLifetime:  cfg.Limits.StreamMaxLifetime,
			StreamBuffer:       cfg.Limits.StreamBuffer,
		},
	}
}

// update rebuilds the ingress routing table.
func (h *host) update() {
	h.updateMu.Lock()
	defer h.updateMu.Unlock()
	h.mu.Lock()
	ts := make([]ingress.Target, 0, len(h.plugins))
	for _, p := range h.plugins {
		ts = append(ts, p)
	}
	h.mu.Unlock()
	h.ingress.Update(ts)
}

func (h *host) sources() []metrics.Source {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]metrics.Source, 0, len(h.plugins))
	for _, p := range h.plugins {
		out = append(out, p)
	}
	return out
}

// Statuses implements admin.Plugins.
func (h *host) Statuses() []supervisor.Status {
	h.mu.Lock()
	out := make([]supervisor.Status, 0, len(h.plugins))
	ps := make([]*supervisor.Process, 0, len(h.plugins))
	for _, p := range h.plugins {
		ps = append(ps, p)
	}
	h.mu.Unlock()
	for _, p := range ps {
		out = append(out, p.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// SetFaults implements admin.Plugins.
func (h *host) SetFaults(ctx context.Context, name string, faults []admin.Fault) ([]admin.Fault, error) {
	h.mu.Lock()
	p, ok := h.plugins[name]
	h.mu.Unlock()
	if !ok {
		return nil, admin.ErrNoPlugin
	}
	specs := make([]*pluginv1.FaultSpec, 0, len(faults))
	for _, f := range faults {
		specs = append(specs, &pluginv1.FaultSpec{Point: f.Point, DelayMs: f.Delay.Milliseconds(), Error: f.Error})
	}
	set, err := p.SetFaults(ctx, specs)
	if errors.Is(err, supervisor.ErrNotReady) {
		return nil, admin.ErrNotReady
	}
	switch st, _ := status.FromError(errors.Unwrap(err)); st.Code() {
	case codes.Unimplemented:
		return nil, admin.ErrNoFaultPoints
	case codes.NotFound:
		// The point, and those the plugin declares.
		return nil, fmt.Errorf("%w %s", admin.ErrUnknownFaultPoint, st.Message())
	}
	if err != nil {
		return nil, err
	}
	h.logger.Warn("faults set on plugin", "plugin", name, "faults", len(set))
	out := make([]admin.Fault, 0, len(set))
	for _, f := range set {
		out = append(out, admin.Fault{Point: f.GetPoint(), Delay: time.Duration(f.GetDelayMs()) * time.Millisecond, Error: f.GetError()})
	}
	return out, nil
}

// adminHosts are the names the admin listener answers besides IP
// addresses and localhost: its listen address's host, if a name, and
// admin.hosts.
func adminHosts(cfg *config.Config) []string {
	hosts := slices.Clone(cfg.Admin.Hosts)
	if host, _, err := net.SplitHostPort(cfg.Admin.Listen); err == nil && host != "" {
		hosts = append(hosts, host)
	}
	return hosts
}
