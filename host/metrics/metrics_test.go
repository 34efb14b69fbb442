package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/plughost/plughost/host/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// label is one name="value" pair.
func label(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
}

// counter returns a counter family with one metric per label set.
func counter(name string, labels ...[]*dto.LabelPair) *dto.MetricFamily {
	mf := &dto.MetricFamily{Name: proto.String(name), Help: proto.String("A test counter."), Type: dto.MetricType_COUNTER.Enum()}
	if len(labels) == 0 {
		labels = [][]*dto.LabelPair{nil}
	}
	for i, ls := range labels {
		mf.Metric = append(mf.Metric, &dto.Metric{Label: ls, Counter: &dto.Counter{Value: proto.Float64(float64(i + 1))}})
	}
	return mf
}

func gaugeFamily(name string) *dto.MetricFamily {
	return &dto.MetricFamily{Name: proto.String(name), Help: proto.String("A test gauge."), Type: dto.MetricType_GAUGE.Enum(),
		Metric: []*dto.Metric{{Gauge: &dto.Gauge{Value: proto.Float64(1)}}}}
}

func encode(t testing.TB, mfs ...*dto.MetricFamily) [][]byte {
	t.Helper()
	out := make([][]byte, 0, len(mfs))
	for _, mf := range mfs {
		b, err := proto.Marshal(mf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestRelabel(t *testing.T) {
	tests := []struct {
		name    string
		in      [][]byte
		want    []*dto.MetricFamily
		wantErr []string // substrings of the error; nil for none
	}{
		{
			name: "adds the plugin label, sorted",
			in:   encode(t, counter("app_requests_total", []*dto.LabelPair{label("code", "200"), label("route", "/")})),
			want: []*dto.MetricFamily{counter("app_requests_total", []*dto.LabelPair{label("code", "200"), label("plugin", "hello"), label("route", "/")})},
		},
		{
			name: "unlabelled metrics",
			in:   encode(t, gaugeFamily("app_up"), counter("app_a_total", nil, []*dto.LabelPair{label("x", "1")})),
			want: []*dto.MetricFamily{
				{Name: proto.String("app_up"), Help: proto.String("A test gauge."), Type: dto.MetricType_GAUGE.Enum(),
					Metric: []*dto.Metric{{Label: []*dto.LabelPair{label("plugin", "hello")}, Gauge: &dto.Gauge{Value: proto.Float64(1)}}}},
				counter("app_a_total", []*dto.LabelPair{label("plugin", "hello")}, []*dto.LabelPair{label("plugin", "hello"), label("x", "1")}),
			},
		},
		{
			name:    "reserved name dropped",
			in:      encode(t, counter("plughost_plugin_up"), counter("app_ok_total")),
			want:    []*dto.MetricFamily{counter("app_ok_total", []*dto.LabelPair{label("plugin", "hello")})},
			wantErr: []string{`plugin "hello" metrics`, "plughost_plugin_up", `names starting with "plughost_" are reserved for the host`},
		},
		{
			name:    "plugin label dropped",
			in:      encode(t, counter("app_spoof_total", []*dto.LabelPair{label("plugin", "other")}), counter("app_ok_total")),
			want:    []*dto.MetricFamily{counter("app_ok_total", []*dto.LabelPair{label("plugin", "hello")})},
			wantErr: []string{"app_spoof_total", `label "plugin" is reserved for the host`},
		},
		{
			name: "plugin label on a later metric drops the whole family",
			in: encode(t, counter("app_mixed_total",
				[]*dto.LabelPair{label("a", "1")},
				[]*dto.LabelPair{label("plugin", "other")})),
			want:    []*dto.MetricFamily{},
			wantErr: []string{"app_mixed_total", `label "plugin"`},
		},
		{
			name:    "undecodable bytes",
			in:      append([][]byte{{0xff, 0xff, 0xff}}, encode(t, counter("app_ok_total"))...),
			want:    []*dto.MetricFamily{counter("app_ok_total", []*dto.LabelPair{label("plugin", "hello")})},
			wantErr: []string{"undecodable family"},
		},
		{
			name:    "several problems",
			in:      append(encode(t, counter("plughost_x"), counter("app_s_total", []*dto.LabelPair{label("plugin", "p")})), []byte{0x0a}),
			want:    []*dto.MetricFamily{},
			wantErr: []string{"plughost_x", "app_s_total", "undecodable"},
		},
		{
			name: "nothing",
			in:   nil,
			want: []*dto.MetricFamily{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := metrics.Relabel("hello", tt.in)
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Relabel() families mismatch (-want +got):\n%s", diff)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Errorf("Relabel() error = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Relabel() error = nil, want one containing %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Relabel() error = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// fakeSource is a metrics.Source with canned answers; the real source, a
// supervised plugin, is covered by the supervisor and e2e tests.
type fakeSource struct {
	name string
	fams [][]byte
	err  error
	// block makes Families wait for its context, as a wedged plugin would.
	block bool
}

func (s *fakeSource) Name() string { return s.name }

func (s *fakeSource) Families(ctx context.Context) ([][]byte, error) {
	if s.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.fams, s.err
}

func TestGatherer(t *testing.T) {
	h := metrics.New()
	h.PluginUp.WithLabelValues("a").Set(1)
	h.Requests.WithLabelValues("a", "200").Add(3)

	sources := []metrics.Source{
		&fakeSource{name: "a", fams: encode(t,
			counter("app_requests_total", []*dto.LabelPair{label("code", "200")}),
			gaugeFamily("app_queue_depth"))},
		// b shares a family with a and disagrees with a on another's
		// type; that family is dropped and counted as b's error.
		&fakeSource{name: "b", fams: encode(t,
			counter("app_requests_total", []*dto.LabelPair{label("code", "500")}),
			counter("app_queue_depth"))},
		&fakeSource{name: "down", err: errors.New("plugin is not ready")},
		&fakeSource{name: "wedged", block: true},
		// spoof's reserved family is dropped, its own family kept.
		&fakeSource{name: "spoof", fams: encode(t, counter("plughost_plugin_up"), counter("spoof_events_total"))},
		&fakeSource{name: "garbage", fams: [][]byte{[]byte("not a protobuf")}},
	}
	g := &metrics.Gatherer{
		Host:    h,
		Sources: func() []metrics.Source { return sources },
		Timeout: 200 * time.Millisecond,
		Logger:  hclog.NewNullLogger(),
	}

	begin := time.Now()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v, want nil", err)
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Errorf("Gather() took %v with a 200ms source timeout", d)
	}
	byName := map[string]*dto.MetricFamily{}
	var names []string
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
		names = append(names, mf.GetName())
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("Gather() families = %v, want them sorted by name", names)
	}

	// Series by plugin label, for the families the sources sent.
	plugins := func(name string) []string {
		var out []string
		for _, m := range byName[name].GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "plugin" {
					out = append(out, lp.GetValue())
				}
			}
		}
		return out
	}
	for name, want := range map[string][]string{
		"app_requests_total":           {"a", "b"},
		"app_queue_depth":              {"a"},
		"spoof_events_total":           {"spoof"},
		"plughost_plugin_up":           {"a"},
		"plughost_http_requests_total": {"a"},
	} {
		got := plugins(name)
		sort.Strings(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("plugin labels of %s mismatch (-want +got):\n%s", name, diff)
		}
	}
	if got := byName["app_queue_depth"].GetType(); got != dto.MetricType_GAUGE {
		t.Errorf("app_queue_depth type = %v, want the first source's GAUGE", got)
	}
	if _, ok := byName["go_goroutines"]; !ok {
		t.Error("Gather() has no go_goroutines; want the host's runtime metrics")
	}

	for src, want := range map[string]float64{"a": 0, "b": 1, "down": 1, "wedged": 1, "spoof": 1, "garbage": 1} {
		if got := testutil.ToFloat64(h.PluginScrapeErrs.WithLabelValues(src)); got != want {
			t.Errorf("plughost_plugin_metrics_errors_total{plugin=%q} = %v, want %v", src, got, want)
		}
	}

	// The merged exposition is valid text format and lint-clean.
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatalf("encode %s: %v", mf.GetName(), err)
		}
	}
	problems, err := promlint.New(bytes.NewReader(buf.Bytes())).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("parse the exposition: %v\n%s", err, buf.String())
	}
	if len(parsed) != len(mfs) {
		t.Errorf("parsed %d families from the exposition, want %d", len(parsed), len(mfs))
	}
	if got := len(parsed["app_requests_total"].GetMetric()); got != 2 {
		t.Errorf("parsed app_requests_total has %d series, want 2", got)
	}
}

