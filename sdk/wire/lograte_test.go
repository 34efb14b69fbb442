package wire_test

import (
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/wire"
)

func TestLogBucket(t *testing.T) {
	type step struct {
		advance time.Duration
		size    int
		want    bool
	}
	tests := []struct {
		name        string
		rate, burst int
		steps       []step
	}{
		{name: "burst then drop", rate: 2, burst: 3, steps: []step{
			{0, 10, true}, {0, 10, true}, {0, 10, true}, {0, 10, false},
		}},
		{name: "refills at rate", rate: 2, burst: 3, steps: []step{
			{0, 10, true}, {0, 10, true}, {0, 10, true}, {0, 10, false},
			{499 * time.Millisecond, 10, false}, {time.Millisecond, 10, true}, {0, 10, false},
		}},
		{name: "refill capped at burst", rate: 10, burst: 2, steps: []step{
			{time.Hour, 1, true}, {0, 1, true}, {0, 1, false},
		}},
		{name: "burst of at least one", rate: 1, burst: 0, steps: []step{
			{0, 1, true}, {0, 1, false}, {time.Second, 1, true},
		}},
		{name: "long record takes a token per started unit", rate: 1, burst: 3, steps: []step{
			{0, wire.LogUnit + 1, true}, {0, 1, true}, {0, 1, false},
		}},
		{name: "record of whole units", rate: 1, burst: 2, steps: []step{
			{0, 2 * wire.LogUnit, true}, {0, 1, false},
		}},
		{name: "record longer than the bucket never passes", rate: 1, burst: 2, steps: []step{
			{0, 2*wire.LogUnit + 1, false}, {0, 2 * wire.LogUnit, true},
		}},
		{name: "a dropped record takes nothing", rate: 1, burst: 2, steps: []step{
			{0, 1, true}, {0, 2 * wire.LogUnit, false}, {0, 1, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			b := wire.NewLogBucket(tt.rate, tt.burst, now)
			for i, s := range tt.steps {
				now = now.Add(s.advance)
				if got := b.Take(s.size, now); got != s.want {
					t.Fatalf("step %d: Take(%d) = %v, want %v", i, s.size, got, s.want)
				}
			}
		})
	}
}

// TestLogBucketCharge checks that a charged record is paid for even when
// the bucket is short, and that the debt is paid back before another
// record passes.
func TestLogBucketCharge(t *testing.T) {
	now := time.Unix(1000, 0)
	b := wire.NewLogBucket(2, 2, now)
	b.Charge(1, now)
	b.Charge(wire.LogUnit+1, now) // 2 tokens: 1 left of debt
	for _, s := range []struct {
		advance time.Duration
		want    bool
	}{{0, false}, {time.Second, true}, {0, false}, {500 * time.Millisecond, true}} {
		now = now.Add(s.advance)
		if got := b.Take(1, now); got != s.want {
			t.Fatalf("Take(1) %v on = %v, want %v", s.advance, got, s.want)
		}
	}
}

func TestLogRecordSize(t *testing.T) {
	tests := []struct {
		msg  string
		args []any
		want int
	}{
		{"", nil, 0},
		{"hello", nil, 5},
		{"hello", []any{"key", "value"}, 5 + 5 + 7},
		{"n", []any{"n", 42, "err", nil}, 1 + 3 + 5},
		{strings.Repeat("x", wire.LogUnit), []any{"k"}, wire.LogUnit + 3},
	}
	for _, tt := range tests {
		if got := wire.LogRecordSize(tt.msg, tt.args); got != tt.want {
			t.Errorf("LogRecordSize(%.10q, %v) = %d, want %d", tt.msg, tt.args, got, tt.want)
		}
	}
}
