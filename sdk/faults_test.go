package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

func TestFaultsInject(t *testing.T) {
	var nilFaults *Faults
	if err := nilFaults.Inject(t.Context(), "p"); err != nil {
		t.Errorf("nil Faults.Inject = %v, want nil", err)
	}
	f := &Faults{}
	if err := f.Inject(t.Context(), "p"); err != nil {
		t.Errorf("Inject with no fault = %v, want nil", err)
	}
	f.Set([]Fault{{Point: "p", Error: "disk full"}, {Point: "slow", Delay: time.Hour}})
	if err := f.Inject(t.Context(), "p"); !errors.Is(err, ErrInjected) || err.Error() != "sdk: injected fault at p: disk full" {
		t.Errorf("Inject(p) = %v, want the injected error", err)
	}
	if err := f.Inject(t.Context(), "other"); err != nil {
		t.Errorf("Inject(other) = %v, want nil", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := f.Inject(ctx, "slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Inject(slow) with a short deadline = %v, want DeadlineExceeded", err)
	}
	f.Set(nil)
	if got := f.List(); len(got) != 0 {
		t.Errorf("List after Set(nil) = %v, want none", got)
	}
}

// TestFaultsSetReleases checks that a call held by a delay is released
// when the faults change, and applies what is set at its point then.
func TestFaultsSetReleases(t *testing.T) {
	for _, tt := range []struct {
		name string
		then []Fault
		want string // the error Inject returns, "" for nil
	}{
		{"cleared", nil, ""},
		{"replaced by an error", []Fault{{Point: "slow", Error: "boom"}}, "sdk: injected fault at slow: boom"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &Faults{}
				f.Set([]Fault{{Point: "slow", Delay: time.Hour}})
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- f.Inject(t.Context(), "slow") }()
				synctest.Wait() // Inject waits out its delay
				f.Set(tt.then)
				err := <-done
				if held := time.Since(start); held > 0 {
					t.Errorf("Inject was held %v after Set changed its fault, want released at once", held)
				}
				if got := fmt.Sprint(err); err == nil && tt.want != "" || err != nil && got != tt.want {
					t.Errorf("Inject released by Set = %v, want %q", err, tt.want)
				}
			})
		})
	}
}

func TestSetFaultsRPC(t *testing.T) {
	var rt *Runtime
	p := pluginWith(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := rt.Faults().Inject(r.Context(), "handler"); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	p.Configure = func(_ context.Context, r *Runtime) error { rt = r; return nil }
	tp := startPlugin(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := tp.client.Configure(ctx, &pluginv1.ConfigureRequest{}); err != nil {
		t.Fatal(err)
	}
	call := func() int {
		resp, err := tp.handle(ctx, &dataplane.Request{Method: "GET", Path: "/"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.status
	}
	if got := call(); got != http.StatusOK {
		t.Fatalf("before faults: status %d, want 200", got)
	}
	resp, err := tp.client.SetFaults(ctx, &pluginv1.SetFaultsRequest{Faults: []*pluginv1.FaultSpec{{Point: "handler", Error: "rehearsal"}}})
	if err != nil || len(resp.GetFaults()) != 1 || resp.GetFaults()[0].GetPoint() != "handler" {
		t.Fatalf("SetFaults = %v, %v; want the fault echoed", resp, err)
	}
	if got := call(); got != http.StatusServiceUnavailable {
		t.Errorf("with the fault set: status %d, want 503", got)
	}
	if _, err := tp.client.SetFaults(ctx, &pluginv1.SetFaultsRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := call(); got != http.StatusOK {
		t.Errorf("after clearing: status %d, want 200", got)
	}
	if _, err := tp.client.SetFaults(ctx, &pluginv1.SetFaultsRequest{Faults: []*pluginv1.FaultSpec{{Point: ""}}}); err == nil {
		t.Errorf("SetFaults with an empty point succeeded, want InvalidArgument")
	}
}
