package main

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/blake3"

	"github.com/plughost/plughost/sdk/idem"
	"github.com/plughost/plughost/sdk/store"
)

// The store's buckets, by number. A message is two values, its immutable
// envelope (written once, at send) and its mutable meta (rewritten at each
// delivery, nack, extend and move), so that a delivery never rewrites the
// payload; the visibility index orders each topic's messages by the time
// they become visible, so that a receive is one range read from the
// topic's first key up to now.
const (
	// bucketEnvelopes: id(8) → envelope (encodeEnvelope).
	bucketEnvelopes = iota
	// bucketMeta: id(8) → meta (encodeMeta).
	bucketMeta
	// bucketVisible: topic ‖ 0x00 ‖ visible_at(8, unix ms) ‖ id(8) → empty.
	// Ready, delayed and in-flight messages are all here: ready ones are
	// visible at or before now, the others after.
	bucketVisible
	// bucketIdem and bucketIdemExpiry are sdk/idem's records of send
	// Idempotency-Keys, by topic ‖ 0x00 ‖ key, and their expiry index.
	bucketIdem
	bucketIdemExpiry
)

// storeFile is the store's file name in the data dir.
const storeFile = "mailbox.db"

var storeOpts = store.Options{Buckets: []store.Bucket{
	{Name: "envelopes", Sequential: true},
	{Name: "meta", Sequential: true},
	{Name: "visible"},
	{Name: "idem"},
	{Name: "idem_exp", Sequential: true},
}}

// dlqSuffix names a topic's dead-letter queue: TOPIC.dlq.
const dlqSuffix = ".dlq"

// parkedAt is the visible-at time of a message parked in a DLQ: one whose
// payload failed its hash max_attempts times. Every payload read again
// from disk fails the same way, so it is kept for the operator to look at
// (topic counts, retention) but past every now, where no receive reaches
// it, and past every range a redrive or a long poll's deadline reads.
const parkedAt = math.MaxInt64

// maxTopicLen bounds a topic name. A topic's dead-letter queue,
// TOPIC.dlq, may be len(dlqSuffix) longer.
const maxTopicLen = 200

// validTopic reports whether t names a topic: 1 to maxTopicLen of
// [A-Za-z0-9._-], or a topic's dead-letter queue TOPIC.dlq, so that the
// DLQ of every topic can be stored, received from and inspected. The
// visibility index relies on it holding no 0x00.
func validTopic(t string) bool {
	if len(t) == 0 || len(t) > maxTopicLen && (len(t) > maxTopicLen+len(dlqSuffix) || !strings.HasSuffix(t, dlqSuffix)) {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Errors of one operation by the mailbox's rules: its result, not a
// failed commit. api.go maps them to statuses.
var (
	// ErrNotFound: no such message (acked, or never sent).
	ErrNotFound = errors.New("no such message")
	// ErrStaleReceipt: the receipt is not the message's current delivery's.
	ErrStaleReceipt = errors.New("the receipt is from an earlier delivery")
	// ErrExpired: extend of a delivery whose visibility has already ended.
	ErrExpired = errors.New("the delivery's visibility has expired")
	// ErrReusedKey: an Idempotency-Key sent again with another message.
	ErrReusedKey = idem.ErrReused
)

// envelope is what send stores, once: never rewritten.
type envelope struct {
	Hash       [32]byte // BLAKE3 of Payload
	EnqueuedAt int64    // unix ms
	Attrs      map[string]string
	Payload    []byte
}

const envelopeVersion = 1

// encodeEnvelope: version(1) ‖ hash(32) ‖ enqueued_at(8) ‖ nattrs(2) ‖
// (klen(2) ‖ k ‖ vlen(4) ‖ v)* ‖ payload.
func encodeEnvelope(e envelope) []byte {
	return appendEnvelope(make([]byte, 0, 43+len(e.Payload)+64*len(e.Attrs)), e)
}

// appendEnvelope appends e to b as encodeEnvelope encodes it.
func appendEnvelope(b []byte, e envelope) []byte {
	b = append(b, envelopeVersion)
	b = append(b, e.Hash[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.EnqueuedAt))
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.Attrs)))
	for _, k := range sortedKeys(e.Attrs) {
		b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
		b = append(b, k...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Attrs[k])))
		b = append(b, e.Attrs[k]...)
	}
	return append(b, e.Payload...)
}

var errBadEnvelope = errors.New("malformed envelope")

