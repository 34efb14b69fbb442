package bus_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/sdk/bus"
)

func TestWriterHead(t *testing.T) {
	rec := httptest.NewRecorder()
	bus.NewWriter(rec)
	if rec.Code != http.StatusOK || !rec.Flushed {
		t.Errorf("NewWriter: status %d, flushed %v, want 200 flushed", rec.Code, rec.Flushed)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-store"} {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("NewWriter: %s = %q, want %q", k, got, want)
		}
	}
}

func TestWriterEvent(t *testing.T) {
	for _, tt := range []struct {
		name, event, id, data string
		want                  string
	}{
		{"with id", "entry", "7", `{"version":7}`, "event: entry\nid: 7\ndata: {\"version\":7}\n\n"},
		{"without id", "lagged", "", `{"missed":3}`, "event: lagged\ndata: {\"missed\":3}\n\n"},
		{"empty data", "ping", "", "", "event: ping\ndata: \n\n"},
		{"lines", "x", "", "a\nb\r\nc\rd", "event: x\ndata: a\ndata: b\ndata: c\ndata: d\n\n"},
		{"trailing line break", "x", "1", "a\n", "event: x\nid: 1\ndata: a\ndata: \n\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			w := bus.NewWriter(rec)
			rec.Body.Reset()
			if err := w.Event(tt.event, tt.id, []byte(tt.data)); err != nil {
				t.Fatalf("Event(%q, %q, %q) = %v", tt.event, tt.id, tt.data, err)
			}
			if got := rec.Body.String(); got != tt.want {
				t.Errorf("Event(%q, %q, %q) wrote %q, want %q", tt.event, tt.id, tt.data, got, tt.want)
			}
		})
	}
	w := bus.NewWriter(httptest.NewRecorder())
	for _, f := range [][2]string{{"a\nb", ""}, {"a", "1\r"}, {"a", "1\n2"}} {
		if err := w.Event(f[0], f[1], nil); !errors.Is(err, bus.ErrFraming) {
			t.Errorf("Event(%q, %q) = %v, want ErrFraming", f[0], f[1], err)
		}
	}
}

// FuzzWriterEvent: whatever the data, an event is one frame that a
// client parses back to the name, the id and the data, its line breaks
// as LF.
func FuzzWriterEvent(f *testing.F) {
	f.Add("entry", "7", []byte(`{"version":7}`))
	f.Add("lagged", "", []byte("a\r\nb\rc\n"))
	f.Add("x", "1", []byte("\n\n"))
	f.Fuzz(func(t *testing.T, name, id string, data []byte) {
		rec := httptest.NewRecorder()
		w := bus.NewWriter(rec)
		rec.Body.Reset()
		err := w.Event(name, id, data)
		if strings.ContainsAny(name+id, "\r\n") {
			if !errors.Is(err, bus.ErrFraming) {
				t.Fatalf("Event(%q, %q) = %v, want ErrFraming", name, id, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		got := parse(t, rec.Body.String())
		if len(got) != 1 {
			t.Fatalf("Event(%q, %q, %q) wrote %d frames, want 1", name, id, data, len(got))
		}
		want := sse{name, id, strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(string(data))}
		if got[0] != want {
			t.Fatalf("Event(%q, %q, %q) parses as %+v, want %+v", name, id, data, got[0], want)
		}
	})
}

// sse is one event as a client parses it.
type sse struct{ event, id, data string }

// parse reads frames as the EventSource algorithm does, for the fields
// Writer writes.
func parse(t *testing.T, s string) (evs []sse) {
	t.Helper()
	var ev sse
	var data []string
	for _, line := range strings.Split(strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(s), "\n") {
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "":
			if line == "" && data != nil {
				ev.data = strings.Join(data, "\n")
				evs = append(evs, ev)
				ev, data = sse{}, nil
			}
		case "event":
			ev.event = value
		case "id":
			ev.id = value
		case "data":
			data = append(data, value)
		default:
			t.Fatalf("field %q in %q", field, s)
		}
	}
	return evs
}

// serve streams b to each request as the plugins do: event "n" with the
// number as its id, a lagged event with what was missed, and the end of
// the stream when cut off, drained or the client goes.
func serve(b *bus.Bus[int], buffer int) http.Handler {
	payload := strings.Repeat("x", 4096)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		sub := b.Subscribe(r.URL.Query().Get("consumer"), buffer)
		defer sub.Close()
		w := bus.NewWriter(rw)
		for {
			v, err := sub.Next(r.Context())
			if errors.Is(err, bus.ErrLagged) {
				_ = w.Event("lagged", "", []byte("{}"))
				w.Flush()
				return
			}
			if err != nil {
				return
			}
			if n := sub.Missed(); n > 0 {
				if w.Event("lagged", "", fmt.Appendf(nil, `{"missed":%d}`, n)) != nil {
					return
				}
			}
			if w.Event("n", strconv.Itoa(v), []byte(payload)) != nil {
				return
			}
			w.Flush()
		}
	})
}

