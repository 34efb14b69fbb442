package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/plughost/plughost/host/admin"
	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/metrics"
	"github.com/plughost/plughost/host/supervisor"
	"github.com/plughost/plughost/sdk"
)

// errShuttingDown is why a start or replacement cancelled by the host's
// shutdown failed.
var errShuttingDown = errors.New("the host is shutting down")

// startProcess is start (supervisor.Start or StartStandby) made to give
// up when shutdown begins: the process's own context is h.ctx, and only
// while start has not returned does the shutdown cancel it, which stops
// the process. A process start returned before that runs on, and the
// shutdown drains it with the others.
func (h *host) startProcess(start func(context.Context, supervisor.Spec, supervisor.Options) (*supervisor.Process, error), spec supervisor.Spec, opts supervisor.Options) (*supervisor.Process, error) {
	ctx, cancel := context.WithCancel(h.ctx)
	stop := context.AfterFunc(h.changes, cancel)
	p, err := start(ctx, spec, opts)
	if !stop() {
		// The shutdown has cancelled ctx: the process is stopping, or
		// stopped before start returned.
		if p != nil {
			p.Stop(time.Now())
		}
		return nil, fmt.Errorf("start plugin %q: %w", spec.Name, errShuttingDown)
	}
	return p, err
}

// stopProcess stops p by deadline and waits for it, unless the host's
// shutdown begins first: then it returns false at once and p goes on
// draining to its deadline, which serve waits for. It reports whether p
// has stopped.
func (h *host) stopProcess(p *supervisor.Process, deadline time.Time) bool {
	done := make(chan struct{})
	h.background.Go(func() {
		defer close(done)
		p.Stop(deadline)
	})
	select {
	case <-done:
		return true
	case <-h.changes.Done():
		return false
	}
}

// defaultHeld bounds the requests held for a single-instance plugin
// without max_inflight while it is replaced.
const defaultHeld = 1024

// replace puts a process for spec in the place of old, the plugin's
// running process, without failing requests (see "Reload" in
// docs/architecture.md). opts are the new process's options, oldOpts
// those old runs with, drain the drain deadline old gets, counted from
// when it is told to stop (after the new process has started or, for a
// single-instance plugin, after the new binary described itself).
//
// By default the new process starts while old serves; once it is ready
// it takes the routing table's place of old, which then drains. For a
// plugin that declared itself single-instance, the new binary is first
// launched as far as Describe, then old drains and stops while its
// requests are held (ingress.Hold), then the new process starts. A new
// process that does not become ready leaves old serving: still running,
// or, for a single-instance plugin that got past Describe, started again
// with its own spec and from a copy of the binary it ran (keepBinary). Either way the error is returned and shown as old's
// last_error.
func (h *host) replace(old *supervisor.Process, spec supervisor.Spec, opts, oldOpts supervisor.Options, drain time.Duration) error {
	if old.Manifest().GetSingleInstance() {
		return h.replaceInTurn(old, spec, opts, oldOpts, drain)
	}
	p, err := h.startProcess(supervisor.StartStandby, spec, opts)
	if errors.Is(err, errShuttingDown) {
		return err // old is drained with the others
	}
	var ce *sdk.ConfigError
	if err != nil && (errors.Is(err, sdk.ErrStorageCorrupt) || errors.As(err, &ce)) && !old.Ready() {
		// Nothing serves to keep: run the new spec as a start would,
		// failed with the plugin's report of corrupt storage, or
		// retrying a Configure that fails.
		return h.startInPlace(old, spec, opts, err)
	}
	if err != nil {
		err = fmt.Errorf("replace plugin %q: %w; the running process stays", spec.Name, err)
		old.SetLastError(err)
		return err
	}
	h.swap(old, p)
	h.logger.Info("plugin replaced; draining the old process", "plugin", spec.Name,
		"pid", old.Status().Pid, "new_pid", p.Status().Pid)
	h.stopProcess(old, time.Now().Add(drain))
	return nil
}

