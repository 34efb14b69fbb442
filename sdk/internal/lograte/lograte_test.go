package lograte_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk/internal/lograte"
	"github.com/plughost/plughost/sdk/wire"
)

// clock is a clock and a timer the test moves by hand: AfterFunc keeps
// what it is given, and advance runs what has come due.
type clock struct {
	t       time.Time
	pending []timer
}

type timer struct {
	at time.Time
	f  func()
}

func (c *clock) now() time.Time { return c.t }

func (c *clock) afterFunc(d time.Duration, f func()) {
	c.pending = append(c.pending, timer{c.t.Add(d), f})
}

func (c *clock) advance(d time.Duration) {
	c.t = c.t.Add(d)
	var due []timer
	rest := c.pending[:0]
	for _, tm := range c.pending {
		if tm.at.After(c.t) {
			rest = append(rest, tm)
		} else {
			due = append(due, tm)
		}
	}
	c.pending = rest
	for _, tm := range due {
		tm.f()
	}
}

// setup returns a logger limited to rate and burst, with its reports, as
// Serve makes them, and the buffer both write their JSON records to.
func setup(t *testing.T, rate, burst int) (hclog.Logger, *lograte.Limiter, *clock, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	opts := hclog.LoggerOptions{Name: "p", Level: hclog.Trace, Output: &buf, JSONFormat: true}
	report := opts
	limit := lograte.New(lograte.Options{Rate: rate, Burst: burst, Report: hclog.New(&report), Now: c.now, AfterFunc: c.afterFunc})
	if limit != nil {
		opts.Exclude = limit.Exclude
	}
	return hclog.New(&opts), limit, c, &buf
}

// records returns the JSON records in buf and empties it.
func records(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(buf)
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("record %q: %v", sc.Text(), err)
		}
		out = append(out, r)
	}
	buf.Reset()
	return out
}

// messages lists the @message of each record.
func messages(recs []map[string]any) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r["@message"].(string))
	}
	return out
}

func TestLimiterRateAndBurst(t *testing.T) {
	logger, limit, c, buf := setup(t, 2, 3)
	defer limit.Close()
	logger.Info("a")
	logger.Named("sub").With("k", "v").Info("b") // sub-loggers share the limit
	logger.Debug("c")
	logger.Info("d") // the burst is spent
	c.advance(499 * time.Millisecond)
	logger.Info("e") // not yet a token
	c.advance(time.Millisecond)
	logger.Info("f") // one token, 500ms at 2 a second
	logger.Info("g")
	if diff := cmp.Diff([]string{"a", "b", "c", "f"}, messages(records(t, buf))); diff != "" {
		t.Errorf("logged records mismatch (-want +got):\n%s", diff)
	}
}

func TestLimiterLongRecord(t *testing.T) {
	logger, limit, _, buf := setup(t, 1, 3)
	defer limit.Close()
	long := strings.Repeat("x", wire.LogUnit) // and its message: two units
	logger.Info("long", "text", long)
	logger.Info("short")
	logger.Info("dropped")
	if diff := cmp.Diff([]string{"long", "short"}, messages(records(t, buf))); diff != "" {
		t.Errorf("logged records mismatch (-want +got):\n%s", diff)
	}
}

