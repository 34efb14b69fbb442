package sdk

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

func TestFaultsInject(t *testing.T) {
	var nilFaults *Faults
	if err := nilFaults.Inject(t.Context(), "p"); err != nil {
		t.Errorf("nil Faults.Inject = %v, want nil", err)
	}
	f := &Faults{}
	f.Declare("p", "slow")
	if err := f.Inject(t.Context(), "p"); err != nil {
		t.Errorf("Inject with no fault = %v, want nil", err)
	}
	if err := f.Set([]Fault{{Point: "p", Error: "disk full"}, {Point: "slow", Delay: time.Hour}}); err != nil {
		t.Fatal(err)
	}
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

// TestFaultsUnknownPoint: Set refuses a list with a point not declared,
// whole, naming the declared points, and keeps the faults set before.
func TestFaultsUnknownPoint(t *testing.T) {
	f := &Faults{}
	err := f.Set([]Fault{{Point: "p", Error: "x"}})
	if !errors.Is(err, ErrUnknownPoint) || err.Error() != `sdk: unknown fault point "p": this plugin declares no fault points` {
		t.Errorf("Set with no point declared = %v, want ErrUnknownPoint saying none are declared", err)
	}
	f.Declare("store.commit")
	f.Declare("ledger.sync", "store.commit")
	if got, want := f.Points(), []string{"ledger.sync", "store.commit"}; !slices.Equal(got, want) {
		t.Errorf("Points() = %q, want %q", got, want)
	}
	if err := f.Set([]Fault{{Point: "store.commit", Error: "EIO"}}); err != nil {
		t.Fatalf("Set at a declared point = %v", err)
	}
	err = f.Set([]Fault{{Point: "ledger.sync", Delay: time.Hour}, {Point: "store.comit", Error: "x"}})
	if !errors.Is(err, ErrUnknownPoint) || err.Error() != `sdk: unknown fault point "store.comit": this plugin's fault points are "ledger.sync", "store.commit"` {
		t.Errorf("Set with a misspelt point = %v, want ErrUnknownPoint naming the declared points", err)
	}
	if got := f.List(); len(got) != 1 || got[0].Point != "store.commit" || got[0].Error != "EIO" {
		t.Errorf("List after the refused Set = %+v, want the store.commit fault set before", got)
	}
	if err := f.Inject(t.Context(), "ledger.sync"); err != nil {
		t.Errorf("Inject(ledger.sync) after the refused Set = %v, want nil: nothing of the list is set", err)
	}
	if err := f.Set(nil); err != nil || len(f.List()) != 0 {
		t.Errorf("Set(nil) = %v, List %+v; want no error and no faults", err, f.List())
	}
	var nilFaults *Faults
	if got := nilFaults.Points(); got != nil {
		t.Errorf("nil Faults.Points() = %q, want none", got)
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
				f.Declare("slow")
				if err := f.Set([]Fault{{Point: "slow", Delay: time.Hour}}); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- f.Inject(t.Context(), "slow") }()
				synctest.Wait() // Inject waits out its delay
				if err := f.Set(tt.then); err != nil {
					t.Fatal(err)
				}
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
	p.Configure = func(_ context.Context, r *Runtime) error {
		rt = r
		rt.Faults().Declare("handler")
		return nil
	}
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
	_, err = tp.client.SetFaults(ctx, &pluginv1.SetFaultsRequest{Faults: []*pluginv1.FaultSpec{{Point: "handlr", Error: "typo"}}})
	if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != `"handlr": this plugin's fault points are "handler"` {
		t.Errorf("SetFaults at an undeclared point = %v, want NotFound naming the plugin's points", err)
	}
	if got := call(); got != http.StatusServiceUnavailable {
		t.Errorf("after the refused SetFaults: status %d, want 503 from the fault set before", got)
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