// decodeEnvelope decodes what encodeEnvelope wrote, refusing anything
// else; the payload is a copy.
func decodeEnvelope(b []byte) (envelope, error) {
	var e envelope
	if len(b) < 43 || b[0] != envelopeVersion {
		return e, errBadEnvelope
	}
	copy(e.Hash[:], b[1:33])
	e.EnqueuedAt = int64(binary.BigEndian.Uint64(b[33:41]))
	n := int(binary.BigEndian.Uint16(b[41:43]))
	b = b[43:]
	if n > 0 {
		e.Attrs = make(map[string]string, min(n, 64))
	}
	for range n {
		if len(b) < 2 {
			return e, errBadEnvelope
		}
		kl := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+kl+4 {
			return e, errBadEnvelope
		}
		k := string(b[2 : 2+kl])
		b = b[2+kl:]
		vl := binary.BigEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(vl) {
			return e, errBadEnvelope
		}
		if _, dup := e.Attrs[k]; dup {
			return e, errBadEnvelope
		}
		e.Attrs[k] = string(b[4 : 4+vl])
		b = b[4+vl:]
	}
	e.Payload = bytes.Clone(b)
	return e, nil
}

// meta is a message's mutable state.
type meta struct {
	Topic     string
	VisibleAt int64  // unix ms
	Attempts  uint32 // deliveries so far
	Receipt   uint64 // the current delivery's nonce; 0 when none holds it
	Reason    string // why it is in a DLQ, if it is
}

const metaVersion = 1

// encodeMeta: version(1) ‖ visible_at(8) ‖ attempts(4) ‖ receipt(8) ‖
// tlen(2) ‖ topic ‖ reason.
func encodeMeta(m meta) []byte {
	b := make([]byte, 0, 23+len(m.Topic)+len(m.Reason))
	b = append(b, metaVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(m.VisibleAt))
	b = binary.BigEndian.AppendUint32(b, m.Attempts)
	b = binary.BigEndian.AppendUint64(b, m.Receipt)
	b = binary.BigEndian.AppendUint16(b, uint16(len(m.Topic)))
	b = append(b, m.Topic...)
	return append(b, m.Reason...)
}

var errBadMeta = errors.New("malformed message meta")

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if len(b) < 23 || b[0] != metaVersion {
		return m, errBadMeta
	}
	m.VisibleAt = int64(binary.BigEndian.Uint64(b[1:9]))
	m.Attempts = binary.BigEndian.Uint32(b[9:13])
	m.Receipt = binary.BigEndian.Uint64(b[13:21])
	tl := int(binary.BigEndian.Uint16(b[21:23]))
	if len(b) < 23+tl || !validTopic(string(b[23:23+tl])) {
		return m, errBadMeta
	}
	m.Topic = string(b[23 : 23+tl])
	m.Reason = string(b[23+tl:])
	return m, nil
}

// envelopes are the buffers sends encode their envelopes into, reused:
// Tx.Put copies what it is given.
var envelopes = sync.Pool{New: func() any { return new([]byte) }}

func idKey(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }

// visKey is the visibility index's key of message id in topic.
func visKey(topic string, at int64, id uint64) []byte {
	k := make([]byte, 0, len(topic)+17)
	k = append(k, topic...)
	k = append(k, 0)
	k = binary.BigEndian.AppendUint64(k, uint64(max(at, 0)))
	return binary.BigEndian.AppendUint64(k, id)
}

// topicRange is the visibility index's range of topic's messages visible
// before until (unix ms; past every key when until < 0).
func topicRange(topic string, until int64) (from, to []byte) {
	from = append([]byte(topic), 0)
	if until < 0 {
		return from, append([]byte(topic), 1)
	}
	return from, binary.BigEndian.AppendUint64(bytes.Clone(from), uint64(until))
}

// MsgID renders a message id: 16 lowercase hex digits.
func MsgID(id uint64) string {
	var b [16]byte
	return string(appendHex16(b[:0], id))
}

// appendHex16 appends v as 16 lowercase hex digits.
func appendHex16(b []byte, v uint64) []byte {
	var d [8]byte
	binary.BigEndian.PutUint64(d[:], v)
	return hex.AppendEncode(b, d[:])
}

// ParseMsgID reads back what MsgID rendered, and nothing else.
func ParseMsgID(s string) (uint64, error) {
	const want = "want 16 lowercase hex digits, not all 0"
	if len(s) != 16 {
		return 0, fmt.Errorf("msg_id %q: %s", s, want)
	}
	id, err := strconv.ParseUint(s, 16, 64)
	// One spelling per id: lowercase, as MsgID renders it; ids start at 1.
	var b [16]byte
	if err != nil || id == 0 || string(appendHex16(b[:0], id)) != s {
		return 0, fmt.Errorf("msg_id %q: %s", s, want)
	}
	return id, nil
}

// Receipt renders a delivery's receipt handle: the message id and the
// delivery's nonce.
func Receipt(id, nonce uint64) string {
	return string(appendHex16(append(appendHex16(make([]byte, 0, 33), id), '.'), nonce))
}

// ParseReceipt reads back what Receipt rendered, and nothing else.
func ParseReceipt(s string) (id, nonce uint64, err error) {
	a, b, ok := strings.Cut(s, ".")
	if !ok {
		return 0, 0, fmt.Errorf("receipt %q: want MSGID.NONCE", s)
	}
	if id, err = ParseMsgID(a); err != nil {
		return 0, 0, fmt.Errorf("receipt %q: %w", s, err)
	}
	if nonce, err = ParseMsgID(b); err != nil {
		return 0, 0, fmt.Errorf("receipt %q: nonce: %w", s, err)
	}
	return id, nonce, nil
}

// HashOf is a payload's BLAKE3-256 digest.
func HashOf(p []byte) [32]byte { return blake3.Sum256(p) }

// opKind is what an operation does.
type opKind uint8

const (
	opSend opKind = iota
	opRecv
	opAck
	opNack
	opExtend
	opTerminate
	opRedrive
	opSweep
)

var opNames = [...]string{"send", "recv", "ack", "nack", "extend", "terminate", "redrive", "sweep"}

func (k opKind) String() string { return opNames[k] }

// op is one operation of a group commit.
type op struct {
	kind  opKind
	topic string

	// send
	key   string // Idempotency-Key, "" for none
	fp    idem.Fingerprint
	env   envelope
	delay time.Duration

	// recv
	max        int
	visibility time.Duration

	// ack, nack, extend, terminate
	id, nonce uint64
	// nack's delay (-1 for the backoff), extend's visibility
	dur time.Duration

	// redrive: at most max messages of topic.dlq back to topic
}

// delivery is one message handed out by a receive.
type delivery struct {
	ID       uint64
	Receipt  uint64
	Env      envelope
	Attempts uint32
}

// result is an operation's outcome.
type result struct {
	err       error // a refusal by the mailbox's rules
	id        uint64
	duplicate bool
	msgs      []delivery
	// next is when the topic's first message not yet visible becomes
	// visible (unix ms), 0 if none: a long poll's nearest deadline. Only a
	// receive that delivered nothing sets it.
	next     int64
	dlq      int // messages moved into a DLQ (recv, terminate)
	redriven int // messages moved out of one
	redeliv  int // deliveries of messages delivered before
	// lapsed are the deliveries a receive found ended by their
	// visibility, not by an ack, nack or terminate.
	lapsed int
	// topic is a receive's topic.
	topic    string
	integ    int // messages whose payload failed its hash
	backoffs int // put back after a full-jitter backoff: a failed delivery not parked, or a nack without delay_ms
	swept    int
	expired  int // messages past retention deleted by a sweep
	// wake are the topics in which the operation made a message visible
	// or due: their long polls look again.
	wake []string
	// held are the deliveries the operation started, extended (until,
	// unix ms) or ended (until 0), for the in-flight count.
	held []hold
}

// hold is a delivery holding message id until its deadline.
type hold struct {
	id    uint64
	until int64
}

// rules are the settings Apply needs.
type rules struct {
	maxAttempts             uint32
	backoffBase, backoffMax time.Duration
	dedup                   time.Duration
	retention               time.Duration       // 0 keeps messages forever
	jitter                  func(n int64) int64 // [0, n); tests fix it
	// floors, if set, is where receives seek in the visibility index;
	// whoever runs apply forgets them when a group fails.
	floors *floors
}

func (r rules) table() idem.Table {
	return idem.Table{Records: bucketIdem, Expiry: bucketIdemExpiry, TTL: r.dedup}
}

// backoff is the full-jitter delay before the attempts'th redelivery.
func (r rules) backoff(attempts uint32) time.Duration {
	ceil := r.backoffBase
	for i := uint32(1); i < attempts && ceil < r.backoffMax; i++ {
		ceil *= 2
	}
	ceil = min(ceil, r.backoffMax)
	if ceil <= 0 {
		return 0
	}
	j := r.jitter
	if j == nil {
		j = rand.Int64N
	}
	return time.Duration(j(int64(ceil)))
}

func idemKey(topic, key string) string { return topic + "\x00" + key }

// commit applies ops at now as one group of db, one result each. A group
// that fails (or panics) leaves nothing in the store, and makes the
// floors forget what it taught them.
func (r rules) commit(db *store.DB, now time.Time, ops []op) (out []result, err error) {
	committed := false
	defer func() {
		if !committed {
			r.floors.forget()
		}
	}()
	err = db.Update(func(tx *store.Tx) (err error) {
		out, err = r.apply(tx, now, ops)
		return err
	})
	committed = err == nil
	return out, err
}

// apply applies ops in tx at now, one result each. A returned error fails
// the whole group; refusals are results.
func (r rules) apply(tx *store.Tx, now time.Time, ops []op) ([]result, error) {
	out := make([]result, len(ops))
	for i, o := range ops {
		var err error
		switch o.kind {
		case opSend:
			out[i], err = r.send(tx, now, o)
		case opRecv:
			out[i], err = r.recv(tx, now, o)
		case opAck, opNack, opExtend, opTerminate:
			out[i], err = r.settle(tx, now, o)
		case opRedrive:
			out[i], err = r.redrive(tx, now, o)
		case opSweep:
			out[i], err = r.sweep(tx, now, o.max)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.kind, err)
		}
	}
	return out, nil
}

func (r rules) send(tx *store.Tx, now time.Time, o op) (result, error) {
	t := r.table()
	if o.key != "" {
		rec, ok, err := t.Lookup(tx, idemKey(o.topic, o.key), now)
		if err != nil {
			return result{}, err
		}
		if ok {
			if rec.Fingerprint != o.fp {
				return result{err: ErrReusedKey}, nil
			}
			id, err := ParseMsgID(string(rec.Body))
			if err != nil {
				return result{}, fmt.Errorf("idempotency record of %q: %w", o.key, err)
			}
			return result{id: id, duplicate: true}, nil
		}
	}
	id := tx.NextSeq()
	env := o.env
	env.EnqueuedAt = now.UnixMilli()
	at := now.Add(o.delay).UnixMilli()
	eb := envelopes.Get().(*[]byte)
	*eb = appendEnvelope((*eb)[:0], env)
	err := tx.Put(bucketEnvelopes, idKey(id), *eb)
	envelopes.Put(eb)
	if err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketMeta, idKey(id), encodeMeta(meta{Topic: o.topic, VisibleAt: at})); err != nil {
		return result{}, err
	}
	if err := r.index(tx, o.topic, at, id); err != nil {
		return result{}, err
	}
	if o.key != "" {
		rec := idem.Record{Fingerprint: o.fp, Status: 200, ContentType: "text/plain", Body: []byte(MsgID(id))}
		if err := t.Put(tx, idemKey(o.topic, o.key), rec, now); err != nil {
			return result{}, err
		}
	}
	return result{id: id, wake: []string{o.topic}}, nil
}

// index writes message id's key in the visibility index.
func (r rules) index(tx *store.Tx, topic string, at int64, id uint64) error {
	r.floors.lower(topic, max(at, 0))
	return tx.Put(bucketVisible, visKey(topic, at, id), nil)
}

// move rewrites message id's meta to m (from old), moving its index entry.
func (r rules) move(tx *store.Tx, id uint64, old, m meta) error {
	if err := tx.Delete(bucketVisible, visKey(old.Topic, old.VisibleAt, id)); err != nil {
		return err
	}
	if err := tx.Put(bucketMeta, idKey(id), encodeMeta(m)); err != nil {
		return err
	}
	return r.index(tx, m.Topic, m.VisibleAt, id)
}

// toDLQ moves a message to its topic's DLQ, ready at once, with reason. A
// message of a DLQ stays in it: a DLQ has no DLQ.
func (r rules) toDLQ(tx *store.Tx, now time.Time, id uint64, m meta, reason string) error {
	n := meta{Topic: m.Topic, VisibleAt: now.UnixMilli(), Reason: reason}
	if !strings.HasSuffix(m.Topic, dlqSuffix) {
		n.Topic = m.Topic + dlqSuffix
	}
	return r.move(tx, id, m, n)
}

