package inflate

import (
	"bytes"
	"errors"
	"fmt"
	"net/http/httputil"
	"testing"
)

// chunk frames b as HTTP/1.1 chunks of at most n bytes, with the last
// chunk and an empty trailer.
func chunked(b []byte, n int) []byte {
	var out bytes.Buffer
	for len(b) > 0 {
		k := min(n, len(b))
		fmt.Fprintf(&out, "%x\r\n%s\r\n", k, b[:k])
		b = b[k:]
	}
	out.WriteString("0\r\n\r\n")
	return out.Bytes()
}

// FuzzChunkedBody feeds the guard a chunked body as a client frames it,
// through net/http's chunked reader (what the host's ingress uses): any
// framing, malformed or not, must end in a body within the limits or an
// error, never a panic or more than the cap.
func FuzzChunkedBody(f *testing.F) {
	small := gz(f, []byte(`{"to":"alice","amount":100}`))
	f.Add(chunked(small, 7), "gzip")
	f.Add(chunked(gz(f, make([]byte, 100000)), 1000), "gzip")
	f.Add(chunked([]byte("hello"), 1), "")
	f.Add([]byte("5\r\nhel"), "")                      // cut short
	f.Add([]byte("zz\r\nhello\r\n0\r\n\r\n"), "")      // bad size
	f.Add([]byte("ffffffffffffffff\r\nx\r\n"), "gzip") // huge size
	f.Add([]byte("3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\n"), "")
	lim := Limits{RatioMax: 10, RatioAfter: 1024, AbsCap: 64 << 10}
	f.Fuzz(func(t *testing.T, raw []byte, encoding string) {
		codings, err := Codings([]string{encoding})
		if err != nil {
			return
		}
		out, err := Decode(httputil.NewChunkedReader(bytes.NewReader(raw)), codings, lim)
		if err != nil {
			if out != nil {
				t.Fatalf("Decode failed with %v but returned %d bytes", err, len(out))
			}
			if errors.Is(err, ErrRatio) && len(codings) == 0 {
				t.Fatalf("an unencoded body failed the ratio: %v", err)
			}
			return
		}
		if int64(len(out)) > lim.AbsCap {
			t.Fatalf("Decode returned %d bytes, over the cap %d", len(out), lim.AbsCap)
		}
	})
}

func TestChunkedBodies(t *testing.T) {
	body := []byte(`{"to":"alice","amount":100}`)
	for _, n := range []int{1, 3, 4096} {
		got, err := Decode(httputil.NewChunkedReader(bytes.NewReader(chunked(gz(t, body), n))), []string{"gzip"}, testLimits)
		if err != nil || !bytes.Equal(got, body) {
			t.Errorf("Decode of gzip in chunks of %d = %q, %v; want the body", n, got, err)
		}
	}
	bomb := chunked(gz(t, make([]byte, 1<<20)), 333)
	if _, err := Decode(httputil.NewChunkedReader(bytes.NewReader(bomb)), []string{"gzip"}, testLimits); !errors.Is(err, ErrRatio) {
		t.Errorf("Decode of a chunked bomb = %v, want ErrRatio", err)
	}
	if _, err := Decode(httputil.NewChunkedReader(bytes.NewReader([]byte("5\r\nhel"))), nil, testLimits); err == nil {
		t.Errorf("Decode of a body cut inside a chunk succeeded, want the framing error")
	}
}
