//go:build unix

package dataplane_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	host "github.com/plughost/plughost/host/dataplane"
)

// TestSlowHandlerHoldsUpNoOtherRequest checks that a handler that runs
// long on an ordinary route with no body to wait for, one the connection's
// reader runs in its own goroutine, holds up neither the other requests on
// its connection (the plane has one) nor the Cancel frame meant for it.
func TestSlowHandlerHoldsUpNoOtherRequest(t *testing.T) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	cancelled := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/blocked", func(w http.ResponseWriter, r *http.Request) {
		// Deaf to its context: only the test ends it.
		started <- struct{}{}
		<-release
		w.Write([]byte("blocked"))
	})
	mux.HandleFunc("/waits", func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-r.Context().Done()
		cancelled <- r.Context().Err()
	})
	mux.HandleFunc("/quick", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("quick")) })
	p := servePlane(t, mux)
	t.Cleanup(open) // before the plane's cleanup, which waits for the handler

	blocked := p.goDo(t.Context(), &host.Request{Method: "GET", Path: "/blocked"})
	await(t, started, "the blocked handler to start")
	// Several in a row, each served by whoever reads the connection by
	// then, within a bound far below the test's waitTime.
	for i := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		r, err := p.do(ctx, &host.Request{Method: "GET", Path: "/quick"})
		cancel()
		if err != nil || string(r.body()) != "quick" {
			t.Fatalf("request %d to /quick behind a blocked handler = %v; want it answered at once", i, err)
		}
	}

	ctx, cancel := context.WithCancel(t.Context())
	waits := p.goDo(ctx, &host.Request{Method: "GET", Path: "/waits"})
	await(t, started, "the waiting handler to start")
	cancel()
	if err := await(t, cancelled, "the waiting handler to see its Cancel"); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting handler's r.Context().Err() = %v, want %v", err, context.Canceled)
	}
	if res := await(t, waits, "the cancelled request"); !errors.Is(res.err, context.Canceled) {
		t.Errorf("do(/waits) cancelled = %v, want %v", res.err, context.Canceled)
	}

	open()
	if res := await(t, blocked, "the blocked request"); res.err != nil || string(res.reply.body()) != "blocked" {
		t.Errorf("do(/blocked) = %v, want its answer once released", res.err)
	}
}