// park moves a message whose payload failed its hash max_attempts times
// to its topic's DLQ (or leaves it in the DLQ it is in) at parkedAt, with
// reason "integrity": no receive, redrive or settle reaches it again, and
// retention deletes it. It reports whether the message entered a DLQ.
func (r rules) park(tx *store.Tx, id uint64, m meta) (bool, error) {
	n := meta{Topic: m.Topic, VisibleAt: parkedAt, Reason: "integrity"}
	moved := !strings.HasSuffix(m.Topic, dlqSuffix)
	if moved {
		n.Topic = m.Topic + dlqSuffix
	}
	return moved, r.move(tx, id, m, n)
}

// recv delivers up to o.max messages of o.topic visible at now. A message
// already delivered max_attempts times moves to the DLQ instead; one
// whose payload fails its hash is never delivered, and counts as a
// delivery, so that it is parked in the DLQ after max_attempts.
//
// recv ends because it writes no key of o.topic visible at or before now:
// each message it meets is delivered (visible after now + visibility,
// at least 1 ms), put back after a backoff of at least 1 ms, moved to
// another topic (the DLQ) or parked at parkedAt. So each pass over the
// topic's range leaves fewer keys in it.
func (r rules) recv(tx *store.Tx, now time.Time, o op) (result, error) {
	res := result{topic: o.topic}
	nowMs := now.UnixMilli()
	from, to := topicRange(o.topic, nowMs+1)
	if at, ok := r.floors.get(o.topic); ok {
		from = visKey(o.topic, at, 0)
	}
	// floor is where the topic's keys begin once this receive is done:
	// past now if it took every key up to now, else at the last key it
	// took.
	floor, last := nowMs+1, int64(-1)
	ids := make([]uint64, 0, o.max)
	for len(res.msgs) < o.max {
		ids = ids[:0]
		tx.Ascend(bucketVisible, from, to, func(k, _ []byte) bool {
			ids = append(ids, binary.BigEndian.Uint64(k[len(k)-8:]))
			last = int64(binary.BigEndian.Uint64(k[len(k)-16 : len(k)-8]))
			return len(ids) < o.max-len(res.msgs)
		})
		if len(ids) == 0 {
			last = -1
			break
		}
		for _, id := range ids {
			mb := tx.Get(bucketMeta, idKey(id))
			if mb == nil {
				return res, fmt.Errorf("message %s: indexed without meta", MsgID(id))
			}
			m, err := decodeMeta(mb)
			if err != nil {
				return res, fmt.Errorf("message %s: %w", MsgID(id), err)
			}
			if m.Receipt != 0 { // delivered, not settled, and visible again
				res.lapsed++
			}
			if m.Attempts >= r.maxAttempts && !strings.HasSuffix(m.Topic, dlqSuffix) {
				if err := r.toDLQ(tx, now, id, m, "max_attempts"); err != nil {
					return res, err
				}
				res.dlq++
				res.wake = append(res.wake, o.topic+dlqSuffix)
				continue
			}
			n := m
			n.Attempts++
			n.Receipt = tx.NextSeq()
			n.VisibleAt = nowMs + max(1, o.visibility.Milliseconds())
			env, err := decodeEnvelope(tx.Get(bucketEnvelopes, idKey(id)))
			if err == nil && HashOf(env.Payload) != env.Hash {
				err = errors.New("payload hash mismatch")
			}
			if err != nil {
				// Never delivered as good data; retried after a backoff
				// until max_attempts parks it in the DLQ. Not toDLQ: a
				// DLQ's message would be written back ready at now, in
				// this receive's range, met again and again.
				res.integ++
				if n.Attempts >= r.maxAttempts {
					moved, err := r.park(tx, id, m)
					if err != nil {
						return res, err
					}
					if moved {
						res.dlq++
					}
					continue
				}
				n.Receipt = 0
				// At least 1ms on: past this receive's range, so that one
				// receive spends one attempt on it, not all of them.
				n.VisibleAt = nowMs + max(1, r.backoff(n.Attempts).Milliseconds())
				res.backoffs++
				if err := r.move(tx, id, m, n); err != nil {
					return res, err
				}
				continue
			}
			if err := r.move(tx, id, m, n); err != nil {
				return res, err
			}
			if m.Attempts > 0 {
				res.redeliv++
			}
			if res.msgs == nil { // room for all at once, not grown by doubling
				res.msgs, res.held = make([]delivery, 0, o.max), make([]hold, 0, o.max)
			}
			res.msgs = append(res.msgs, delivery{ID: id, Receipt: n.Receipt, Env: env, Attempts: n.Attempts})
			res.held = append(res.held, hold{id, n.VisibleAt})
		}
	}
	if last >= 0 {
		floor = min(floor, last) // o.max reached: keys at last may be left
	}
	r.floors.raise(o.topic, floor)
	if len(res.msgs) > 0 {
		return res, nil // nobody waits for the next deadline
	}
	// The nearest deadline of what is left: the first key past now,
	// parked messages aside.
	f, t := topicRange(o.topic, parkedAt)
	f = to
	tx.Ascend(bucketVisible, f, t, func(k, _ []byte) bool {
		res.next = int64(binary.BigEndian.Uint64(k[len(k)-16 : len(k)-8]))
		return false
	})
	return res, nil
}

