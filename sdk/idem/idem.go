package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/plughost/plughost/sdk"
)

// MaxKeyLen is the longest Idempotency-Key accepted.
const MaxKeyLen = 255

// Header is the request header that carries the key.
const Header = "Idempotency-Key"

// Errors of the protocol. Status maps each to its HTTP answer.
var (
	// ErrMissing: the request has no Idempotency-Key and needs one.
	ErrMissing = errors.New("the request needs an Idempotency-Key header")
	// ErrInvalid is wrapped by the error of a malformed key.
	ErrInvalid = errors.New("invalid Idempotency-Key")
	// ErrInUse: a request with the key is still in progress (409).
	ErrInUse = errors.New("a request with this Idempotency-Key is still in progress; retry when it has finished")
	// ErrReused: the key was used with a different request (422).
	ErrReused = errors.New("this Idempotency-Key was used with a different request")
)

// Key returns the request's Idempotency-Key: one header, 1 to MaxKeyLen
// visible ASCII characters. It returns ErrMissing if there is none, and
// an error wrapping ErrInvalid if it is malformed.
func Key(h http.Header) (string, error) {
	vs := h.Values(Header)
	switch {
	case len(vs) == 0:
		return "", ErrMissing
	case len(vs) > 1:
		return "", fmt.Errorf("%w: send one %s header", ErrInvalid, Header)
	}
	k := vs[0]
	if k == "" || len(k) > MaxKeyLen {
		return "", fmt.Errorf("%w: it must be 1 to %d characters", ErrInvalid, MaxKeyLen)
	}
	for i := range len(k) {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", fmt.Errorf("%w: it may hold only visible ASCII characters", ErrInvalid)
		}
	}
	return k, nil
}

// Fingerprint is a request's identity for the protocol: two requests with
// one key are the same request when their fingerprints are equal.
type Fingerprint [32]byte

// FingerprintOf hashes the parts that make a request what it is (its
// operation, path and canonical body, say), each length-prefixed, so that
// no two different lists of parts hash alike.
func FingerprintOf(parts ...[]byte) Fingerprint {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}

// Claims are the keys whose request is in progress, each with the
// fingerprint of its request. The zero Claims is ready to use; it is safe
// for concurrent use.
type Claims struct {
	mu sync.Mutex
	m  map[string]Fingerprint
}

// Claim takes key for a request with fingerprint fp until Release. It
// returns ErrInUse if the same request holds it, ErrReused if another
// does.
func (c *Claims) Claim(key string, fp Fingerprint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if held, ok := c.m[key]; ok {
		if held != fp {
			return ErrReused
		}
		return ErrInUse
	}
	if c.m == nil {
		c.m = map[string]Fingerprint{}
	}
	c.m[key] = fp
	return nil
}

// Release gives key back. Call it once the request's outcome is known:
// committed, or refused before anything could be applied; not while a
// stalled commit may still apply it.
func (c *Claims) Release(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.mu.Unlock()
}

// Len returns how many keys are claimed.
func (c *Claims) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Replay answers a request with fingerprint fp from rec, the record of
// its key: the recorded status and body with Idempotent-Replayed: true,
// or ErrReused (and nothing written) if rec is another request's.
func Replay(w http.ResponseWriter, rec Record, fp Fingerprint) error {
	if rec.Fingerprint != fp {
		return ErrReused
	}
	w.Header().Set("Idempotent-Replayed", "true")
	if rec.ContentType != "" {
		w.Header().Set("Content-Type", rec.ContentType)
	}
	w.WriteHeader(rec.Status)
	_, err := w.Write(rec.Body)
	return err
}

// Status returns the HTTP status and error code for an error of the
// protocol, and false for any other error.
func Status(err error) (status int, code string, ok bool) {
	switch {
	case errors.Is(err, ErrMissing):
		return http.StatusBadRequest, "idempotency_key_missing", true
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest, "invalid_idempotency_key", true
	case errors.Is(err, ErrInUse):
		return http.StatusConflict, "idempotency_key_in_use", true
	case errors.Is(err, ErrReused):
		return http.StatusUnprocessableEntity, "idempotency_key_reused", true
	}
	return 0, "", false
}

// WriteError answers err, an error of the protocol, with its status and
// the platform's JSON error body, and reports whether it was one.
func WriteError(w http.ResponseWriter, err error) bool {
	status, code, ok := Status(err)
	if ok {
		sdk.WriteError(w, status, code, err.Error())
	}
	return ok
}
