package dataplane

import (
	"context"
	"errors"
	"testing"
	"time"
)

type ctxKey struct{}

// TestRequestContext checks that a request's context, whether or not
// anything armed it by asking for Done, ends as
// context.WithDeadline(parent, deadline) would: with the first of its
// deadline, its parent's end and cancel.
func TestRequestContext(t *testing.T) {
	past, future := time.Now().Add(-time.Millisecond), time.Now().Add(time.Hour)
	tests := []struct {
		name     string
		deadline time.Time
		arm      bool // ask for Done first
		cancel   bool
		parent   bool // cancel the parent
		want     error
	}{
		{name: "running", deadline: future},
		{name: "running, armed", deadline: future, arm: true},
		{name: "no deadline", deadline: time.Time{}},
		{name: "no deadline, armed", arm: true},
		{name: "past its deadline", deadline: past, want: context.DeadlineExceeded},
		{name: "past its deadline, armed", deadline: past, arm: true, want: context.DeadlineExceeded},
		{name: "cancelled", deadline: future, cancel: true, want: context.Canceled},
		{name: "cancelled, armed", deadline: future, arm: true, cancel: true, want: context.Canceled},
		{name: "cancelled past its deadline", deadline: past, cancel: true, want: context.DeadlineExceeded},
		{name: "cancelled past its deadline, armed", deadline: past, arm: true, cancel: true, want: context.DeadlineExceeded},
		{name: "parent cancelled", deadline: future, parent: true, want: context.Canceled},
		{name: "parent cancelled, armed", deadline: future, arm: true, parent: true, want: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, stop := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "v"))
			defer stop()
			c := &requestContext{parent: parent, deadline: tt.deadline}
			defer c.cancel()
			if tt.arm {
				c.Done()
			}
			if tt.cancel {
				c.cancel()
			}
			if tt.parent {
				stop()
			}
			if err := c.Err(); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Err() = %v, want %v", err, tt.want)
			}
			dl, ok := c.Deadline()
			if dl != tt.deadline || ok == tt.deadline.IsZero() {
				t.Errorf("Deadline() = %v, %v, want %v, %v", dl, ok, tt.deadline, !tt.deadline.IsZero())
			}
			// Done and Value arm it: what they show agrees with Err.
			select {
			case <-c.Done():
				if tt.want == nil {
					t.Errorf("Done() is closed with Err() %v, want open", c.Err())
				}
			default:
				if tt.want != nil {
					t.Errorf("Done() is open, want closed with %v", tt.want)
				}
			}
			if err := c.Err(); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Err() once armed = %v, want %v", err, tt.want)
			}
			if v := c.Value(ctxKey{}); v != "v" {
				t.Errorf("Value() = %v, want the parent's %q", v, "v")
			}
		})
	}
}

// TestRequestContextDeadlinePasses checks that the deadline ends an armed
// context, and a context derived from it, with DeadlineExceeded.
func TestRequestContextDeadlinePasses(t *testing.T) {
	c := &requestContext{parent: t.Context(), deadline: time.Now().Add(20 * time.Millisecond)}
	defer c.cancel()
	child, stop := context.WithCancel(c)
	defer stop()
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from the request's was not done 10s after the request's deadline")
	}
	if err := child.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("derived context's Err() = %v, want %v", err, context.DeadlineExceeded)
	}
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Err() = %v, want %v", err, context.DeadlineExceeded)
	}
}