// replaceInTurn is replace for a single-instance plugin.
func (h *host) replaceInTurn(old *supervisor.Process, spec supervisor.Spec, opts, oldOpts supervisor.Options, drain time.Duration) error {
	// The old process must stop before the new one starts, and may have
	// to start again if the new one does not come up, from a binary that
	// may have been replaced on disk: launch the new binary as far as
	// Describe first, and keep the old process if it cannot get that far.
	inst, err := catalog.Launch(h.changes, spec.Path, spec.SHA256, catalog.Options{
		Logger:       opts.Logger.Named(spec.Name).With("plugin", spec.Name),
		StartTimeout: opts.Policy.StartTimeout,
		ExtraEnv:     spec.Env,
		Dir:          spec.Dir,
		SocketDir:    opts.SocketDir,
		LogLimit:     spec.LogLimit,
		Check:        true,
	})
	if h.changes.Err() != nil {
		if err == nil {
			inst.Kill()
		}
		return fmt.Errorf("replace plugin %q: %w", spec.Name, errShuttingDown)
	}
	if err != nil {
		err = fmt.Errorf("replace plugin %q: start: %w; the running process stays", spec.Name, err)
		old.SetLastError(err)
		return err
	}
	inst.Kill()
	// The file at the plugin's path may be the new binary by now: keep a
	// copy of the one running, to start again should the new one fail.
	back := old.Spec()
	if kept, err := keepBinary(old.Status().Pid, h.socketDir, spec.Name); err != nil {
		h.logger.Warn("cannot keep a copy of the running binary; a failed replacement restarts from the plugin's path", "plugin", spec.Name, "error", err)
	} else if kept != "" {
		back.Path = kept
	}
	held := spec.MaxInflight
	if held <= 0 {
		held = defaultHeld
	}
	// The requests wait for the drain and for the start, whichever
	// process comes up.
	deadline := time.Now().Add(drain)
	release := h.ingress.Hold(spec.Name, deadline.Add(opts.Policy.StartTimeout), held)
	defer release()
	h.logger.Info("single-instance plugin: draining it before its replacement starts; holding its requests", "plugin", spec.Name)
	if !h.stopProcess(old, deadline) {
		// old, still the plugin's process, is drained by the shutdown.
		return fmt.Errorf("replace plugin %q: %w", spec.Name, errShuttingDown)
	}
	p, err := h.startProcess(supervisor.StartStandby, spec, opts)
	if errors.Is(err, errShuttingDown) {
		return err
	}
	if err == nil {
		if back.Path != old.Spec().Path {
			_ = os.Remove(back.Path) // not needed: the new process runs
		}
		h.swap(old, p)
		h.logger.Info("plugin replaced", "plugin", spec.Name, "pid", p.Status().Pid)
		return nil
	}
	if errors.Is(err, sdk.ErrStorageCorrupt) {
		// The previous binary would open the same data: the plugin is
		// shown failed with its report until the data is repaired.
		if back.Path != old.Spec().Path {
			_ = os.Remove(back.Path)
		}
		return h.startInPlace(old, spec, opts, err)
	}
	err = fmt.Errorf("replace plugin %q: %w; the previous process is started again", spec.Name, err)
	prev, berr := h.startProcess(supervisor.StartStandby, back, oldOpts)
	if berr != nil && !errors.Is(berr, errShuttingDown) {
		// Left to the restart loop, as at host start.
		prev, berr = h.startProcess(supervisor.Start, back, oldOpts)
	}
	if berr != nil {
		// Only a config its schema refuses ends Start: the stopped
		// process stays listed and routed (503) with the reason, and an
		// operator's restart or a reload starts it again.
		err = errors.Join(err, fmt.Errorf("start the previous process again: %w", berr))
		old.SetLastError(err)
		return err
	}
	h.swap(old, prev)
	prev.SetLastError(err)
	return err
}

// startInPlace puts a Process for spec in the place of old, which does
// not serve, after a replacement failed with err: the plugin's report of
// corrupt storage or its refusal of an attribute, and then the started
// Process stays failed with the plugin's own message as its last error,
// where the next restart or reload finds it; or another failure of
// Configure, and then the Process retries it under the restart policy.
// old is stopped. It returns err, for the reload's diagnostics.
func (h *host) startInPlace(old *supervisor.Process, spec supervisor.Spec, opts supervisor.Options, err error) error {
	old.Stop(time.Now())
	p, serr := supervisor.Start(h.ctx, spec, opts)
	if serr != nil {
		// old, stopped, stays listed and routed (503) with the reason.
		err = errors.Join(err, serr)
		old.SetLastError(err)
		return err
	}
	h.swap(old, p)
	return fmt.Errorf("replace plugin %q: %w", spec.Name, err)
}

