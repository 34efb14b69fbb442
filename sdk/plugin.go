package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// Version is the SDK version reported to the host in Describe.
const Version = "0.1.0"

// Plugin defines a plugin. Name, Version and Routes are required; the hooks
// are optional.
type Plugin struct {
	// Name is the plugin's kind, e.g. "hello". Operators may run it under
	// another instance name.
	Name string
	// Version is the plugin's own version, shown by the host.
	Version string
	// Routes declares and serves the plugin's routes, relative to the
	// mount point. The host forwards only requests that match one of them.
	Routes *Mux
	// Config declares the plugin's config block. The host checks the
	// operator's block against it before Configure is called.
	Config Schema
	// SingleInstance says two processes of the plugin cannot run at once,
	// for example because it holds an exclusive lock on files in its data
	// directory. The host then replaces the plugin (on a reload that
	// changes it, an operator restart or an upgrade) by draining and
	// stopping the running process before it starts the new one, and holds
	// the plugin's new requests meanwhile, within a bound of time and
	// count. Otherwise, the default, the new process starts and takes the
	// requests before the old one drains, and nobody waits.
	SingleInstance bool

	// Configure, if set, is called once before any request with the
	// decoded config. Returning an error refuses the config; the host shows
	// it to the operator as a diagnostic on the plugin's config block.
	Configure func(ctx context.Context, rt *Runtime) error
	// Drain, if set, is called when the host begins to drain the plugin;
	// ctx expires at the host's drain deadline. In-flight requests are
	// waited for by the SDK after Drain returns.
	Drain func(ctx context.Context) error
	// Close, if set, is called once at the end of a drain, after the
	// requests in flight have finished (or the drain's deadline has
	// passed, and ctx with it): the place to close what requests use,
	// such as a store, which requests may still be writing while Drain
	// runs. A process that the host kills without a drain (a crash, a
	// hung plugin) never runs it: what must survive that is written
	// before a request is answered.
	Close func(ctx context.Context) error
	// Health, if set, reports readiness; it must answer within the host's
	// health timeout. Without it the plugin is ready once configured.
	Health func(ctx context.Context) Health
}

// HealthStatus is a plugin's readiness.
type HealthStatus int

// Health statuses. A degraded plugin still receives requests.
const (
	StatusReady HealthStatus = iota + 1
	StatusDegraded
	StatusNotReady
)

// String returns the status's lowercase name.
func (s HealthStatus) String() string {
	switch s {
	case StatusReady:
		return "ready"
	case StatusDegraded:
		return "degraded"
	case StatusNotReady:
		return "not_ready"
	default:
		return fmt.Sprintf("status(%d)", int(s))
	}
}

// Health is a plugin's answer to a health check.
type Health struct {
	Status HealthStatus
	// Reason says why the plugin is degraded or not ready.
	Reason string
}

// Limits are the host's ingress limits, for plugins that size buffers.
type Limits struct {
	// MaxBodyBytes is the largest request body the host forwards.
	MaxBodyBytes int64
	// RequestTimeout is the default deadline of non-streaming routes.
	RequestTimeout time.Duration
}

// Host is the host as seen by a plugin.
type Host interface {
	// Call sends req to the routes of the plugin instance named plugin,
	// through the host's ingress path: its limits, in-flight cap and
	// readiness rules apply. req.URL.Path is relative to the target's mount
	// point. ctx bounds the call; its deadline travels to the target.
	// A non-2xx answer is a response, not an error.
	Call(ctx context.Context, plugin string, req *http.Request) (*http.Response, error)
}

// Runtime is what the SDK hands a plugin in Configure.
type Runtime struct {
	// Instance is the plugin's name in the operator's config.
	Instance string
	// Logger's records reach the host's log, tagged with the instance name.
	// In a plugin process it keeps to the plugin's log_rate and log_burst:
	// records over them are dropped before they reach the host, and a
	// warning once a second says how many.
	Logger hclog.Logger
	// Registerer registers the plugin's own metrics. The host exposes them
	// with a plugin label; names starting with "plughost_" are reserved.
	Registerer prometheus.Registerer
	// DataDir is the plugin's own directory, created by the host.
	DataDir string
	// Limits are the host's ingress limits.
	Limits Limits
	// Host lets the plugin call other plugins through the host.
	Host Host

	config []byte
	ctx    context.Context
	faults *Faults
}

// Faults returns the plugin's fault points, which operators set through
// the host's admin API to rehearse failures. It is never nil.
func (rt *Runtime) Faults() *Faults {
	if rt.faults == nil {
		return &Faults{}
	}
	return rt.faults
}

// Context returns a context that lives as long as the plugin serves and is
// cancelled when the host begins to drain it. Background work started in
// Configure should stop when it is done.
func (rt *Runtime) Context() context.Context { return rt.ctx }

// DecodeConfig decodes the operator's config block into v, a pointer to a
// struct whose json tags name the schema's attributes. The host has already
// applied defaults and checked types; unknown fields are an error, which
// means v and the declared Schema disagree.
func (rt *Runtime) DecodeConfig(v any) error {
	if err := DecodeJSON(bytes.NewReader(rt.config), v); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	return nil
}

// RawConfig returns the operator's config block as a JSON object.
func (rt *Runtime) RawConfig() []byte { return rt.config }

// Duration is a time.Duration that decodes from a JSON string such as "5s",
// for config attributes of type TypeDuration.
type Duration time.Duration

// UnmarshalJSON decodes a Go duration string. Like encoding/json itself it
// leaves d unchanged on null, which is what the host sends for an optional
// attribute that has no default.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON encodes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }
