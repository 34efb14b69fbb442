// Package inflate is the gateway's decompression guard: it reads a request
// body, undoes its Content-Encoding (gzip, deflate, identity, nested in any
// order) and returns the decoded bytes, refusing a body whose decoded size
// passes an absolute cap or whose ratio of decoded to encoded bytes passes
// a maximum once enough has been decoded.
//
// It never holds more than the cap: the decoded bytes are collected into a
// buffer that stops growing at Limits.AbsCap, and one byte past the cap is
// a refusal. It must not touch the network, log or keep state between
// calls; the caller maps its errors to HTTP statuses.
package inflate

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Errors Decode returns. Each is returned wrapped; compare with errors.Is.
var (
	// ErrRatio means the decoded bytes passed Limits.RatioMax times the
	// encoded bytes read, after at least Limits.RatioAfter decoded bytes.
	ErrRatio = errors.New("decoded body exceeds the ratio limit")
	// ErrSize means the decoded body, or the encoded body itself, passed
	// Limits.AbsCap bytes.
	ErrSize = errors.New("decoded body exceeds the size limit")
	// ErrEncoding means Content-Encoding names a coding the guard does not
	// decode.
	ErrEncoding = errors.New("unsupported content encoding")
	// ErrCorrupt means an encoded body does not decode.
	ErrCorrupt = errors.New("body does not decode")
)

// MaxCodings bounds how many codings one Content-Encoding may list.
const MaxCodings = 4

// Limits bounds one body.
type Limits struct {
	// RatioMax is the most decoded bytes per encoded byte.
	RatioMax float64
	// RatioAfter is how many decoded bytes may be produced before the
	// ratio is checked, so that a small, very compressible body passes.
	RatioAfter int64
	// AbsCap is the most decoded bytes, and the most encoded ones.
	AbsCap int64
}

// chunk is how much is decoded between two checks of the limits.
const chunk = 32 << 10

// Codings parses a Content-Encoding header's values into the codings in
// the order they were applied, leaving out identity. It fails with
// ErrEncoding for an unknown coding or more than MaxCodings of them,
// identity counted: the bound is on what the client lists.
func Codings(values []string) ([]string, error) {
	var out []string
	listed := 0
	for _, v := range values {
		for c := range strings.SplitSeq(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c == "" {
				continue
			}
			if listed++; listed > MaxCodings {
				return nil, fmt.Errorf("%w: more than %d codings", ErrEncoding, MaxCodings)
			}
			switch c {
			case "identity":
				continue
			case "gzip", "x-gzip", "deflate":
			default:
				return nil, fmt.Errorf("%w: %.64q", ErrEncoding, c)
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// Decode reads body, encoded with codings (as Codings returns them), and
// returns it decoded. The limits apply to the codings together: the ratio
// is the final decoded size over the encoded bytes read from body, and
// every layer's output counts against AbsCap. The error wraps ErrRatio,
// ErrSize, ErrCorrupt or the body's read error.
func Decode(body io.Reader, codings []string, lim Limits) ([]byte, error) {
	if len(codings) == 0 {
		return readIdentity(body, lim.AbsCap)
	}
	in := &counter{r: rawBody{body}, limit: lim.AbsCap}
	var r io.Reader = in
	// The last coding applied is the first to undo.
	for i := len(codings) - 1; i >= 0; i-- {
		dec, err := decoder(codings[i], r)
		if err != nil {
			return nil, err
		}
		r = &counter{r: dec, limit: lim.AbsCap}
	}
	var out bytes.Buffer
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	buf := *bp
	for {
		n, err := r.Read(buf)
		// The ratio first: a bomb that also passes the cap is a bomb.
		d := int64(out.Len() + n)
		if len(codings) > 0 && d > lim.RatioAfter && float64(d) > lim.RatioMax*float64(max(in.n, 1)) {
			return nil, fmt.Errorf("%w: %d bytes from %d, more than %g:1", ErrRatio, d, in.n, lim.RatioMax)
		}
		if d > lim.AbsCap {
			return nil, fmt.Errorf("%w: more than %d bytes", ErrSize, lim.AbsCap)
		}
		out.Write(buf[:n])
		switch {
		case errors.Is(err, io.EOF):
			return out.Bytes(), nil
		case errors.Is(err, errOver):
			return nil, fmt.Errorf("%w: more than %d bytes", ErrSize, lim.AbsCap)
		case err != nil && len(codings) > 0 && !errors.Is(err, errRead):
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		case err != nil:
			return nil, err
		}
	}
}

// scratch holds the chunk buffers of Decode.
var scratch = sync.Pool{New: func() any { b := make([]byte, chunk); return &b }}

// readIdentity reads an unencoded body of at most limit bytes, growing its
// buffer only as the body does: an empty body allocates nothing.
func readIdentity(body io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(rawBody{body}, limit+1))
	switch {
	case err != nil:
		return nil, err
	case int64(len(b)) > limit:
		return nil, fmt.Errorf("%w: more than %d bytes", ErrSize, limit)
	case len(b) == 0:
		return nil, nil
	}
	return b, nil
}

// decoder returns the reader that undoes coding over r.
func decoder(coding string, r io.Reader) (io.Reader, error) {
	switch coding {
	case "gzip", "x-gzip":
		z, err := gzip.NewReader(r)
		if errors.Is(err, errRead) {
			return nil, err
		}
		switch {
		case errors.Is(err, gzip.ErrHeader):
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err) // it says "gzip: " itself
		case err != nil:
			return nil, fmt.Errorf("%w: gzip: %w", ErrCorrupt, err)
		}
		return z, nil
	case "deflate":
		// RFC 9110 means zlib-wrapped deflate; some clients send it raw.
		br := &peeker{r: r}
		if br.zlibHeader() {
			z, err := zlib.NewReader(br)
			if errors.Is(err, errRead) {
				return nil, err
			}
			if err != nil {
				return nil, fmt.Errorf("%w: deflate: %w", ErrCorrupt, err)
			}
			return z, nil
		}
		return flate.NewReader(br), nil
	}
	return nil, fmt.Errorf("%w: %q", ErrEncoding, coding)
}

// errOver is a counter's error once its reader gave more than its limit.
var errOver = errors.New("over the limit")

// errRead marks an error of the body itself, not of a decoder.
var errRead = errors.New("read body")

// counter counts the bytes read through it and fails with errOver once
// they pass limit, so that no layer produces more than the cap.
type counter struct {
	r     io.Reader
	n     int64
	limit int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		return n, errOver
	}
	return n, err
}

// rawBody marks the body's own read errors with errRead, so that Decode
// does not report a caller who went away as a corrupt encoding.
type rawBody struct{ r io.Reader }

func (b rawBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: %w", errRead, err)
	}
	return n, err
}

// peeker lets the deflate decoder look at the first two bytes.
type peeker struct {
	r    io.Reader
	head []byte
}

// zlibHeader reports whether the stream starts with a zlib header
// (RFC 1950: CM 8, and the header a multiple of 31).
func (p *peeker) zlibHeader() bool {
	var b [2]byte
	n, _ := io.ReadFull(p.r, b[:])
	p.head = b[:n]
	return n == 2 && b[0]&0x0f == 8 && (uint16(b[0])<<8|uint16(b[1]))%31 == 0
}

func (p *peeker) Read(b []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	return p.r.Read(b)
}