// TestSlowClient: over a real socket, a client that stops reading never
// blocks the publisher. Once it reads again, under CutOff its stream
// ends with lagged; under DropOldest it goes on, and its lagged events
// account for every gap in its ids.
func TestSlowClient(t *testing.T) {
	for _, p := range []bus.Policy{bus.CutOff, bus.DropOldest} {
		t.Run(p.String(), func(t *testing.T) {
			b, reg := newBus(t, bus.Options{Policy: p, Consumers: []string{"slow"}})
			srv := httptest.NewServer(serve(b, 16))
			defer srv.Close()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+"?consumer=slow", nil)
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			waitFor(t, "the consumer to subscribe", func() bool { return b.Len() == 1 })
			// 4 KiB events, 64 MiB in all: more than the socket buffers
			// hold between a handler and a client that does not read.
			const n = 16384
			published := make(chan struct{})
			go func() {
				defer close(published)
				for v := 1; v <= n; v++ {
					b.Publish(v)
				}
			}()
			select {
			case <-published:
			case <-time.After(20 * time.Second):
				t.Fatal("Publish blocked behind a client that does not read")
			}
			if got := lagged(t, reg)["slow"]; got == 0 {
				t.Fatalf("bus_lagged_total{consumer=slow} = 0 after %d events to a client that does not read", n)
			}
			if p == bus.DropOldest {
				b.Publish(n + 1) // the stream's last event
			}
			var last, missed int
			var end string
			rd := bufio.NewReaderSize(resp.Body, 8192)
			for {
				line, err := rd.ReadString('\n')
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("read the stream: %v", err)
				}
				switch {
				case strings.HasPrefix(line, "id: "):
					id, _ := strconv.Atoi(strings.TrimSpace(line[4:]))
					if id != last+missed+1 {
						t.Fatalf("id %d after %d with %d missed, want %d", id, last, missed, last+missed+1)
					}
					last, missed = id, 0
				case strings.HasPrefix(line, `data: {"missed":`):
					fmt.Sscanf(line, `data: {"missed":%d}`, &missed)
				case line == "event: lagged\n" || line == "event: n\n":
					end = line
				}
				if p == bus.DropOldest && last == n+1 {
					break
				}
			}
			switch {
			case p == bus.CutOff && end != "event: lagged\n":
				t.Errorf("cut-off stream ended with %q after id %d, want event: lagged", end, last)
			case p == bus.DropOldest && last != n+1:
				t.Errorf("drop-oldest stream ended at id %d, want %d", last, n+1)
			}
		})
	}
}

// TestDrainEndsStream: closing Options.Drain ends a stream whose request
// goes on.
func TestDrainEndsStream(t *testing.T) {
	drained := make(chan struct{})
	b, _ := newBus(t, bus.Options{Drain: drained})
	srv := httptest.NewServer(serve(b, 4))
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, "the consumer to subscribe", func() bool { return b.Len() == 1 })
	close(drained)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("read the drained stream: %v, want its end", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s of the drain")
	}
	waitFor(t, "the consumer to unsubscribe", func() bool { return b.Len() == 0 })
}

// waitFor polls cond until it holds, failing after 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
