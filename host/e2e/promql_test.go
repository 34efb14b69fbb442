package e2e

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The dashboard's and the alert rules' expressions are checked for the
// metric names they use without a PromQL parser: the one Prometheus
// ships (promql/parser) would upgrade client_golang, common and procfs
// and build part of the TSDB into the tests. metricNames is enough for
// the question asked, which names an expression selects, and its table
// test covers the constructs the expressions use and the ones that look
// like names but are not.

var (
	// nameMatcherRE is a __name__ matcher: = names a metric, =~ a regex.
	nameMatcherRE = regexp.MustCompile(`__name__\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*")`)
	stringRE      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	// grafanaVarRE is a Grafana variable: $plugin, ${datasource},
	// $__rate_interval.
	grafanaVarRE = regexp.MustCompile(`\$(?:\{[^}]*\}|\w+)`)
	matchersRE   = regexp.MustCompile(`\{[^{}]*\}`)
	rangeRE      = regexp.MustCompile(`\[[^\[\]]*\]`)
	// labelListRE is a list of label names after a grouping or matching
	// keyword.
	labelListRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// numberRE is a number or a duration: 0.99, 1e3, 0x1f, 5m, 1h30m.
	numberRE = regexp.MustCompile(`\b\d[\w.]*`)
	identRE  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// promqlKeywords are the identifiers of PromQL that are neither
	// functions nor metric names.
	promqlKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "Inf": true, "NaN": true,
	}
)

// metricNames returns the metric names a PromQL expression selects, and
// the regexes of its __name__=~ matchers, each sorted and unique. It
// returns the other __name__ matchers (!=, !~) as bad: they select by
// what a name is not, which no check of names can vouch for.
func metricNames(expr string) (names, regexes, bad []string) {
	for _, m := range nameMatcherRE.FindAllStringSubmatch(expr, -1) {
		v, err := strconv.Unquote(m[2])
		if err != nil {
			bad = append(bad, m[0])
			continue
		}
		switch m[1] {
		case "=":
			names = append(names, v)
		case "=~":
			regexes = append(regexes, v)
		default:
			bad = append(bad, m[0])
		}
	}
	s := stringRE.ReplaceAllString(expr, `""`)
	s = grafanaVarRE.ReplaceAllString(s, "")
	// Ranges and subqueries hold durations; matchers hold label names.
	// Neither nests.
	s = rangeRE.ReplaceAllString(s, "")
	s = matchersRE.ReplaceAllString(s, "")
	s = labelListRE.ReplaceAllString(s, "")
	s = numberRE.ReplaceAllString(s, "")
	for _, loc := range identRE.FindAllStringIndex(s, -1) {
		id := s[loc[0]:loc[1]]
		if promqlKeywords[id] {
			continue
		}
		// A function or an aggregation: its name is followed by its
		// arguments.
		if strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue
		}
		names = append(names, id)
	}
	slices.Sort(names)
	slices.Sort(regexes)
	return slices.Compact(names), slices.Compact(regexes), bad
}

// templatingExpr returns the PromQL inside a Grafana Prometheus
// variable query: label_values(EXPR, label) and query_result(EXPR) hold
// one; label_values(label) and label_names() hold none.
func templatingExpr(q string) string {
	q = strings.TrimSpace(q)
	for _, fn := range []string{"label_values(", "query_result("} {
		inner, ok := strings.CutPrefix(q, fn)
		if !ok {
			continue
		}
		inner = strings.TrimSuffix(strings.TrimSpace(inner), ")")
		if fn == "query_result(" {
			return inner
		}
		// The label is the last argument, after the last top-level comma.
		depth, last := 0, -1
		for i, c := range inner {
			switch c {
			case '(', '{', '[':
				depth++
			case ')', '}', ']':
				depth--
			case ',':
				if depth == 0 {
					last = i
				}
			}
		}
		if last < 0 {
			return ""
		}
		return inner[:last]
	}
	return ""
}

func TestMetricNames(t *testing.T) {
	tests := []struct {
		expr           string
		names, regexes []string
	}{
		{`sum by (plugin, code) (rate(plughost_http_requests_total{instance=~"$instance", plugin=~"$plugin"}[$__rate_interval]))`,
			[]string{"plughost_http_requests_total"}, nil},
		{`histogram_quantile(0.99, sum by (plugin, le) (rate(a_seconds_bucket{x="by (y) sum(z)"}[5m])))`,
			[]string{"a_seconds_bucket"}, nil},
		{`x / on(instance) group_left(version) y offset 1h30m`, []string{"x", "y"}, nil},
		{`sum(rate(x[5m])) without (code) > bool 1e3`, []string{"x"}, nil},
		{`max by (instance, plugin) ({__name__=~".+_breaker_state", plugin="a"}) > 0`, nil, []string{".+_breaker_state"}},
		{`{__name__="exact_name", job='j'}`, []string{"exact_name"}, nil},
		{`up == 0 unless on (instance) absent(foo{job="x"})`, []string{"foo", "up"}, nil},
		{`increase(a[15m]) > 0 or increase(b[15m]) > 0`, []string{"a", "b"}, nil},
		{`max_over_time(rate(x[5m])[1h:30s])`, []string{"x"}, nil},
		{`count_values("sum", x) and ignoring(le) y`, []string{"x", "y"}, nil},
		{`time() - vector(1) * 0x1f`, nil, nil},
		{`a:recorded:rate5m > Inf`, []string{"a:recorded:rate5m"}, nil},
		{"sum(a) by (le)\n  / sum(b)", []string{"a", "b"}, nil},
		{`topk(5, sum by (plugin) (x)) @ end()`, []string{"x"}, nil},
	}
	for _, tt := range tests {
		names, regexes, bad := metricNames(tt.expr)
		if d := cmp.Diff(tt.names, names); d != "" {
			t.Errorf("metricNames(%q) names (-want +got):\n%s", tt.expr, d)
		}
		if d := cmp.Diff(tt.regexes, regexes); d != "" {
			t.Errorf("metricNames(%q) regexes (-want +got):\n%s", tt.expr, d)
		}
		if len(bad) > 0 {
			t.Errorf("metricNames(%q) bad = %q, want none", tt.expr, bad)
		}
	}
	if _, _, bad := metricNames(`{__name__!~"go_.*"}`); len(bad) != 1 {
		t.Errorf("metricNames of a negative __name__ matcher: bad = %q, want it", bad)
	}
}

func TestTemplatingExpr(t *testing.T) {
	tests := []struct{ query, want string }{
		{`label_values(plughost_plugin_up, instance)`, `plughost_plugin_up`},
		{`label_values(plughost_plugin_up{instance=~"$instance", a="x,y"}, plugin)`, `plughost_plugin_up{instance=~"$instance", a="x,y"}`},
		{`label_values(instance)`, ``},
		{`query_result(sum by (plugin) (x))`, `sum by (plugin) (x)`},
		{`label_names()`, ``},
	}
	for _, tt := range tests {
		if got := templatingExpr(tt.query); got != tt.want {
			t.Errorf("templatingExpr(%q) = %q, want %q", tt.query, got, tt.want)
		}
	}
}
