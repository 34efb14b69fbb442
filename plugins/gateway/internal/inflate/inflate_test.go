package inflate

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

var testLimits = Limits{RatioMax: 10, RatioAfter: 64 << 10, AbsCap: 8 << 20}

func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zl(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func rawDeflate(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// noise is incompressible enough that its gzip stays under any ratio.
func noise(n int) []byte { return noiseMask(n, 0xff) }

// hexNoise compresses about 2:1: its encoded form stays under the cap
// when the decoded form reaches it.
func hexNoise(n int) []byte { return noiseMask(n, 0x0f) }

func noiseMask(n int, mask byte) []byte {
	b := make([]byte, n)
	x := uint32(19)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x) & mask
	}
	return b
}

func TestDecode(t *testing.T) {
	zeros := func(n int) []byte { return make([]byte, n) }
	small := []byte(`{"to":"alice","amount":100}`)
	tests := []struct {
		name    string
		body    []byte
		codings []string
		lim     Limits
		want    []byte // nil when err is set
		err     error
	}{
		{"identity", small, nil, testLimits, small, nil},
		{"gzip", gz(t, small), []string{"gzip"}, testLimits, small, nil},
		{"zlib deflate", zl(t, small), []string{"deflate"}, testLimits, small, nil},
		{"raw deflate", rawDeflate(t, small), []string{"deflate"}, testLimits, small, nil},
		{"nested", zl(t, gz(t, small)), []string{"gzip", "deflate"}, testLimits, small, nil},
		// 64 KiB of zeros compress far past 10:1 but stay within
		// ratio_after_bytes: allowed.
		{"compressible under ratio_after", gz(t, zeros(64<<10)), []string{"gzip"}, testLimits, zeros(64 << 10), nil},
		{"ratio just past ratio_after", gz(t, zeros(64<<10+1)), []string{"gzip"}, testLimits, nil, ErrRatio},
		{"nested ratio counts together", gz(t, gz(t, zeros(1<<20))), []string{"gzip", "gzip"}, testLimits, nil, ErrRatio},
		{"decoded at the cap", gz(t, hexNoise(1<<20)), []string{"gzip"}, Limits{RatioMax: 10, RatioAfter: 0, AbsCap: 1 << 20}, hexNoise(1 << 20), nil},
		{"decoded one byte past the cap", gz(t, hexNoise(1<<20+1)), []string{"gzip"}, Limits{RatioMax: 10, RatioAfter: 0, AbsCap: 1 << 20}, nil, ErrSize},
		{"encoded past the cap", gz(t, noise(1<<20)), []string{"gzip"}, Limits{RatioMax: 10, RatioAfter: 0, AbsCap: 1 << 20}, nil, ErrSize},
		{"identity past the cap", noise(1025), nil, Limits{RatioMax: 10, AbsCap: 1024}, nil, ErrSize},
		{"identity at the cap", noise(1024), nil, Limits{RatioMax: 10, AbsCap: 1024}, noise(1024), nil},
		{"not gzip", []byte("plain text"), []string{"gzip"}, testLimits, nil, ErrCorrupt},
		{"truncated gzip", gz(t, small)[:10], []string{"gzip"}, testLimits, nil, ErrCorrupt},
		{"empty gzip", nil, []string{"gzip"}, testLimits, nil, ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode(bytes.NewReader(tt.body), tt.codings, tt.lim)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Decode = %d bytes, %v; want %v", len(got), err, tt.err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("Decode = %d bytes, %v; want %d bytes", len(got), err, len(tt.want))
			}
		})
	}
}

func TestDecodeReadError(t *testing.T) {
	boom := errors.New("caller went away")
	_, err := Decode(iotest.ErrReader(boom), []string{"gzip"}, testLimits)
	if !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Decode over a failing body = %v, want the body's error, not ErrCorrupt", err)
	}
}