// swap makes p the plugin's process in old's place and routes to it.
func (h *host) swap(old, p *supervisor.Process) {
	old.Retire()
	h.mu.Lock()
	h.plugins[p.Name()] = p
	h.mu.Unlock()
	p.Activate()
	h.update()
}

// operatorReplace replaces the named plugin's process for an operator's
// restart or upgrade, under the reload lock, as a reload would. Both run
// the process's own spec again, with the binary as it is now on disk; an
// upgrade also makes the binary's sum part of the spec's fingerprint, so
// that a reload does not replace it once more. It counts a restart unless
// the plugin had failed.
func (h *host) operatorReplace(name string, upgrade bool) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	if h.closed || h.changes.Err() != nil {
		return
	}
	h.mu.Lock()
	old, ok := h.plugins[name]
	h.mu.Unlock()
	if !ok {
		return
	}
	spec := old.Spec()
	if upgrade {
		spec.Fingerprint = withBinary(spec.Fingerprint, spec.Path)
	}
	opts := h.options(h.cfg)
	st := old.Status()
	opts.Restarts = st.Restarts
	if st.State != supervisor.StateFailed {
		opts.Restarts++
		reason := metrics.RestartOperator
		if upgrade {
			reason = metrics.RestartUpgrade
		}
		h.metrics.PluginRestarts.WithLabelValues(name, reason).Inc()
	}
	what := "restart"
	if upgrade {
		what = "upgrade"
	}
	h.logger.Info("operator "+what+": replacing plugin", "plugin", name)
	if err := h.replace(old, spec, opts, opts, h.cfg.DrainDeadline); err != nil && !errors.Is(err, errShuttingDown) {
		h.logger.Error("operator "+what+" failed", "plugin", name, "error", err)
	}
}

// Restart implements admin.Plugins: it replaces the plugin's process in
// the background.
func (h *host) Restart(name string) bool {
	h.mu.Lock()
	_, ok := h.plugins[name]
	h.mu.Unlock()
	if !ok {
		return false
	}
	h.background.Go(func() { h.operatorReplace(name, false) })
	return true
}

// Upgrade implements admin.Plugins: it checks the plugin's binary against
// the running process's pin, then replaces the process in the background.
func (h *host) Upgrade(name string) error {
	h.mu.Lock()
	p, ok := h.plugins[name]
	h.mu.Unlock()
	if !ok {
		return admin.ErrNoPlugin
	}
	if err := catalog.Verify(p.Spec().Path, p.Spec().SHA256); err != nil {
		if errors.Is(err, catalog.ErrChecksum) {
			return fmt.Errorf("%w: %v", admin.ErrChecksum, err)
		}
		return fmt.Errorf("%w: %v", admin.ErrUnusableBinary, err)
	}
	h.background.Go(func() { h.operatorReplace(name, true) })
	return nil
}

// keepBinary copies the executable of the running process pid into dir,
// as name-PID, and returns the copy's path: the file at the plugin's path
// may be replaced while the process runs, and the copy is what it runs.
// It returns "" where there is no /proc or no dir to copy into. The copy
// lives as long as dir, the host's own socket directory.
func keepBinary(pid int, dir, name string) (string, error) {
	if dir == "" || pid <= 0 || runtime.GOOS != "linux" {
		return "", nil
	}
	src, err := os.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return "", fmt.Errorf("open the running binary: %w", err)
	}
	defer src.Close()
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.bin", name, pid))
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o700)
	if err != nil {
		return "", fmt.Errorf("keep the running binary: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		_ = dst.Close()
		_ = os.Remove(path)
		return "", fmt.Errorf("keep the running binary: %w", err)
	}
	if err := dst.Close(); err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("keep the running binary: %w", err)
	}
	return path, nil
}
