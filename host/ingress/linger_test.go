package ingress_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/plughost/plughost/host/ingress"
)

// TestLingerFollowsProgress checks that the discard after an early answer
// goes on while the body keeps arriving, as nginx's lingering_timeout
// does, rather than for a fixed time: a client that sends its body in
// pieces, never pausing for the linger timeout but for longer than it in
// all, and reads only when it has sent everything, still reads the 413.
func TestLingerFollowsProgress(t *testing.T) {
	const (
		timeout = 2 * time.Second
		pieces  = 50
		gap     = 100 * time.Millisecond // pieces × gap is 2.5 × timeout
	)
	ingress.SetLinger(t, timeout, time.Minute)
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 10, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, faulty())

	conn := f.dialRaw(t)
	start := time.Now()
	if i, err := trickle(t, conn, pieces, gap); err != nil {
		t.Fatalf("piece %d of the body, %v after the head: %v (the host stopped reading)", i, time.Since(start), err)
	}
	if r := readResponse(t, conn); r.code != http.StatusRequestEntityTooLarge || r.errorCode() != "body_too_large" {
		t.Errorf("POST of %d bytes over %v in pieces %v apart, read after sending = %d %s, want 413 body_too_large",
			pieces*trickledPiece, time.Since(start), gap, r.code, r.body)
	}
}

// TestLingerIsBounded checks that the discard after an early answer ends
// after lingerTime in all, even while the body keeps arriving: a client
// trickling an endless body cannot hold the connection.
func TestLingerIsBounded(t *testing.T) {
	const (
		total  = 2 * time.Second
		pieces = 100
		gap    = 100 * time.Millisecond // pieces × gap is 5 × total
	)
	ingress.SetLinger(t, time.Minute, total)
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 10, RequestTimeout: 30 * time.Second, BodyTimeout: 30 * time.Second}, faulty())

	conn := f.dialRaw(t)
	start := time.Now()
	if i, err := trickle(t, conn, pieces, gap); err != nil {
		t.Logf("piece %d of the body, %v after the head: %v", i, time.Since(start), err)
		return
	}
	t.Errorf("the host read all %d bytes of a body it had answered 413, over %v, want it to stop after %v", pieces*trickledPiece, time.Since(start), total)
}

// trickledPiece is the size of each piece trickle sends.
const trickledPiece = 4 << 10

// trickle sends on conn the head of POST /faulty/echo declaring a body of
// pieces × trickledPiece bytes, then the body a piece every gap, and
// returns the index of the piece whose write failed and its error, if
// one did.
func trickle(t *testing.T, conn net.Conn, pieces int, gap time.Duration) (int, error) {
	t.Helper()
	if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", pieces*trickledPiece); err != nil {
		t.Fatal(err)
	}
	piece := bytes.Repeat([]byte("p"), trickledPiece)
	for i := range pieces {
		if _, err := conn.Write(piece); err != nil {
			return i, err
		}
		time.Sleep(gap) // the client's pace, not a condition
	}
	return 0, nil
}

// TestAnswerAfterSlowBody checks that a body that takes longer than the
// server's write timeout to arrive still gets its answer: the write
// deadline runs from when the body is in, not from the request's head.
// The answer here is the 413 of a chunked body that passes the cap only
// after the write timeout.
func TestAnswerAfterSlowBody(t *testing.T) {
	const writeTimeout = 500 * time.Millisecond
	f := newFixture(t, ingress.Limits{MaxBodyBytes: 1 << 10, RequestTimeout: 100 * time.Millisecond, BodyTimeout: 30 * time.Second, WriteTimeout: writeTimeout}, faulty())
	srv := httptest.NewUnstartedServer(f.g)
	srv.Config.WriteTimeout = writeTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	f.srv = srv

	conn := f.dialRaw(t)
	if _, err := fmt.Fprintf(conn, "POST /faulty/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n200\r\n%s\r\n", bytes.Repeat([]byte("a"), 0x200)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * writeTimeout) // the write timeout passes: the condition itself
	if _, err := fmt.Fprintf(conn, "800\r\n%s\r\n0\r\n\r\n", bytes.Repeat([]byte("b"), 0x800)); err != nil {
		t.Fatal(err)
	}
	if r := readResponse(t, conn); r.code != http.StatusRequestEntityTooLarge || r.errorCode() != "body_too_large" {
		t.Errorf("chunked POST passing the 1 KiB cap %v after its head = %d %s, want 413 body_too_large", 2*writeTimeout, r.code, r.body)
	}
}
