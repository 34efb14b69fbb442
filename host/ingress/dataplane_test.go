package ingress_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The ingress sends every request over the plugin's data plane (package
// dataplane), many at once on each connection. These tests check, through
// real HTTP and real plugin processes, what that must not change.

func TestManyConcurrentRequests(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	const n = 200
	codes := make([]int, n)
	bodies := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.srv.URL+fmt.Sprintf("/hello/sleep?ms=%d", 50+i%50), nil)
			if err != nil {
				return
			}
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			codes[i], bodies[i] = resp.StatusCode, string(b)
		})
	}
	wg.Wait()
	for i := range n {
		want := fmt.Sprintf(`{"slept_ms":%d}`+"\n", 50+i%50)
		if codes[i] != http.StatusOK || bodies[i] != want {
			t.Errorf("GET /hello/sleep?ms=%d = %d %q, want 200 %q", 50+i%50, codes[i], bodies[i], want)
		}
	}
}

func TestPluginKilledWithRequestsInFlight(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	p := f.plugin("hello")
	pid := p.Status().Pid
	const n = 10
	var held []<-chan response
	for range n {
		_, ch := f.background(t, "/hello/sleep?ms=60000")
		held = append(held, ch)
	}
	waitFor(t, 30*time.Second, "the sleep requests to be in flight", func() bool { return f.inflight("hello") == n })
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for _, ch := range held {
		r := receive(t, ch, "a request to the killed plugin")
		if r.code != http.StatusServiceUnavailable || r.errorCode() != "plugin_unavailable" {
			t.Errorf("GET /hello/sleep while the plugin is killed = %d %s, want 503 plugin_unavailable", r.code, r.body)
		}
	}
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("requests in flight were answered %v after the kill, want promptly", took)
	}
	waitFor(t, 30*time.Second, "hello to be restarted", func() bool { return p.Ready() && p.Status().Pid != pid })
	if r := f.get(t, "/hello/"); r.code != http.StatusOK {
		t.Errorf("GET /hello/ after the restart = %d %s, want 200", r.code, r.body)
	}
}

// TestUnencodableRequest checks that a request the host could not encode
// for the plugin (a header value that is not UTF-8) is the client's fault,
// refused with 400 before it reaches the plugin, and fails alone.
func TestUnencodableRequest(t *testing.T) {
	f := newFixture(t, defaultLimits, hello())
	_, held := f.background(t, "/hello/sleep?ms=500")
	waitFor(t, 30*time.Second, "the sleep request to be in flight", func() bool { return f.inflight("hello") == 1 })
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.srv.URL+"/hello/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Bad", "\xff")
	if r := f.do(t, req); r.code != http.StatusBadRequest || r.errorCode() != "bad_request" {
		t.Errorf("GET /hello/ with a header that is not UTF-8 = %d %s, want 400 bad_request", r.code, r.body)
	}
	if r := receive(t, held, "the sleep request"); r.code != http.StatusOK {
		t.Errorf("GET /hello/sleep in flight meanwhile = %d %s, want 200", r.code, r.body)
	}
}
