package catalog

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/host/internal/testbin"
	"github.com/plughost/plughost/sdk/wire"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestLogLimiter(t *testing.T) {
	type step struct {
		advance time.Duration
		size    int
		want    bool
	}
	tests := []struct {
		name  string
		limit LogLimit
		steps []step
	}{
		{name: "burst then drop", limit: LogLimit{Rate: 2, Burst: 3}, steps: []step{
			{0, 10, true}, {0, 10, true}, {0, 10, true}, {0, 10, false},
		}},
		{name: "refills at rate", limit: LogLimit{Rate: 2, Burst: 3}, steps: []step{
			{0, 10, true}, {0, 10, true}, {0, 10, true}, {0, 10, false},
			{499 * time.Millisecond, 10, false}, {time.Millisecond, 10, true}, {0, 10, false},
		}},
		{name: "refill capped at burst", limit: LogLimit{Rate: 10, Burst: 2}, steps: []step{
			{time.Hour, 1, true}, {0, 1, true}, {0, 1, false},
		}},
		{name: "long record takes a token per started unit", limit: LogLimit{Rate: 1, Burst: 3}, steps: []step{
			{0, wire.LogUnit + 1, true}, {0, 1, true}, {0, 1, false},
		}},
		{name: "record longer than the bucket never passes", limit: LogLimit{Rate: 1, Burst: 2}, steps: []step{
			{0, 2*wire.LogUnit + 1, false}, {0, 2 * wire.LogUnit, true},
		}},
		{name: "no rate is no limit", limit: LogLimit{}, steps: []step{
			{0, 1 << 20, true}, {0, 1 << 20, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			l := newLogLimiter(tt.limit, hclog.NewNullLogger(), clock.now)
			defer l.close()
			for i, s := range tt.steps {
				clock.advance(s.advance)
				if got := l.allow(s.size); got != s.want {
					t.Fatalf("step %d: allow(%d) = %v, want %v", i, s.size, got, s.want)
				}
			}
		})
	}
}

// TestLogLimiterReports checks that drops are reported once per interval
// and the rest when logging ends, in the host log and to Dropped.
func TestLogLimiterReports(t *testing.T) {
	buf := &testbin.SyncBuffer{}
	var reported []int
	clock := &fakeClock{t: time.Unix(1000, 0)}
	l := newLogLimiter(LogLimit{Rate: 1, Burst: 1, Dropped: func(n int) { reported = append(reported, n) }},
		hclog.New(&hclog.LoggerOptions{Output: buf}), clock.now)
	for range 4 {
		l.allow(1)
	}
	deadline := time.Now().Add(10 * LogReportInterval)
	for !strings.Contains(buf.String(), "lines=3") {
		if time.Now().After(deadline) {
			t.Fatalf("no report of 3 dropped lines after %v; log:\n%s", 10*LogReportInterval, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.allow(1)
	l.allow(1)
	l.close()
	if got, want := strings.Count(buf.String(), "dropped plugin output"), 2; got != want {
		t.Errorf("logged %d reports, want %d; log:\n%s", got, want, buf)
	}
	if len(reported) != 2 || reported[0] != 3 || reported[1] != 2 {
		t.Errorf("Dropped called with %v, want [3 2]", reported)
	}
}

// TestDroppedErrorsKept checks that error-level records the limiter drops
// from the log are still kept as the plugin's last words.
func TestDroppedErrorsKept(t *testing.T) {
	buf := &testbin.SyncBuffer{}
	words := &lastWords{}
	clock := &fakeClock{t: time.Unix(1000, 0)}
	limit := newLogLimiter(LogLimit{Rate: 1, Burst: 1}, hclog.NewNullLogger(), clock.now)
	defer limit.close()
	l := recordingLogger{hclog.New(&hclog.LoggerOptions{Output: buf}), words, limit}
	l.Info("chatter")
	l.Error("first failure", "n", 1)
	l.Log(hclog.Error, "last failure", "n", 2)
	if log := buf.String(); !strings.Contains(log, "chatter") || strings.Contains(log, "failure") {
		t.Errorf("log = %q, want the first record only", log)
	}
	if got, want := words.String(), "first failure n=1 | last failure n=2"; got != want {
		t.Errorf("last words = %q, want %q", got, want)
	}
}

// TestLineLoggerDropsRestOfChunk checks that once a line of a write is
// dropped, the write's other whole lines are dropped and counted with
// it, while its trailing partial line waits for the next write.
func TestLineLoggerDropsRestOfChunk(t *testing.T) {
	var buf bytes.Buffer
	clock := &fakeClock{t: time.Unix(1000, 0)}
	limit := newLogLimiter(LogLimit{Rate: 1, Burst: 2}, hclog.NewNullLogger(), clock.now)
	defer limit.close()
	w := newLineLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true}), "stdout", limit)
	writes := []struct {
		advance time.Duration
		s       string
	}{
		{0, "a\nb\nc\nd\n"}, // a and b spend the burst; c and d are dropped
		{time.Second, "e\n"},
		{0, "f\ng\nh"}, // f and g dropped, h waits
		{10 * time.Second, "i\nj\n"},
	}
	for _, wr := range writes {
		clock.advance(wr.advance)
		if n, err := w.Write([]byte(wr.s)); n != len(wr.s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v, want %d, nil", wr.s, n, err, len(wr.s))
		}
	}
	if diff := cmp.Diff([]string{"a", "b", "e", "hi", "j"}, loggedLines(t, &buf, "stdout")); diff != "" {
		t.Errorf("logged lines mismatch (-want +got):\n%s", diff)
	}
	limit.mu.Lock()
	lost := limit.lost
	limit.mu.Unlock()
	if lost != 4 {
		t.Errorf("dropped %d lines, want 4", lost)
	}
}

// TestSourceDropped checks that the SDK's reports of the records it
// dropped in the plugin are counted, even when the host drops the report
// itself, that their quoted error is kept as last words, and that counts
// a plugin could not have meant are ignored.
func TestSourceDropped(t *testing.T) {
	var reported []int
	words := &lastWords{}
	clock := &fakeClock{t: time.Unix(1000, 0)}
	limit := newLogLimiter(LogLimit{Rate: 1, Burst: 2, Dropped: func(n int) { reported = append(reported, n) }},
		hclog.NewNullLogger(), clock.now)
	l := recordingLogger{hclog.NewNullLogger(), words, limit}
	for _, n := range []any{5.0, -1.0, 0.0, 0.5, 2.5, math.NaN(), math.Inf(1), 1e300, "7", 7} {
		l.Warn(wire.LogDroppedMsg, wire.LogDroppedKey, n, "timestamp", "t")
	}
	l.Warn(wire.LogDroppedMsg, wire.LogDroppedErrorsKey, 1.0, wire.LogLastErrorKey, "open db error=disk full", wire.LogDroppedKey, 3.0)
	l.Warn("some other warning", wire.LogDroppedKey, 100.0)
	limit.close() // hands on the host's own drops: 10 of the 12 records
	if diff := cmp.Diff([]int{5, 3, 10}, reported); diff != "" {
		t.Errorf("Dropped calls mismatch (-want +got):\n%s", diff)
	}
	if got, want := words.String(), "open db error=disk full"; got != want {
		t.Errorf("last words = %q, want %q", got, want)
	}

	// An unlimited plugin's SDK drops nothing, so no report is believed.
	l = recordingLogger{hclog.NewNullLogger(), &lastWords{}, nil}
	l.Warn(wire.LogDroppedMsg, wire.LogDroppedKey, 5.0, wire.LogLastErrorKey, "x")
	if l.words.String() != "" {
		t.Errorf("last words of an unlimited plugin's report = %q, want none", l.words)
	}
}