// settle is ack, nack, extend and terminate of the delivery o.nonce of
// message o.id.
func (r rules) settle(tx *store.Tx, now time.Time, o op) (result, error) {
	mb := tx.Get(bucketMeta, idKey(o.id))
	if mb == nil {
		return result{err: ErrNotFound}, nil
	}
	m, err := decodeMeta(mb)
	if err != nil {
		// The message's own answer, not a failed commit: no retry mends
		// it, and the group's other operations and the breaker are not
		// its to fail.
		return result{err: &store.CorruptError{File: storeFile, Where: "meta of message " + MsgID(o.id),
			Problem: err.Error(), Remedy: "restore the data dir from a backup"}}, nil
	}
	if m.Receipt == 0 || m.Receipt != o.nonce {
		return result{err: ErrStaleReceipt}, nil
	}
	nowMs := now.UnixMilli()
	switch o.kind {
	case opAck:
		for _, e := range []struct {
			b int
			k []byte
		}{{bucketVisible, visKey(m.Topic, m.VisibleAt, o.id)}, {bucketMeta, idKey(o.id)}, {bucketEnvelopes, idKey(o.id)}} {
			if err := tx.Delete(e.b, e.k); err != nil {
				return result{}, err
			}
		}
		return result{id: o.id, held: []hold{{o.id, 0}}}, nil
	case opNack:
		n := m
		n.Receipt = 0
		res := result{id: o.id, wake: []string{m.Topic}, held: []hold{{o.id, 0}}}
		d := o.dur
		if d < 0 {
			d = r.backoff(m.Attempts)
			res.backoffs = 1
		}
		n.VisibleAt = nowMs + d.Milliseconds()
		return res, r.move(tx, o.id, m, n)
	case opExtend:
		if m.VisibleAt <= nowMs {
			return result{err: ErrExpired}, nil
		}
		n := m
		n.VisibleAt = nowMs + o.dur.Milliseconds()
		return result{id: o.id, held: []hold{{o.id, n.VisibleAt}}}, r.move(tx, o.id, m, n)
	default: // opTerminate
		res := result{id: o.id, dlq: 1, wake: []string{m.Topic + dlqSuffix}, held: []hold{{o.id, 0}}}
		if strings.HasSuffix(m.Topic, dlqSuffix) {
			res.dlq, res.wake = 0, []string{m.Topic}
		}
		return res, r.toDLQ(tx, now, o.id, m, "terminated")
	}
}

// redrive moves up to o.max messages of o.topic's DLQ back to o.topic,
// ready at once, attempts reset. Parked messages stay: their payloads
// would fail again.
func (r rules) redrive(tx *store.Tx, now time.Time, o op) (result, error) {
	var ids []uint64
	from, to := topicRange(o.topic+dlqSuffix, parkedAt)
	tx.Ascend(bucketVisible, from, to, func(k, _ []byte) bool {
		ids = append(ids, binary.BigEndian.Uint64(k[len(k)-8:]))
		return len(ids) < o.max
	})
	for _, id := range ids {
		m, err := decodeMeta(tx.Get(bucketMeta, idKey(id)))
		if err != nil {
			return result{}, fmt.Errorf("message %s: %w", MsgID(id), err)
		}
		if err := r.move(tx, id, m, meta{Topic: o.topic, VisibleAt: now.UnixMilli()}); err != nil {
			return result{}, err
		}
	}
	res := result{redriven: len(ids)}
	if len(ids) > 0 {
		res.wake = []string{o.topic}
	}
	return res, nil
}