// TestBombStopsEarly decodes a gzip of 1 GiB of zeros, a stream that
// never ends, and checks the guard stops after reading little of it.
func TestBombStopsEarly(t *testing.T) {
	in := &countingReader{r: bombReader(t, 1<<30)}
	_, err := Decode(in, []string{"gzip"}, testLimits)
	if !errors.Is(err, ErrRatio) {
		t.Fatalf("Decode(gzip of 1 GiB of zeros) = %v, want ErrRatio", err)
	}
	if in.n > 64<<10 {
		t.Errorf("read %d encoded bytes before refusing, want far fewer", in.n)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// bombReader streams the gzip of n zero bytes, compressing as it is read.
func bombReader(t testing.TB, n int64) io.Reader {
	pr, pw := io.Pipe()
	go func() {
		w, _ := gzip.NewWriterLevel(pw, gzip.BestCompression)
		_, err := io.Copy(w, io.LimitReader(zeroReader{}, n))
		if err == nil {
			err = w.Close()
		}
		pw.CloseWithError(err)
	}()
	t.Cleanup(func() { pr.CloseWithError(errors.New("test over")) })
	return pr
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestCodings(t *testing.T) {
	tests := []struct {
		in   []string
		want string
		err  bool
	}{
		{nil, "", false},
		{[]string{"identity"}, "", false},
		{[]string{"gzip"}, "gzip", false},
		{[]string{" GZIP , deflate"}, "gzip deflate", false},
		{[]string{"gzip", "x-gzip"}, "gzip x-gzip", false},
		{[]string{"br"}, "", true},
		{[]string{"gzip, zstd"}, "", true},
		{[]string{"gzip,gzip,gzip,gzip,gzip"}, "", true},
		{[]string{"identity, identity, identity, identity"}, "", false},
		{[]string{"identity", "identity", "identity", "identity", "identity"}, "", true},
		{[]string{"gzip, identity, gzip, identity, gzip"}, "", true},
	}
	for _, tt := range tests {
		got, err := Codings(tt.in)
		if (err != nil) != tt.err || strings.Join(got, " ") != tt.want {
			t.Errorf("Codings(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.err)
		}
		if err != nil && !errors.Is(err, ErrEncoding) {
			t.Errorf("Codings(%q) error %v does not wrap ErrEncoding", tt.in, err)
		}
	}
}

// TestCorruptNamesCodingOnce: the error of a body that does not decode
// names its coding once, whether the error is the decoder's own (which
// names it) or a read's (which does not).
func TestCorruptNamesCodingOnce(t *testing.T) {
	for _, body := range [][]byte{[]byte("plain text"), nil, gz(t, []byte("hello"))[:5]} {
		_, err := Decode(bytes.NewReader(body), []string{"gzip"}, testLimits)
		if !errors.Is(err, ErrCorrupt) || strings.Count(err.Error(), "gzip") != 1 {
			t.Errorf("Decode(%q, gzip) = %v, want ErrCorrupt naming gzip once", body, err)
		}
	}
}

// FuzzDecode checks, for any body and Content-Encoding, that Decode never
// returns more than the cap, and that a body it accepts respects the ratio.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("hello"), "")
	f.Add(gz(f, []byte("hello")), "gzip")
	f.Add(gz(f, make([]byte, 5000)), "gzip")
	f.Add(zl(f, gz(f, make([]byte, 5000))), "gzip, deflate")
	f.Add(rawDeflate(f, []byte("x")), "deflate")
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}, "gzip")
	f.Add([]byte("x"), "br")
	lim := Limits{RatioMax: 10, RatioAfter: 1024, AbsCap: 64 << 10}
	f.Fuzz(func(t *testing.T, body []byte, encoding string) {
		codings, err := Codings([]string{encoding})
		if err != nil {
			if !errors.Is(err, ErrEncoding) {
				t.Fatalf("Codings(%q) = %v, not ErrEncoding", encoding, err)
			}
			return
		}
		out, err := Decode(bytes.NewReader(body), codings, lim)
		if err != nil {
			if out != nil {
				t.Fatalf("Decode failed with %v but returned %d bytes", err, len(out))
			}
			return
		}
		if int64(len(out)) > lim.AbsCap {
			t.Fatalf("Decode returned %d bytes, over the cap %d", len(out), lim.AbsCap)
		}
		if len(codings) > 0 && int64(len(out)) > lim.RatioAfter && float64(len(out)) > lim.RatioMax*float64(len(body)) {
			t.Fatalf("Decode accepted %d bytes from %d, past %g:1", len(out), len(body), lim.RatioMax)
		}
		if len(codings) == 0 && !bytes.Equal(out, body) {
			t.Fatalf("identity Decode changed the body")
		}
	})
}