func TestGathererNoSources(t *testing.T) {
	h := metrics.New()
	g := &metrics.Gatherer{Host: h, Sources: func() []metrics.Source { return nil }, Timeout: time.Second, Logger: hclog.NewNullLogger()}
	got, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather() = %v, want nil", err)
	}
	own, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(own) {
		t.Errorf("Gather() with no sources = %d families, want the host's %d", len(got), len(own))
	}
}

func TestForget(t *testing.T) {
	h := metrics.New()
	for _, p := range []string{"a", "b"} {
		h.PluginUp.WithLabelValues(p).Set(1)
		h.PluginState.WithLabelValues(p, "ready").Set(1)
		h.InitPlugin(p)
		h.PluginHealth.WithLabelValues(p, "ready").Set(1)
		h.PluginRestarts.WithLabelValues(p, metrics.RestartFailure).Inc()
		h.PluginHungKills.WithLabelValues(p).Inc()
		h.Requests.WithLabelValues(p, "200").Inc()
		h.RequestDuration.WithLabelValues(p).Observe(0.1)
		h.Inflight.WithLabelValues(p).Set(0)
		h.BusyRejections.WithLabelValues(p).Inc()
		h.DrainAborted.WithLabelValues(p).Inc()
		h.PluginScrapeErrs.WithLabelValues(p).Inc()
	}
	h.Forget("a")
	mfs, err := h.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), metrics.ReservedPrefix) {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "plugin" {
					continue
				}
				if lp.GetValue() == "a" {
					t.Errorf("%s still has a series for the forgotten plugin a", mf.GetName())
				} else {
					kept++
				}
			}
		}
	}
	if want := 10 + len(metrics.RestartReasons); kept != want {
		t.Errorf("%d series left for plugin b, want %d (one per host metric, and one per restart reason)", kept, want)
	}
}

