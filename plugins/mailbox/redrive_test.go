package main

import (
	"errors"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/plughost/plughost/sdk/durable"
)

// TestRedriveQueueShut checks that once the redriver has abandoned its
// queue, as it does when it stops, a redrive is refused as draining
// rather than queued where nothing would run or count it: every
// accepted redrive is run or counted in tasks_aborted_total.
func TestRedriveQueueShut(t *testing.T) {
	run := &running{redrives: make(chan redriveJob, 2), stop: make(chan struct{}), m: newMetrics(1)}
	for i := range 2 {
		if err := run.queueRedrive(redriveJob{topic: "t", max: 1}); err != nil {
			t.Fatalf("redrive %d = %v, want queued", i, err)
		}
	}
	if err := run.queueRedrive(redriveJob{topic: "t", max: 1}); !errors.Is(err, errRedrivesFull) {
		t.Fatalf("a redrive past the queue's capacity = %v, want errRedrivesFull", err)
	}
	run.abandonRedrives()
	var m dto.Metric
	if err := run.m.abandoned.Write(&m); err != nil || m.GetCounter().GetValue() != 2 {
		t.Fatalf("tasks_aborted_total{kind=\"redrive\"} = %v (%v), want the 2 queued", m.GetCounter().GetValue(), err)
	}
	// The drain's stop is not closed: the redriver stopped on its own
	// context, which a drain cancels before run.stop is seen closed.
	if err := run.queueRedrive(redriveJob{topic: "t", max: 1}); !errors.Is(err, durable.ErrDraining) {
		t.Errorf("a redrive after the redriver stopped = %v, want durable.ErrDraining", err)
	}
	if n := len(run.redrives); n != 0 {
		t.Errorf("%d redrives queued after the redriver stopped, where nothing runs or counts them", n)
	}
}
