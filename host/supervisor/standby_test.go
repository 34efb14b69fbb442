package supervisor_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/host/supervisor"
)

// TestStartStandby checks the start of a replacement: it returns a ready
// process that leaves the metric series alone until Activate, and carries
// the restart count on.
func TestStartStandby(t *testing.T) {
	// The running process owns the series: its gauges say ready.
	running := start(t, helloSpec(t), testPolicy())
	waitReady(t, running.p)

	opts, _, _ := options(t, testPolicy())
	opts.Metrics = running.metrics
	opts.Restarts = 3
	p, err := supervisor.StartStandby(t.Context(), helloSpec(t), opts)
	if err != nil {
		t.Fatalf("StartStandby(hello) = %v, want nil", err)
	}
	t.Cleanup(func() { p.Stop(time.Now().Add(10 * time.Second)) })
	if p.Endpoint() == nil {
		t.Fatalf("StartStandby returned with hello %+v, want it ready", p.Status())
	}
	if got := p.Status().Restarts; got != 3 {
		t.Errorf("Status().Restarts = %d, want 3 carried over", got)
	}

	// The standby's start did not touch the running one's series; the
	// running one retires and stops, and still does not.
	running.p.Retire()
	running.p.Stop(time.Now().Add(10 * time.Second))
	if got := gauge(t, running.metrics, supervisor.StateReady, "hello"); got != 1 {
		t.Errorf("plughost_plugin_state{state=ready} = %v after a standby started and the retired one stopped, want 1", got)
	}
	if got := gauge(t, running.metrics, supervisor.StateStopped, "hello"); got != 0 {
		t.Errorf("plughost_plugin_state{state=stopped} = %v after the retired one stopped, want 0", got)
	}

	// Activated, the standby's own state shows, and later changes too.
	p.Activate()
	p.SetLastError(errors.New("replacement failed: test"))
	if got := p.Status().LastError; got != "replacement failed: test" {
		t.Errorf("Status().LastError = %q after SetLastError, want it", got)
	}
	p.SetLastError(errors.New(strings.Repeat("refused ", 25_000)))
	if got := p.Status().LastError; len(got) > 4<<10+64 || !strings.HasSuffix(got, "more bytes cut)") {
		t.Errorf("Status().LastError after a 200 KB error is %d bytes ending %q, want it cut to 4 KiB with a marker", len(got), got[max(len(got)-40, 0):])
	}
	p.Stop(time.Now().Add(10 * time.Second))
	if got := gauge(t, running.metrics, supervisor.StateStopped, "hello"); got != 1 {
		t.Errorf("plughost_plugin_state{state=stopped} = %v after the activated one stopped, want 1", got)
	}
	if got := testutil.ToFloat64(running.metrics.PluginUp.WithLabelValues("hello")); got != 0 {
		t.Errorf("plughost_plugin_up{plugin=hello} = %v after the activated one stopped, want 0", got)
	}
}

// TestStartStandbyFails checks that every way a first start can fail is
// StartStandby's error, with nothing left running, where Start would
// leave all but a config error to the restart loop.
func TestStartStandbyFails(t *testing.T) {
	tests := []struct {
		name string
		spec func(t *testing.T) supervisor.Spec
		want string
	}{
		{"not a plugin", func(t *testing.T) supervisor.Spec { return spec(t, "crasher", "crasher", `{}`) }, "start"},
		{"pin mismatch", func(t *testing.T) supervisor.Spec {
			s := helloSpec(t)
			s.SHA256 = strings.Repeat("0", 64)
			return s
		}, "checksum"},
		{"config refused", func(t *testing.T) supervisor.Spec { return spec(t, "hello", "hello", `{"greeting":""}`) }, "greeting"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, _, _ := options(t, testPolicy())
			before := children(t)
			p, err := supervisor.StartStandby(t.Context(), tt.spec(t), opts)
			if err == nil {
				p.Stop(time.Now())
				t.Fatalf("StartStandby() = nil error, want one mentioning %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("StartStandby() = %q, want it to mention %q", err, tt.want)
			}
			waitFor(t, 10*time.Second, "no plugin process to be left", func() bool {
				for _, pid := range children(t) {
					if !slices.Contains(before, pid) {
						return false
					}
				}
				return true
			})
			// Nothing was published: the series belong to the running
			// process, if any.
			for _, s := range supervisor.States {
				if got := gauge(t, opts.Metrics, s, tt.spec(t).Name); got != 0 {
					t.Errorf("plughost_plugin_state{state=%q} = %v after a failed standby start, want 0", s, got)
				}
			}
		})
	}
}