// stats are a topic's counts at now.
type stats struct {
	Ready       int   `json:"ready"`
	Inflight    int   `json:"inflight"`
	Delayed     int   `json:"delayed"`
	DLQ         int   `json:"dlq"`
	Damaged     int   `json:"damaged"`
	OldestAgeMs int64 `json:"oldest_age_ms"`
}

// topicStats counts topic's messages in g at now: ready (visible now),
// in flight (held by a delivery), damaged (parked), delayed (none of
// these), and its DLQ's, parked ones included.
func topicStats(g store.Reader, topic string, now time.Time) (stats, error) {
	var s stats
	var err error
	nowMs := now.UnixMilli()
	from, to := topicRange(topic, -1)
	var oldest uint64
	g.Ascend(bucketVisible, from, to, func(k, _ []byte) bool {
		id := binary.BigEndian.Uint64(k[len(k)-8:])
		at := int64(binary.BigEndian.Uint64(k[len(k)-16 : len(k)-8]))
		switch {
		case at <= nowMs:
			s.Ready++
		case at == parkedAt:
			s.Damaged++
		default:
			var m meta
			if m, err = decodeMeta(g.Get(bucketMeta, idKey(id))); err != nil {
				return false
			}
			if m.Receipt != 0 {
				s.Inflight++
			} else {
				s.Delayed++
			}
		}
		if oldest == 0 || id < oldest {
			e, derr := decodeEnvelope(g.Get(bucketEnvelopes, idKey(id)))
			if derr != nil {
				err = derr
				return false
			}
			oldest = id
			s.OldestAgeMs = max(0, nowMs-e.EnqueuedAt)
		}
		return true
	})
	if err != nil {
		return s, err
	}
	if !strings.HasSuffix(topic, dlqSuffix) {
		from, to = topicRange(topic+dlqSuffix, -1)
		g.Ascend(bucketVisible, from, to, func(_, _ []byte) bool { s.DLQ++; return true })
	}
	return s, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// hexHash renders a payload hash.
func hexHash(h [32]byte) string { return hex.EncodeToString(h[:]) }

// holds returns the deliveries in g that hold their message at now: the
// in-flight count's state after a restart.
func holds(g store.Reader, now time.Time) ([]hold, error) {
	var out []hold
	var err error
	nowMs := now.UnixMilli()
	g.Ascend(bucketMeta, nil, nil, func(k, v []byte) bool {
		var m meta
		if m, err = decodeMeta(v); err != nil {
			return false
		}
		if m.Receipt != 0 && m.VisibleAt > nowMs {
			out = append(out, hold{binary.BigEndian.Uint64(k), m.VisibleAt})
		}
		return true
	})
	return out, err
}

// sweep deletes, in tx, up to limit idempotency records expired at now
// and up to limit messages older than retention, oldest first: ids grow
// with send time, so the sweep stops at the first message still kept.
func (r rules) sweep(tx *store.Tx, now time.Time, limit int) (result, error) {
	var res result
	var err error
	if res.swept, err = r.table().Sweep(tx, now, limit); err != nil || r.retention <= 0 {
		return res, err
	}
	cutoff := now.Add(-r.retention).UnixMilli()
	var old []uint64
	tx.Ascend(bucketEnvelopes, nil, nil, func(k, v []byte) bool {
		var e envelope
		if e, err = decodeEnvelope(v); err != nil || e.EnqueuedAt > cutoff {
			return false
		}
		old = append(old, binary.BigEndian.Uint64(k))
		return len(old) < limit
	})
	if err != nil {
		return res, err
	}
	for _, id := range old {
		m, err := decodeMeta(tx.Get(bucketMeta, idKey(id)))
		if err != nil {
			return res, fmt.Errorf("message %s: %w", MsgID(id), err)
		}
		for _, e := range []struct {
			b int
			k []byte
		}{{bucketVisible, visKey(m.Topic, m.VisibleAt, id)}, {bucketMeta, idKey(id)}, {bucketEnvelopes, idKey(id)}} {
			if err := tx.Delete(e.b, e.k); err != nil {
				return res, err
			}
		}
		if m.Receipt != 0 {
			res.held = append(res.held, hold{id, 0})
		}
		res.expired++
	}
	return res, nil
}