// TestLimiterReports checks that while records are dropped one report a
// ReportInterval says how many, which the limit does not drop but charges
// to the bucket, and that Close reports the rest.
func TestLimiterReports(t *testing.T) {
	logger, limit, c, buf := setup(t, 1, 1)
	logger.Info("kept")
	for range 3 {
		logger.Info("dropped")
	}
	logger.Error("failed", "error", "disk full")
	logger.Info("dropped")
	c.advance(ReportDue - time.Millisecond)
	if got := records(t, buf); len(got) != 1 {
		t.Fatalf("before the interval: %d records, want only the kept one: %v", len(got), got)
	}
	c.advance(time.Millisecond)
	want := map[string]any{
		"@level": "warn", "@message": wire.LogDroppedMsg, "@module": "p",
		wire.LogDroppedKey: 5.0, wire.LogDroppedErrorsKey: 1.0, "interval": "1s",
		wire.LogLastErrorKey: "failed error=disk full",
	}
	got := records(t, buf)
	if len(got) != 1 {
		t.Fatalf("after the interval: %d records, want one report: %v", len(got), got)
	}
	delete(got[0], "@timestamp")
	if diff := cmp.Diff(want, got[0]); diff != "" {
		t.Errorf("report mismatch (-want +got):\n%s", diff)
	}
	// The report took the token the bucket gained meanwhile.
	logger.Info("dropped after the report")
	c.advance(ReportDue)
	got = records(t, buf)
	if len(got) != 1 || got[0][wire.LogDroppedKey] != 1.0 || got[0][wire.LogLastErrorKey] != nil {
		t.Errorf("a second after a dropped record logged %v, want a report of it alone", got)
	}

	// No drops, no report.
	c.advance(10 * ReportDue)
	if got := records(t, buf); len(got) != 0 {
		t.Errorf("quiet interval logged %v, want nothing", got)
	}

	// A flood of 4 records a second for 3s. The bucket is full after
	// the quiet spell (1 token) and gains one a second, and each report
	// takes one: the first second's record passes and so does the
	// second's, but the third's token pays for the second report.
	for range 12 {
		logger.Info("flood")
		c.advance(250 * time.Millisecond)
	}
	c.advance(250 * time.Millisecond)
	var logged int
	var counts []any
	for _, r := range records(t, buf) {
		switch r["@message"] {
		case "flood":
			logged++
		case wire.LogDroppedMsg:
			counts = append(counts, r[wire.LogDroppedKey])
		}
	}
	if logged != 2 {
		t.Errorf("logged %d flood records in 3s, want 2", logged)
	}
	if diff := cmp.Diff([]any{3.0, 4.0, 3.0}, counts); diff != "" {
		t.Errorf("reported counts mismatch (-want +got):\n%s", diff)
	}

	c.advance(2 * time.Second) // out of debt, and a token
	logger.Info("kept before close")
	logger.Info("dropped before close")
	logger.Info("dropped before close")
	limit.Close()
	got = records(t, buf)
	if len(got) != 2 || got[1][wire.LogDroppedKey] != 2.0 || got[1][wire.LogLastErrorKey] != nil {
		t.Errorf("Close logged %v, want the kept record and a report of 2 records and no error", got)
	}
	c.advance(ReportDue) // the report scheduled before Close finds nothing
	if got := records(t, buf); len(got) != 0 {
		t.Errorf("after Close logged %v, want nothing", got)
	}
}

// ReportDue is when the first report of a flood is due.
const ReportDue = lograte.ReportInterval

func TestNoRateNoLimit(t *testing.T) {
	logger, limit, _, buf := setup(t, 0, 10)
	if limit != nil {
		t.Fatalf("New with rate 0 = %v, want nil", limit)
	}
	for range 100 {
		logger.Info("r")
	}
	limit.Close()
	if got := len(records(t, buf)); got != 100 {
		t.Errorf("logged %d records, want all 100", got)
	}
}

func TestLastErrorCut(t *testing.T) {
	logger, limit, _, buf := setup(t, 1, 1)
	logger.Info("kept")
	logger.Error("failed", "error", strings.Repeat("é", 1000))
	limit.Close()
	recs := records(t, buf)
	last, _ := recs[len(recs)-1][wire.LogLastErrorKey].(string)
	if !strings.HasPrefix(last, "failed error=é") || !strings.HasSuffix(last, "é…") || len(last) > 520 {
		t.Errorf("last_error = %q (%d bytes), want the record cut to about 512 bytes on a rune boundary", last, len(last))
	}
}
