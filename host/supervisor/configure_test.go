package supervisor_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
)

func TestConfigError(t *testing.T) {
	errBad := errors.New("bad config")
	tests := []struct {
		name     string
		decode   func(*pluginv1.Schema) ([]byte, error)
		wantAttr string
		plugin   bool // the plugin's Configure refused, not Decode
	}{
		{
			name:   "decode fails",
			decode: func(*pluginv1.Schema) ([]byte, error) { return nil, errBad },
		},
		{
			name: "decode sees the schema",
			decode: func(s *pluginv1.Schema) ([]byte, error) {
				if len(s.GetAttributes()) != 1 || s.GetAttributes()[0].GetName() != "greeting" {
					return nil, fmt.Errorf("schema %v, want hello's greeting attribute", s)
				}
				return nil, errBad
			},
		},
		{
			name:     "plugin refuses",
			decode:   staticConfig(`{"greeting":""}`),
			wantAttr: "greeting",
			plugin:   true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := helloSpec(t)
			s.Decode = tt.decode
			opts, _, _ := options(t, testPolicy())
			before := children(t)
			p, err := supervisor.Start(t.Context(), s, opts)
			if err == nil {
				p.Stop(time.Now())
				t.Fatal("Start() = nil error, want a refused config")
			}
			if !errors.Is(err, supervisor.ErrConfigRefused) {
				t.Fatalf("Start() = %v (%T), want an error wrapping ErrConfigRefused", err, err)
			}
			// Only the plugin's own refusal is an *sdk.ConfigError.
			var ce *sdk.ConfigError
			if got := errors.As(err, &ce); got != tt.plugin {
				t.Fatalf("Start() = %v: errors.As(*sdk.ConfigError) = %t, want %t", err, got, tt.plugin)
			}
			if tt.plugin && ce.Attribute != tt.wantAttr {
				t.Errorf("ConfigError Attribute = %q, want %q", ce.Attribute, tt.wantAttr)
			}
			// The plugin's refusal carries the catalog's words; the
			// schema's does not.
			if got := strings.Contains(err.Error(), "plugin rejected config"); got != tt.plugin {
				t.Errorf("Start() = %q: from the plugin's Configure = %t, want %t", err, got, tt.plugin)
			}
			if !tt.plugin && !errors.Is(err, errBad) {
				t.Errorf("Start() = %v, want it to wrap Decode's error", err)
			}
			if !strings.Contains(err.Error(), `plugin "hello" config`) {
				t.Errorf("Start() = %q, want it to name the plugin", err)
			}
			if got := testutil.ToFloat64(opts.Metrics.PluginState.WithLabelValues("hello", string(supervisor.StateStopped))); got != 1 {
				t.Errorf("plughost_plugin_state{state=stopped} = %v after a config error, want 1", got)
			}
			waitFor(t, 10*time.Second, "no plugin process to be left", func() bool {
				for _, pid := range children(t) {
					if !slices.Contains(before, pid) {
						return false
					}
				}
				return true
			})
		})
	}
}

// TestConfigureRetried: under RetryConfigure a Configure that fails
// without naming an attribute (frail's store on a full disk) is retried
// with backoff, shown as the last error, more often than max_restarts (a
// budget for crashes: a failed Configure is not one), and the plugin
// comes up once Configure accepts; a config its schema refuses is still
// final.
func TestConfigureRetried(t *testing.T) {
	s := frailSpec(t, map[string]string{"refuse": "write wallet.db: no space left on device"})
	pol := testPolicy()
	pol.MaxRestarts = 2
	p := startWith(t, s, pol, true).p
	var st supervisor.Status
	waitFor(t, 30*time.Second, "more restarts after failures than max_restarts, or failed", func() bool {
		st = p.Status()
		return st.Restarts > pol.MaxRestarts+1 || st.State == supervisor.StateFailed
	})
	if !strings.Contains(st.LastError, "no space left on device") {
		t.Errorf("LastError = %q, want the plugin's failure", st.LastError)
	}
	if st.State == supervisor.StateFailed || p.Ready() {
		t.Errorf("Status = %+v, Ready = %t while Configure fails; want it retried, not ready", st, p.Ready())
	}
	if err := os.Remove(filepath.Join(s.DataDir, "refuse")); err != nil {
		t.Fatal(err)
	}
	waitReady(t, p)

	s.Decode = func(*pluginv1.Schema) ([]byte, error) { return nil, errors.New("schema says no") }
	opts, _, _ := options(t, pol)
	opts.RetryConfigure = true
	if p, err := supervisor.Start(t.Context(), s, opts); !errors.Is(err, supervisor.ErrConfigRefused) {
		if p != nil {
			p.Stop(time.Now())
		}
		t.Fatalf("Start() with a config the schema refuses = %v, want ErrConfigRefused even under RetryConfigure", err)
	}
}

// TestConfigureRefusalFails: under RetryConfigure a Configure that
// refuses an attribute (hello's empty greeting) is a config error, not a
// passing failure: Start returns nil, and the plugin goes straight to
// failed, without a restart, with the refusal as its last error, led by
// where Spec.Locate places the attribute. An operator's restart, once the
// config is right, starts it.
func TestConfigureRefusalFails(t *testing.T) {
	var fixed atomic.Bool
	var decodes atomic.Int32
	s := helloSpec(t)
	s.Decode = func(*pluginv1.Schema) ([]byte, error) {
		decodes.Add(1)
		if fixed.Load() {
			return []byte(`{"greeting":"hi"}`), nil
		}
		return []byte(`{"greeting":""}`), nil
	}
	var located atomic.Value
	s.Locate = func(attribute string) string {
		located.Store(attribute)
		return "config.hcl:12:16"
	}
	pol := testPolicy()
	f := startWith(t, s, pol, true)
	p := f.p
	st := waitState(t, p, supervisor.StateFailed)
	if want := `config.hcl:12:16: plugin "hello" config: plugin rejected config: greeting: must not be empty`; st.LastError != want {
		t.Errorf("LastError = %q, want %q", st.LastError, want)
	}
	if got, _ := located.Load().(string); got != "greeting" {
		t.Errorf("Locate(%q), want Locate(%q)", got, "greeting")
	}
	// A retry would have gone through backoff before failing, and
	// configured the plugin again.
	if states := f.rec.since(0); slices.Contains(states, supervisor.StateBackoff) || st.Restarts != 0 {
		t.Errorf("states = %v with %d restarts, want failed without backoff or a restart", states, st.Restarts)
	}
	if n := decodes.Load(); n != 1 {
		t.Errorf("the config was decoded %d times before the operator's restart, want once", n)
	}
	fixed.Store(true)
	p.Restart(time.Now().Add(time.Second))
	waitReady(t, p)
}
