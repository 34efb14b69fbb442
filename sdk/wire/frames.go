package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/protobuf/proto"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// DataPlaneEnv names the environment variable that tells a plugin how many
// data-plane connections the host passed it, as file descriptors 3, 4, ...
// (see "Data plane" in proto/pluginv1/plugin.proto).
const DataPlaneEnv = "PLUGHOST_DATA_PLANE_FDS"

// DataPlaneFirstFD is the descriptor of the first data-plane connection:
// the first after standard input, output and error.
const DataPlaneFirstFD = 3

// PieceBytes is the most body a frame carries: a larger request or
// response body travels as a head and Body frames of at most this much, so
// that it does not hold up the other requests sharing its connection for
// longer than one piece takes to write.
const PieceBytes = 64 << 10

// ResponseWindow is the credit a response starts with unless its request
// names a smaller one (RequestHead.window, which the host sets on streams):
// how many bytes of its body the plugin may send before the host grants
// more with Window frames. It bounds what the host buffers for one
// response whose client reads slowly, and it exceeds most whole responses,
// which therefore never wait for credit.
const ResponseWindow = 256 << 10

// Frame is a frame encoded by Conn.Encode, for one Conn.Send.
type Frame struct {
	b []byte
	// pooled is b's buffer from framePool, returned to it once Send has
	// copied the frame into the connection's write buffer.
	pooled *[]byte
	// body, when set, is a large body that b leaves out: its bytes go
	// between b[:split] and b[split:], written from the caller's slice
	// rather than copied into the frame first.
	body  []byte
	split int
}

// refBodyBytes is the smallest body Encode leaves in the caller's slice
// rather than copying it into the frame: below it, one write of a pooled
// frame is cheaper than three.
const refBodyBytes = 2 << 10

// pooledFrameBytes is the size of framePool's buffers: request and
// response heads, cancels, windows and small bodies fit, which is most
// frames.
const pooledFrameBytes = 4 << 10

// framePool holds the buffers small frames are encoded into: every
// request costs a frame each way, and a buffer of its own for each showed
// in the allocations per request (BenchmarkPath in host/ingress).
var framePool = sync.Pool{New: func() any {
	b := make([]byte, 0, pooledFrameBytes)
	return &b
}}

// ErrFrameTooLarge is the error for a frame over MaxMessageBytes.
var ErrFrameTooLarge = fmt.Errorf("frame is larger than the %d-byte message limit", MaxMessageBytes)

// frameHeaderBytes is the size of a data-plane frame's length prefix.
const frameHeaderBytes = 4

// frameBufferBytes sizes a Conn's read and write buffers: most frames fit,
// and a frame that does not is read or written straight through.
const frameBufferBytes = 32 << 10

// Conn is a data-plane connection over a connected stream socket, each
// frame a 4-byte big-endian length and its protobuf encoding. Encode may
// be called concurrently, Send too (frames keep no order between concurrent
// callers), Recv by one caller at a time. Create it with NewConn and end it
// with Close.
type Conn struct {
	c       net.Conn
	r       *bufio.Reader
	maxRecv uint32 // the largest frame Recv accepts

	// hdr receives a frame's length prefix: a part of the Conn, read by
	// Recv's one caller, rather than an allocation per frame.
	hdr [frameHeaderBytes]byte

	wmu  sync.Mutex // guards w, werr and held; held across a write to c
	w    *bufio.Writer
	werr error // sticky: after a failed write the stream is broken
	held bool  // w holds frames that SendHeld wrote and no flush has sent
}

// NewConn returns a Conn over c, which it owns from now on.
func NewConn(c net.Conn) *Conn {
	return &Conn{c: c, r: bufio.NewReaderSize(c, frameBufferBytes), w: bufio.NewWriterSize(c, frameBufferBytes), maxRecv: MaxMessageBytes}
}

// LimitRecv lowers the largest frame Recv accepts to n bytes, for a peer
// that has no reason to send more: a larger frame breaks the connection
// before its bytes are read. Call it before the first Recv.
func (c *Conn) LimitRecv(n int) { c.maxRecv = uint32(min(n, MaxMessageBytes)) }

// Encode encodes f with its length prefix. An error is f's alone (one over
// MaxMessageBytes): the connection is fine. A body of refBodyBytes or more
// is not copied: the caller leaves it unchanged until Send.
func (c *Conn) Encode(f *pluginv1.Frame) (Frame, error) {
	var sizes headSizes
	n, head := headSize(f, &sizes)
	if !head {
		n = proto.Size(f)
	}
	if n > MaxMessageBytes {
		return Frame{}, ErrFrameTooLarge
	}
	var fr Frame
	own := n // the bytes of the frame in fr.b
	if body := frameBody(f); head && len(body) >= refBodyBytes {
		sizes.ref, fr.body = true, body
		own -= len(body)
	}
	if frameHeaderBytes+own <= pooledFrameBytes {
		fr.pooled = framePool.Get().(*[]byte)
		fr.b = (*fr.pooled)[:frameHeaderBytes]
	} else {
		fr.b = make([]byte, frameHeaderBytes, frameHeaderBytes+own)
	}
	binary.BigEndian.PutUint32(fr.b, uint32(n))
	if head {
		fr.b = appendHead(fr.b, f, &sizes)
		fr.split = sizes.split
		return fr, nil
	}
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(fr.b, f)
	if err != nil {
		fr.release()
		return Frame{}, err
	}
	fr.b = b
	return fr, nil
}

