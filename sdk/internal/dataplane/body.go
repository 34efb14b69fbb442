package dataplane

import (
	"context"
	"io"
	"sync"
)

// pipe is a request body that arrives in pieces: the receive loop pushes
// each Body frame's data, and the handler reads it. push never blocks, so
// a handler that does not read its body holds up no other request on the
// connection; what it holds is bounded by the host's body cap.
type pipe struct {
	ctx context.Context

	mu     sync.Mutex
	pieces [][]byte
	end    bool
	ready  chan struct{} // signalled when a piece or the end arrives
	// small is the first storage of pieces: most bodies that come in
	// pieces come in a few, and their list then costs no allocation.
	small [4][]byte
}

func newPipe(ctx context.Context, first []byte) *pipe {
	p := &pipe{ctx: ctx, ready: make(chan struct{}, 1)}
	p.pieces = p.small[:0]
	if len(first) > 0 {
		p.pieces = append(p.pieces, first)
	}
	return p
}

// push adds a piece; end marks the last.
func (p *pipe) push(b []byte, end bool) {
	p.mu.Lock()
	if len(b) > 0 {
		p.pieces = append(p.pieces, b)
	}
	p.end = p.end || end
	p.mu.Unlock()
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// Read reads what has arrived, waiting for more until the body ends or
// the request's context does.
func (p *pipe) Read(b []byte) (int, error) {
	for {
		p.mu.Lock()
		if len(p.pieces) > 0 {
			n := copy(b, p.pieces[0])
			if n == len(p.pieces[0]) {
				p.pieces[0] = nil
				p.pieces = p.pieces[1:]
			} else {
				p.pieces[0] = p.pieces[0][n:]
			}
			p.mu.Unlock()
			return n, nil
		}
		end := p.end
		p.mu.Unlock()
		if end {
			return 0, io.EOF
		}
		select {
		case <-p.ready:
		case <-p.ctx.Done():
			// The request was cancelled or the connection ended with
			// the body unfinished.
			return 0, io.ErrUnexpectedEOF
		}
	}
}

// Close drops what has not been read.
func (p *pipe) Close() error {
	p.mu.Lock()
	p.pieces = nil
	p.mu.Unlock()
	return nil
}
