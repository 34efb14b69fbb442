package idem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Record is the recorded outcome of a key's first request.
type Record struct {
	Fingerprint Fingerprint
	// Status, ContentType and Body are the answer, replayed byte for
	// byte.
	Status      int
	ContentType string
	Body        []byte
	// Expires is when the record stops answering; Sweep reclaims it
	// after that.
	Expires time.Time
}

// recordVersion is the first byte of an encoded Record.
const recordVersion = 1

// maxContentType bounds the content type a record holds.
const maxContentType = 255

// errRecord is wrapped by every error of decode.
var errRecord = errors.New("idempotency record")

// encode lays a record out as version(1) fingerprint(32) status(2)
// expires(8, Unix nanoseconds) ctlen(1) contentType body.
func (r Record) encode() ([]byte, error) {
	if r.Status < 100 || r.Status > 999 {
		return nil, fmt.Errorf("%w: status %d is not an HTTP status", errRecord, r.Status)
	}
	if len(r.ContentType) > maxContentType {
		return nil, fmt.Errorf("%w: content type of %d bytes, at most %d", errRecord, len(r.ContentType), maxContentType)
	}
	b := make([]byte, 0, 44+len(r.ContentType)+len(r.Body))
	b = append(b, recordVersion)
	b = append(b, r.Fingerprint[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = binary.BigEndian.AppendUint64(b, uint64(r.Expires.UnixNano()))
	b = append(b, byte(len(r.ContentType)))
	b = append(b, r.ContentType...)
	return append(b, r.Body...), nil
}

// decode reads a record that encode laid out. Its Body is a copy.
func decode(b []byte) (Record, error) {
	const head = 1 + 32 + 2 + 8 + 1
	if len(b) < head {
		return Record{}, fmt.Errorf("%w: %d bytes, shorter than its header", errRecord, len(b))
	}
	if b[0] != recordVersion {
		return Record{}, fmt.Errorf("%w: version %d, want %d", errRecord, b[0], recordVersion)
	}
	var r Record
	copy(r.Fingerprint[:], b[1:33])
	r.Status = int(binary.BigEndian.Uint16(b[33:]))
	r.Expires = time.Unix(0, int64(binary.BigEndian.Uint64(b[35:])))
	ct := int(b[43])
	if r.Status < 100 || r.Status > 999 || len(b) < head+ct {
		return Record{}, fmt.Errorf("%w: status %d or content type length %d out of range", errRecord, r.Status, ct)
	}
	r.ContentType = string(b[head : head+ct])
	r.Body = append([]byte{}, b[head+ct:]...)
	return r, nil
}