// Discard gives up on sending fr, returning its buffer for reuse: for a
// frame Encode made that Send will not take.
func (fr *Frame) Discard() { fr.release() }

// release returns fr's buffer to framePool, if it came from there.
func (fr *Frame) release() {
	if fr.pooled != nil {
		*fr.pooled = (*fr.pooled)[:0]
		framePool.Put(fr.pooled)
		fr.pooled, fr.b = nil, nil
	}
	fr.body = nil
}

// Send writes fr into the write buffer, and the buffer to the socket when
// flush is set or the buffer is full. It is safe for concurrent use, but
// frames keep no order between concurrent callers. fr is of no use after:
// its buffer may be reused by the next Encode.
func (c *Conn) Send(fr Frame, flush bool) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	defer fr.release()
	if err := c.write(&fr); err != nil {
		c.werr = err
		return err
	}
	if flush {
		return c.flushLocked()
	}
	return nil
}

// SendAll writes frs and flushes the write buffer once, after the last:
// a batch of frames costs one write to the socket. frs are of no use
// after, as with Send.
func (c *Conn) SendAll(frs []Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writeAll(frs); err != nil {
		return err
	}
	return c.flushLocked()
}

// SendHeld writes frs into the write buffer without flushing it, for a
// caller that expects more frames to follow soon and wants them to share
// a write. first reports that no frame was held before these: the caller
// must then see to it that Flush runs. Any flush sends the held frames
// too. frs are of no use after, as with Send.
func (c *Conn) SendHeld(frs []Frame) (first bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.writeAll(frs); err != nil {
		return false, err
	}
	first = !c.held
	c.held = true
	return first, nil
}

// Flush writes out what the write buffer holds. With nothing in it, it
// makes no system call.
func (c *Conn) Flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.flushLocked()
}

// writeAll writes frs into the write buffer, releasing each, and makes a
// failure the stream's error. c.wmu is held.
func (c *Conn) writeAll(frs []Frame) error {
	var err error
	for i := range frs {
		if err == nil {
			err = c.write(&frs[i])
		}
		frs[i].release()
	}
	if err != nil {
		c.werr = err
	}
	return err
}

// flushLocked writes the buffer out, held frames too, or returns the
// error that broke the stream. c.wmu is held.
func (c *Conn) flushLocked() error {
	if c.werr != nil {
		return c.werr
	}
	c.held = false
	if err := c.w.Flush(); err != nil {
		c.werr = err
	}
	return c.werr
}

// FrameBuffered reports whether a whole frame waits in the read buffer, so
// that the next Recv returns without reading from the socket. Call it
// only from Recv's caller.
func (c *Conn) FrameBuffered() bool {
	n := c.r.Buffered()
	if n < frameHeaderBytes {
		return false
	}
	hdr, _ := c.r.Peek(frameHeaderBytes)
	return uint64(binary.BigEndian.Uint32(hdr))+frameHeaderBytes <= uint64(n)
}

// write writes fr into the write buffer, or fails with the error that
// broke the stream. c.wmu is held.
func (c *Conn) write(fr *Frame) error {
	if c.werr != nil {
		return c.werr
	}
	if fr.body == nil {
		_, err := c.w.Write(fr.b)
		return err
	}
	// bufio writes a body larger than its free space straight to the
	// socket.
	if _, err := c.w.Write(fr.b[:fr.split]); err != nil {
		return err
	}
	if _, err := c.w.Write(fr.body); err != nil {
		return err
	}
	_, err := c.w.Write(fr.b[fr.split:])
	return err
}

// Recv reads the next frame. A frame that cannot be read, or that is over
// MaxMessageBytes, is an error after which the connection is of no use.
// A connection that ends between frames gives io.EOF.
func (c *Conn) Recv() (*pluginv1.Frame, error) {
	hdr := c.hdr[:]
	if _, err := io.ReadFull(c.r, hdr); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("read frame length: %w", err)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n > c.maxRecv {
		return nil, fmt.Errorf("frame of %d bytes: %w", n, ErrFrameTooLarge)
	}
	var buf []byte
	peeked := int(n) <= c.r.Size()
	if peeked {
		// The frame fits the read buffer: decode it there, once it has
		// all arrived. Decoding copies what it keeps, so the buffer is
		// free after.
		var err error
		if buf, err = c.r.Peek(int(n)); err != nil {
			return nil, fmt.Errorf("read frame of %d bytes: %w", n, noEOF(err))
		}
	} else {
		// Memory grows with what arrives, not with what the length
		// claims: a peer that sends a large length and stalls holds
		// little.
		var b bytes.Buffer
		if _, err := io.CopyN(&b, c.r, int64(n)); err != nil {
			return nil, fmt.Errorf("read frame of %d bytes: %w", n, noEOF(err))
		}
		buf = b.Bytes()
	}
	f, err := decodeFrame(buf)
	if peeked {
		_, _ = c.r.Discard(int(n))
	}
	if err != nil {
		return nil, fmt.Errorf("decode frame: %w", err)
	}
	return f, nil
}

// noEOF reports a connection that ended inside a frame as what it is.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// Close closes the connection. A Recv waiting on it returns an error.
func (c *Conn) Close() error { return c.c.Close() }
