package ingress_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/ingress"
	"github.com/plughost/plughost/host/metrics"
)

// TestListenerRefusesBeyondCap fills a listener's cap and checks that a
// client beyond it reads a 503 with Retry-After, even when it sends a
// whole request body before reading (a close with that body unread would
// reset the connection and lose the answer), and that a closed
// connection frees its slot.
func TestListenerRefusesBeyondCap(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := ingress.NewListener(raw, ingress.ListenerOptions{Name: "ingress", MaxConns: 1, Metrics: metrics.New().Conns})
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	})

	first, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	var held net.Conn
	select {
	case held = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the first connection was not accepted")
	}

	tests := []struct {
		name string
		req  string
	}{
		{"get", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"post with a body sent before reading", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 524288\r\n\r\n" + strings.Repeat("x", 524288)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, tt.req); err != nil {
				t.Fatalf("send: %v", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("read the answer beyond the cap: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
				!bytes.Contains(body, []byte(`"too_many_connections"`)) {
				t.Errorf("answer beyond the cap = %d (Retry-After %q) %s, want 503 too_many_connections, Retry-After 1",
					resp.StatusCode, resp.Header.Get("Retry-After"), body)
			}
		})
	}
	select {
	case c := <-accepted:
		t.Fatalf("a connection beyond the cap was accepted: %v", c.RemoteAddr())
	default:
	}

	held.Close()
	third, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a connection after a slot was freed was not accepted")
	}
}

// TestClientKey checks the key the per-client caps count a client under:
// an IPv4 address as it is, and an IPv6 address's /64, since one
// subscriber usually holds a whole /64.
func TestClientKey(t *testing.T) {
	tests := []struct {
		remote string
		want   string // "" when the address has no key
	}{
		{"192.0.2.7:5555", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:5555", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443", "2001:db8:1:2::"},
		{"[2001:db8:1:2::1]:443", "2001:db8:1:2::"},
		{"[2001:db8:1:3::1]:443", "2001:db8:1:3::"},
		{"[fe80::1%eth0]:80", "fe80::"},
		{"[::1]:80", "::"},
		{"plugin", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, ok := ingress.ClientKey(tt.remote)
		if tt.want == "" {
			if ok {
				t.Errorf("ClientKey(%q) = %v, true; want no key", tt.remote, got)
			}
			continue
		}
		if !ok || got.String() != tt.want {
			t.Errorf("ClientKey(%q) = %v, %t; want %s", tt.remote, got, ok, tt.want)
		}
	}
}
