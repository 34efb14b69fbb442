//go:build unix

package dataplane_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/plughost/plughost/host/dataplane"
)

// TestRequestDeadline checks Request.Deadline, which the transport
// enforces with no timer per request: it travels to the plugin as the
// earlier of it and ctx's, and once it passes the request fails with
// context.DeadlineExceeded, whether it waits for its head or its body,
// and the plugin is told to cancel it.
func TestRequestDeadline(t *testing.T) {
	const within = 50 * time.Millisecond
	for _, afterHead := range []bool{false, true} {
		name := map[bool]string{false: "waiting for the head", true: "reading the body"}[afterHead]
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, 1)
			fake := h.fakes[0]
			deadline := time.Now().Add(within)
			// ctx's own deadline is later: Request.Deadline applies.
			ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
			defer cancel()
			rt := h.goRoundTrip(ctx, &dataplane.Request{Method: "GET", Path: "/", Deadline: deadline})
			id, rh, _ := fake.recvRequest()
			if got := rh.GetDeadlineUnixNano(); got != deadline.UnixNano() {
				t.Errorf("head's deadline = %v, want the Request's %v", time.Unix(0, got), deadline)
			}
			var err error
			if afterHead {
				fake.send(head(id, 200, []byte("a"), true, 0))
				res := await(t, rt, "RoundTrip")
				if res.err != nil {
					t.Fatalf("RoundTrip() = %v", res.err)
				}
				defer res.resp.Close()
				if p, err := res.resp.Next(); err != nil || string(p) != "a" {
					t.Fatalf("Next() = %q, %v, want the head's piece", p, err)
				}
				_, err = readAll(t, res.resp)
			} else {
				err = await(t, rt, "RoundTrip").err
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("past the Request's deadline: %v, want %v", err, context.DeadlineExceeded)
			}
			if late := time.Since(deadline); late < 0 {
				t.Errorf("failed %v before the deadline", -late)
			}
			fake.recvCancel(id)
		})
	}
}

// TestRequestDeadlineWhileSending checks that a request waiting to send,
// behind another whose body the plugin does not read, fails at its
// Request.Deadline rather than when the way clears.
func TestRequestDeadlineWhileSending(t *testing.T) {
	h := newHarness(t, 1)
	// Far more than the socket's buffers hold: once they are full, its
	// sender keeps the send lock while the fake plugin reads no more.
	h.goRoundTrip(t.Context(), &dataplane.Request{Method: "POST", Path: "/big", Body: [][]byte{make([]byte, 64<<20)}})
	if f := h.fakes[0].recv(); f.GetRequest() == nil {
		t.Fatalf("fake plugin got %v, want the head of the large request", f)
	}
	start := time.Now()
	rt := h.goRoundTrip(t.Context(), &dataplane.Request{Method: "GET", Path: "/", Deadline: start.Add(50 * time.Millisecond)})
	if err := await(t, rt, "RoundTrip behind a stalled sender").err; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RoundTrip() behind a stalled sender = %v, want %v", err, context.DeadlineExceeded)
	}
}