func FuzzRelabel(f *testing.F) {
	for _, mf := range []*dto.MetricFamily{
		counter("app_requests_total", []*dto.LabelPair{label("code", "200")}),
		counter("plughost_plugin_up"),
		counter("app_spoof_total", []*dto.LabelPair{label("plugin", "x")}),
		gaugeFamily("app_up"),
		{Name: proto.String("app_h"), Type: dto.MetricType_HISTOGRAM.Enum(), Metric: []*dto.Metric{{Histogram: &dto.Histogram{SampleCount: proto.Uint64(1)}}}},
		{},
	} {
		b, err := proto.Marshal(mf)
		if err != nil {
			f.Fatal(err)
		}
		f.Add("hello", b)
	}
	f.Add("hello", []byte{0xff, 0xff})
	f.Add("", []byte("not a protobuf"))
	f.Add("p", []byte{0x1a, 0x02, 0x12, 0x00}) // a metric with an empty label pair
	f.Fuzz(func(t *testing.T, plugin string, b []byte) {
		fams, err := metrics.Relabel(plugin, [][]byte{b, b})
		if len(fams) > 2 {
			t.Fatalf("Relabel(2 families) returned %d", len(fams))
		}
		if err != nil && len(fams) != 0 {
			t.Fatalf("Relabel returned %d families with error %v for two copies of one family", len(fams), err)
		}
		for _, mf := range fams {
			if strings.HasPrefix(mf.GetName(), metrics.ReservedPrefix) {
				t.Fatalf("Relabel kept reserved family %q", mf.GetName())
			}
			for _, m := range mf.GetMetric() {
				n := 0
				for i, lp := range m.GetLabel() {
					if lp.GetName() == "plugin" {
						n++
						if lp.GetValue() != plugin {
							t.Fatalf("plugin label = %q, want %q", lp.GetValue(), plugin)
						}
					}
					if i > 0 && m.GetLabel()[i-1].GetName() > lp.GetName() {
						t.Fatalf("labels of %s not sorted: %v", mf.GetName(), m.GetLabel())
					}
				}
				if n != 1 {
					t.Fatalf("metric of %s has %d plugin labels, want 1", mf.GetName(), n)
				}
			}
		}
	})
}
