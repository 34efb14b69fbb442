package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/durable"
	"github.com/plughost/plughost/sdk/idem"
	"github.com/plughost/plughost/sdk/store"
)

// Request limits the config does not set.
const (
	maxBodyBytes    = 1 << 20 // the seed's frame limit
	maxRecvBatch    = 10
	maxWait         = 20 * time.Second
	maxVisibility   = 12 * time.Hour
	maxDelay        = 15 * time.Minute
	maxAttrs        = 16
	maxAttrKeyLen   = 128
	maxAttrValLen   = 1024
	maxBatchEntries = 10
	maxRedriveBulk  = 1 << 20
	maxRedriveChunk = 256 // messages per commit of a redrive
)

// errBadRequest marks a request the decoders refuse: 400.
var errBadRequest = errors.New("bad request")

// errTooLarge marks a payload over max_message_bytes: 413.
var errTooLarge = errors.New("payload too large")

// errHashMismatch: the payload is not what payload_hash says: 400.
var errHashMismatch = errors.New("payload does not match payload_hash")

func badRequest(format string, args ...any) error {
	return &requestError{fmt.Sprintf(format, args...)}
}

// requestError is a client's mistake: it is errBadRequest, and its text
// is the message alone, without errBadRequest's.
type requestError struct{ msg string }

func (e *requestError) Error() string        { return e.msg }
func (e *requestError) Is(target error) bool { return target == errBadRequest }

// decodeJSON decodes exactly one JSON object into v, refusing unknown
// fields and anything after the object.
func decodeJSON(body []byte, v any) error {
	if err := sdk.DecodeJSON(bytes.NewReader(body), v); err != nil {
		return badRequest("decode body: %v", err)
	}
	return nil
}

// sendReq is POST /v1/send's body.
type sendReq struct {
	Topic       string            `json:"topic"`
	Payload     *[]byte           `json:"payload"` // base64
	Attrs       map[string]string `json:"attrs"`
	DelayMs     int64             `json:"delay_ms"`
	PayloadHash string            `json:"payload_hash"`
}

// decodeSend decodes and checks a send; maxBytes bounds the payload.
func decodeSend(body []byte, maxBytes int) (op, error) {
	l := &lexer{b: body}
	r, ok := parseSend(l)
	if !ok || !l.end() {
		r = sendReq{}
		if err := decodeJSON(body, &r); err != nil {
			return op{}, err
		}
	}
	switch {
	case !validTopic(r.Topic):
		return op{}, errTopic(r.Topic)
	case r.Topic == "." || r.Topic == "..":
		// Valid names, but no URL's path can hold them as a segment:
		// GET /v1/topics/.. could never show the topic.
		return op{}, badRequest("topic %q: a path segment of its own; name the topic otherwise", r.Topic)
	case r.Payload == nil:
		return op{}, badRequest("payload is required (base64)")
	case len(*r.Payload) > maxBytes:
		return op{}, fmt.Errorf("payload of %d bytes, more than max_message_bytes %d: %w", len(*r.Payload), maxBytes, errTooLarge)
	case r.DelayMs < 0 || time.Duration(r.DelayMs)*time.Millisecond > maxDelay:
		return op{}, badRequest("delay_ms %d: want 0 to %d", r.DelayMs, maxDelay.Milliseconds())
	case len(r.Attrs) > maxAttrs:
		return op{}, badRequest("%d attrs: want at most %d", len(r.Attrs), maxAttrs)
	}
	for k, v := range r.Attrs {
		if k == "" || len(k) > maxAttrKeyLen || len(v) > maxAttrValLen {
			return op{}, badRequest("attr %q: want a key of 1 to %d bytes and a value of at most %d", k, maxAttrKeyLen, maxAttrValLen)
		}
	}
	h := HashOf(*r.Payload)
	if r.PayloadHash != "" {
		want, err := hex.DecodeString(r.PayloadHash)
		if err != nil || len(want) != 32 {
			return op{}, badRequest("payload_hash: want 64 hex digits of BLAKE3-256")
		}
		if !bytes.Equal(want, h[:]) {
			return op{}, fmt.Errorf("payload_hash %s, payload hashes to %s: %w", r.PayloadHash, hexHash(h), errHashMismatch)
		}
	}
	return op{kind: opSend, topic: r.Topic, delay: time.Duration(r.DelayMs) * time.Millisecond,
		env: envelope{Hash: h, Attrs: r.Attrs, Payload: *r.Payload}}, nil
}

// fingerprint is send o's idempotency fingerprint: two sends are the same
// send when their topic, payload, attrs and delay are. Only a send with a
// key needs it.
func (o op) fingerprint() idem.Fingerprint {
	return idem.FingerprintOf([]byte(o.topic), o.env.Hash[:], encodeEnvelope(envelope{Attrs: o.env.Attrs}), strconv.AppendInt(nil, o.delay.Milliseconds(), 10))
}

// recvReq is POST /v1/recv's body.
type recvReq struct {
	Topic        string `json:"topic"`
	MaxMessages  *int   `json:"max_messages"`
	VisibilityMs *int64 `json:"visibility_ms"`
	WaitMs       int64  `json:"wait_ms"`
}

// decodeRecv decodes and checks a receive and returns it with its wait.
func decodeRecv(body []byte, s settings) (op, time.Duration, error) {
	l := &lexer{b: body}
	r, ok := parseRecv(l)
	if !ok || !l.end() {
		r = recvReq{}
		if err := decodeJSON(body, &r); err != nil {
			return op{}, 0, err
		}
	}
	o := op{kind: opRecv, topic: r.Topic, max: 1, visibility: s.defaultVisibility}
	if r.MaxMessages != nil {
		o.max = *r.MaxMessages
	}
	if r.VisibilityMs != nil {
		o.visibility = time.Duration(*r.VisibilityMs) * time.Millisecond
	}
	wait := time.Duration(r.WaitMs) * time.Millisecond
	switch {
	case !validTopic(r.Topic):
		return op{}, 0, errTopic(r.Topic)
	case o.max < 1 || o.max > maxRecvBatch:
		return op{}, 0, badRequest("max_messages %d: want 1 to %d", o.max, maxRecvBatch)
	case r.VisibilityMs != nil && (*r.VisibilityMs < s.visibilityMin.Milliseconds() || *r.VisibilityMs > maxVisibility.Milliseconds()):
		return op{}, 0, badRequest("visibility_ms %d: want %d to %d", *r.VisibilityMs, s.visibilityMin.Milliseconds(), maxVisibility.Milliseconds())
	case r.WaitMs < 0 || r.WaitMs > maxWait.Milliseconds():
		return op{}, 0, badRequest("wait_ms %d: want 0 to %d", r.WaitMs, maxWait.Milliseconds())
	}
	return o, wait, nil
}

// settleReq is the body of ack, nack, extend and terminate; decodeSettle
// refuses the fields an operation does not take.
type settleReq struct {
	MsgID        string `json:"msg_id"`
	Receipt      string `json:"receipt"`
	DelayMs      *int64 `json:"delay_ms,omitempty"`
	VisibilityMs *int64 `json:"visibility_ms,omitempty"`
}

func decodeSettle(body []byte, kind opKind, s settings) (op, error) {
	l := &lexer{b: body}
	r, ok := parseSettle(l)
	if !ok || !l.end() {
		r = settleReq{}
		if err := decodeJSON(body, &r); err != nil {
			return op{}, err
		}
	}
	id, err := ParseMsgID(r.MsgID)
	if err != nil {
		return op{}, badRequest("%v", err)
	}
	rid, nonce, err := ParseReceipt(r.Receipt)
	if err != nil {
		return op{}, badRequest("%v", err)
	}
	if rid != id {
		return op{}, badRequest("receipt %q is not of message %s", r.Receipt, r.MsgID)
	}
	o := op{kind: kind, id: id, nonce: nonce, dur: -1}
	if r.DelayMs != nil && kind != opNack {
		return op{}, badRequest("decode body: json: unknown field \"delay_ms\"")
	}
	if r.VisibilityMs != nil && kind != opExtend {
		return op{}, badRequest("decode body: json: unknown field \"visibility_ms\"")
	}
	switch kind {
	case opNack:
		if r.DelayMs != nil {
			if *r.DelayMs < 0 || *r.DelayMs > maxDelay.Milliseconds() {
				return op{}, badRequest("delay_ms %d: want 0 to %d", *r.DelayMs, maxDelay.Milliseconds())
			}
			o.dur = time.Duration(*r.DelayMs) * time.Millisecond
		}
	case opExtend:
		if r.VisibilityMs == nil {
			return op{}, badRequest("visibility_ms is required")
		}
		if *r.VisibilityMs < s.visibilityMin.Milliseconds() || *r.VisibilityMs > maxVisibility.Milliseconds() {
			return op{}, badRequest("visibility_ms %d: want %d to %d", *r.VisibilityMs, s.visibilityMin.Milliseconds(), maxVisibility.Milliseconds())
		}
		o.dur = time.Duration(*r.VisibilityMs) * time.Millisecond
	}
	return o, nil
}

// redriveReq is POST /v1/redrive's body.
type redriveReq struct {
	Topic    string  `json:"topic"`
	Max      int     `json:"max"`
	RatePerS float64 `json:"rate_per_s"`
}

// errTopic is the error for a topic name validTopic refuses.
func errTopic(t string) error {
	return badRequest("topic %q: want 1 to %d of [A-Za-z0-9._-], or a topic's dead-letter queue TOPIC%s", t, maxTopicLen, dlqSuffix)
}

func decodeRedrive(body []byte) (redriveJob, error) {
	var r redriveReq
	if err := decodeJSON(body, &r); err != nil {
		return redriveJob{}, err
	}
	switch {
	case !validTopic(r.Topic) || len(r.Topic) > maxTopicLen:
		return redriveJob{}, badRequest("topic %q: want 1 to %d of [A-Za-z0-9._-]", r.Topic, maxTopicLen)
	case r.Max < 1 || r.Max > maxRedriveBulk:
		return redriveJob{}, badRequest("max %d: want 1 to %d", r.Max, maxRedriveBulk)
	case !(r.RatePerS >= 0 && r.RatePerS <= 1e6): // refuses NaN too
		return redriveJob{}, badRequest("rate_per_s %v: want 0 (unlimited) to 1000000", r.RatePerS)
	}
	return redriveJob{topic: r.Topic, max: r.Max, rate: r.RatePerS}, nil
}

// routes declares the API on mux.
func (mb *mailbox) routes(mux *sdk.Mux) {
	mux.HandleFunc("POST /v1/send", mb.handle("send", mb.send))
	// A long poll waits up to maxWait; the host's deadline must outlast it.
	mux.HandleFunc("POST /v1/recv", mb.handle("recv", mb.recv), sdk.Timeout(maxWait+5*time.Second))
	for _, k := range []opKind{opAck, opNack, opExtend, opTerminate} {
		mux.HandleFunc("POST /v1/"+k.String(), mb.handle(k.String(), func(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
			mb.settle(w, r, run, body, k)
		}))
	}
	mux.HandleFunc("GET /v1/recv/stream", mb.handle("recv_stream", mb.stream), sdk.Streaming())
	mux.HandleFunc("POST /v1/send/batch", mb.handle("send_batch", mb.sendBatch))
	mux.HandleFunc("POST /v1/ack/batch", mb.handle("ack_batch", mb.ackBatch))
	mux.HandleFunc("POST /v1/redrive", mb.handle("redrive", mb.redrive))
	mux.HandleFunc("GET /v1/topics/{topic}", mb.handle("topic", mb.topic))
}

// handle reads the body (at most maxBodyBytes) and times the request.
func (mb *mailbox) handle(name string, h func(http.ResponseWriter, *http.Request, *running, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		run := mb.running.Load()
		if run == nil {
			sdk.WriteError(w, http.StatusServiceUnavailable, "unavailable", "not configured")
			return
		}
		start := time.Now()
		defer func() { run.m.latency.WithLabelValues(name).Observe(time.Since(start).Seconds()) }()
		bp := bodies.Get().(*[]byte)
		body, err := readBody((*bp)[:0], r.Body, r.ContentLength)
		defer func() {
			switch {
			case body == nil: // a failed read: *bp is as it was
				bodies.Put(bp)
			case cap(body) <= maxPooledBody:
				*bp = body[:0]
				bodies.Put(bp)
			}
		}()
		switch {
		case err != nil:
			sdk.WriteError(w, http.StatusBadRequest, "bad_request", "read body: "+err.Error())
			return
		case len(body) > maxBodyBytes:
			sdk.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes", maxBodyBytes))
			return
		}
		h(w, r, run, body)
	}
}

// bodies are the buffers requests' bodies are read into, reused: a
// handler keeps nothing of its body once it returns, since the decoders
// copy what they keep (strings, decoded payloads, encoding/json's
// values). A buffer past maxPooledBody is left to the collector.
var bodies = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody is the largest body buffer kept for reuse: a batch of ten
// 1 KiB sends is about 14 KB.
const maxPooledBody = 64 << 10

// readBody reads a request's body into buf, from its start, up to one
// byte past maxBodyBytes; size is its declared length (-1 unknown), for
// which buf grows once rather than by doubling. A body shorter than it
// declared is an error.
func readBody(buf []byte, body io.Reader, size int64) ([]byte, error) {
	b := buf[:0]
	if size > 0 && size <= maxBodyBytes {
		b = slices.Grow(b, int(size)+1) // one more: a body longer than it declared shows
	}
	for len(b) <= maxBodyBytes {
		if len(b) == cap(b) {
			b = slices.Grow(b, max(512, len(b)))
		}
		n, err := body.Read(b[len(b):min(cap(b), maxBodyBytes+1)])
		b = b[:len(b)+n]
		// A body that gave all it declared ends at the next read that
		// gives nothing, whatever its error.
		if err == io.EOF || err != nil && n == 0 && int64(len(b)) == size {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if int64(len(b)) < size && size <= maxBodyBytes {
		if len(b) == 0 {
			return nil, io.EOF
		}
		return nil, io.ErrUnexpectedEOF
	}
	return b, nil
}

// statusOf maps an error of a request to its HTTP status and error code:
// the one place the mailbox's errors become statuses.
func statusOf(err error) (int, string) {
	if status, code, ok := idem.Status(err); ok {
		return status, code
	}
	var ce *store.CorruptError
	switch {
	case errors.Is(err, errUnauthenticated):
		return http.StatusUnauthorized, "unauthenticated"
	case errors.Is(err, errForbidden):
		return http.StatusForbidden, "forbidden"
	case errors.Is(err, errBadRequest):
		return http.StatusBadRequest, "bad_request"
	case errors.Is(err, errHashMismatch):
		return http.StatusBadRequest, "payload_hash_mismatch"
	case errors.Is(err, errTooLarge):
		return http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, "not_found"
	case errors.Is(err, ErrStaleReceipt):
		return http.StatusConflict, "stale_receipt"
	case errors.Is(err, ErrExpired):
		return http.StatusConflict, "visibility_expired"
	case errors.Is(err, errShardFull):
		return http.StatusTooManyRequests, "shard_full"
	case errors.Is(err, durable.ErrBusy):
		return http.StatusTooManyRequests, "busy"
	case errors.As(err, &ce):
		return http.StatusInternalServerError, "storage_corrupt"
	default: // durable.ErrUnavailable, ErrDraining, ErrStalled, the store's, a cancelled request
		return http.StatusServiceUnavailable, "unavailable"
	}
}

// fail answers err with statusOf's status and code; a 429 or 503 carries
// Retry-After.
func (run *running) fail(w http.ResponseWriter, err error) {
	status, code := statusOf(err)
	switch {
	case code == "shard_full":
		w.Header().Set("Retry-After", "1")
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", retryAfter(run.c.RetryAfter()))
	}
	sdk.WriteError(w, status, code, err.Error())
}

func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int(d.Round(time.Second).Seconds())))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// do submits o to the committer and waits for its result or ctx. A result
// that is a refusal comes back as its error.
func (run *running) do(ctx context.Context, o op, done func(result, error)) (result, error) {
	type outcome struct {
		r   result
		err error
	}
	ch := make(chan outcome, 1)
	err := run.c.Submit(o, func(r result, err error) {
		if done != nil {
			done(r, err)
		}
		ch <- outcome{r, err}
	})
	if err != nil {
		if done != nil {
			done(result{}, err)
		}
		return result{}, err
	}
	select {
	case out := <-ch:
		if out.err == nil && out.r.err != nil {
			out.err = out.r.err
		}
		return out.r, out.err
	case <-ctx.Done(): // the host gave up; the group may still commit
		return result{}, ctx.Err()
	}
}

// releaser is the callback of a receive that reserved n in-flight slots:
// it gives them back once the receive's outcome is known (its deliveries
// announced, or none made), except after ErrStalled, whose outcome comes
// later, to Settled.
func (run *running) releaser(n int) func(result, error) {
	return func(_ result, err error) {
		if !errors.Is(err, durable.ErrStalled) {
			run.flight.release(n)
		}
	}
}

// errShardFull: the topic's shard has shard_capacity sends in progress.
var errShardFull = errors.New("the topic's shard is full")

func (mb *mailbox) send(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
	o, err := decodeSend(body, run.s.maxMessageBytes)
	if err != nil {
		run.fail(w, err)
		return
	}
	if o.key, err = idem.Key(r.Header); err != nil && !errors.Is(err, idem.ErrMissing) {
		run.fail(w, err)
		return
	}
	if err := run.allow(r, o.topic, "send"); err != nil {
		run.fail(w, err)
		return
	}
	res, err := run.sendOne(r.Context(), o)
	if err != nil {
		run.fail(w, err)
		return
	}
	writeJSON(w, sendAnswer{MsgID: MsgID(res.id), Duplicate: res.duplicate})
}

// sendAnswer is a send's answer, and a batch entry's when it succeeded.
type sendAnswer struct {
	MsgID     string `json:"msg_id"`
	Duplicate bool   `json:"duplicate"`
}

// sendOne sends o and waits for its outcome or ctx.
func (run *running) sendOne(ctx context.Context, o op) (result, error) {
	type outcome struct {
		r   result
		err error
	}
	ch := make(chan outcome, 1)
	if err := run.startSend(o, func(r result, err error) { ch <- outcome{r, err} }); err != nil {
		return result{}, err
	}
	select {
	case out := <-ch:
		return out.r, out.err
	case <-ctx.Done(): // the host gave up; the group may still commit
		return result{}, ctx.Err()
	}
}

// startSend submits o through its shard's intake, holding its key's
// claim, until its commit ends: then done gets its result, a refusal by
// the rules as its error. An error returned means o was not submitted,
// and done is not called.
func (run *running) startSend(o op, done func(result, error)) error {
	sh := &run.intake[run.shard(o.topic)]
	if sh.Add(1) > int64(run.s.shardCapacity) {
		sh.Add(-1)
		run.m.busy.WithLabelValues("send").Inc()
		return fmt.Errorf("%d sends in progress: %w", run.s.shardCapacity, errShardFull)
	}
	release := func(error) {}
	if o.key != "" {
		o.fp = o.fingerprint()
		ck := idemKey(o.topic, o.key)
		if err := run.claims.Claim(ck, o.fp); err != nil {
			sh.Add(-1)
			return err
		}
		release = func(err error) {
			if !errors.Is(err, durable.ErrStalled) { // else Settled releases it
				run.claims.Release(ck)
			}
		}
	}
	err := run.c.Submit(o, func(r result, err error) {
		sh.Add(-1)
		release(err)
		if err == nil {
			err = r.err
		}
		done(r, err)
	})
	if err != nil {
		sh.Add(-1)
		release(err)
		if errors.Is(err, durable.ErrBusy) {
			run.m.busy.WithLabelValues("send").Inc()
		}
	}
	return err
}

// message is one delivery as recv answers it.
type message struct {
	MsgID       string            `json:"msg_id"`
	Receipt     string            `json:"receipt"`
	Payload     []byte            `json:"payload"`
	Attrs       map[string]string `json:"attrs,omitempty"`
	Attempts    uint32            `json:"attempts"`
	PayloadHash string            `json:"payload_hash"`
	EnqueuedAt  time.Time         `json:"enqueued_at"`
}

func toMessage(d delivery) message {
	return message{MsgID: MsgID(d.ID), Receipt: Receipt(d.ID, d.Receipt),
		Payload: d.Env.Payload, Attrs: d.Env.Attrs, Attempts: d.Attempts, PayloadHash: hexHash(d.Env.Hash),
		EnqueuedAt: time.UnixMilli(d.Env.EnqueuedAt).UTC()}
}

// recv receives; with wait_ms it waits until a message is ready, the wait
// ends, the request is cancelled or the drain begins, waking when a
// commit makes a message of the topic visible or at the topic's nearest
// deadline, whichever is first.
func (mb *mailbox) recv(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
	o, wait, err := decodeRecv(body, run.s)
	if err == nil {
		err = run.allow(r, o.topic, "recv")
	}
	if err != nil {
		run.fail(w, err)
		return
	}
	ctx := r.Context()
	end := time.Now().Add(wait)
	want := o.max
	var res result
	for {
		if o.max = run.flight.reserve(run.now(), run.s.globalInflight, want); o.max == 0 {
			run.m.busy.WithLabelValues("recv").Inc()
			w.Header().Set("Retry-After", "1")
			sdk.WriteError(w, http.StatusTooManyRequests, "inflight_cap", fmt.Sprintf("%d deliveries in flight, the global_inflight cap", run.s.globalInflight))
			return
		}
		woken := run.wakers.waiter(o.topic) // before the look, so no wake is missed
		if res, err = run.do(ctx, o, run.releaser(o.max)); err != nil {
			if errors.Is(err, durable.ErrBusy) {
				run.m.busy.WithLabelValues("recv").Inc()
			}
			run.fail(w, err)
			return
		}
		left := time.Until(end)
		if len(res.msgs) > 0 || left <= 0 {
			break
		}
		deadline := int64(0) // the deadline the timer is set to, if it is one
		if next := time.UnixMilli(res.next).Sub(run.now()); res.next > 0 && next < left {
			deadline, left = res.next, next
		}
		if !run.wait(ctx, woken, left, deadline, "recv") {
			break // answer what there is: nothing
		}
	}
	bp := answers.Get().(*[]byte)
	defer answers.Put(bp)
	b, ok := appendRecvAnswer((*bp)[:0], res.msgs)
	*bp = b[:0] // a Writer does not keep what it is given
	if !ok {
		out := struct {
			Messages []message `json:"messages"`
		}{Messages: []message{}}
		for _, d := range res.msgs {
			out.Messages = append(out.Messages, toMessage(d))
		}
		writeJSON(w, out)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// answers are receives' answer buffers, reused: an answer of ten 1 KiB
// messages is about 14 KB.
var answers = sync.Pool{New: func() any { return new([]byte) }}

// streamFull is how often a stream with max_inflight deliveries
// outstanding looks whether one was settled: acks wake no one.
const streamFull = 50 * time.Millisecond

// maxStreamInflight bounds a stream's max_inflight.
const maxStreamInflight = 1000

// decodeStream decodes the stream's query: topic, visibility_ms and
// max_inflight, nothing else.
func decodeStream(q url.Values, s settings) (op, int, error) {
	o := op{kind: opRecv, visibility: s.defaultVisibility}
	limit := 10
	for k, vs := range q {
		if len(vs) != 1 {
			return op{}, 0, badRequest("query parameter %q: give it once", k)
		}
		v := vs[0]
		switch k {
		case "topic":
			o.topic = v
		case "visibility_ms":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < s.visibilityMin.Milliseconds() || n > maxVisibility.Milliseconds() {
				return op{}, 0, badRequest("visibility_ms %q: want %d to %d", v, s.visibilityMin.Milliseconds(), maxVisibility.Milliseconds())
			}
			o.visibility = time.Duration(n) * time.Millisecond
		case "max_inflight":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > maxStreamInflight {
				return op{}, 0, badRequest("max_inflight %q: want 1 to %d", v, maxStreamInflight)
			}
			limit = n
		default:
			return op{}, 0, badRequest("unknown query parameter %q", k)
		}
	}
	if !validTopic(o.topic) {
		return op{}, 0, errTopic(o.topic)
	}
	return o, limit, nil
}

// stream delivers the topic's messages as server-sent events (event
// "message", id the msg_id, data the message as recv answers it) with at
// most max_inflight of its deliveries unacked and unexpired at a time. It
// ends when the client goes away or the drain begins.
func (mb *mailbox) stream(w http.ResponseWriter, r *http.Request, run *running, _ []byte) {
	o, limit, err := decodeStream(r.URL.Query(), run.s)
	if err == nil {
		err = run.allow(r, o.topic, "recv")
	}
	if err != nil {
		run.fail(w, err)
		return
	}
	ctx := r.Context()
	f, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if f != nil {
		f.Flush()
	}
	held := map[uint64]bool{} // this stream's deliveries still outstanding
	for {
		held = run.flight.outstanding(held, run.now())
		var woken <-chan struct{}
		wait, deadline := streamFull, int64(0)
		room := limit - len(held)
		if room > 0 {
			room = run.flight.reserve(run.now(), run.s.globalInflight, min(room, maxRecvBatch))
		}
		if room > 0 { // else look again after streamFull
			woken = run.wakers.waiter(o.topic)
			o.max = room
			res, err := run.do(ctx, o, run.releaser(room))
			if err != nil {
				if isClosed(run.stop) {
					// The drain began during the receive, and ends
					// the stream as it would have ended its wait.
					run.m.canceled["recv_stream"].Inc()
				}
				return // the stream has no status left to give
			}
			for _, d := range res.msgs {
				held[d.ID] = true
				b, _ := json.Marshal(toMessage(d))
				if _, err := fmt.Fprintf(w, "event: message\nid: %s\ndata: %s\n\n", MsgID(d.ID), b); err != nil {
					return
				}
			}
			if len(res.msgs) > 0 {
				if f != nil {
					f.Flush()
				}
				continue
			}
			wait = time.Minute
			if res.next > 0 {
				deadline, wait = res.next, time.UnixMilli(res.next).Sub(run.now())
			}
		}
		if !run.wait(ctx, woken, wait, deadline, "recv_stream") {
			return
		}
	}
}

// wait waits up to d for woken, ctx or the drain. When the timer ends
// the wait and deadline (unix ms) is not 0, it was set to that
// visibility deadline: how late it fired counts in
// scanner_wake_jitter_seconds. It reports whether to look again: not when ctx
// ended or the drain began, which counts in tasks_canceled_total{kind}.
func (run *running) wait(ctx context.Context, woken <-chan struct{}, d time.Duration, deadline int64, kind string) bool {
	t := time.NewTimer(max(d, time.Millisecond))
	defer t.Stop()
	select {
	case <-woken:
	case <-t.C:
		if deadline > 0 {
			run.m.wokeLate(deadline, run.now())
		}
	case <-ctx.Done():
	case <-run.stop:
	}
	if isClosed(run.stop) {
		run.m.canceled[kind].Inc()
		return false
	}
	return ctx.Err() == nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (mb *mailbox) settle(w http.ResponseWriter, r *http.Request, run *running, body []byte, kind opKind) {
	o, err := decodeSettle(body, kind, run.s)
	if err == nil {
		err = run.allowMessage(r, o.id, "ack")
	}
	if err != nil {
		run.fail(w, err)
		return
	}
	if _, err := run.do(r.Context(), o, nil); err != nil {
		run.fail(w, err)
		return
	}
	writeJSON(w, struct {
		MsgID string `json:"msg_id"`
	}{MsgID(o.id)})
}

// redrive queues a redrive for the redriver and answers 202 at once; 429
// reproc_queue_full when redriveQueue are already waiting.
func (mb *mailbox) redrive(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
	j, err := decodeRedrive(body)
	if err == nil {
		err = run.allow(r, j.topic, "redrive")
	}
	if err != nil {
		run.fail(w, err)
		return
	}
	switch err := run.queueRedrive(j); {
	case errors.Is(err, errRedrivesFull):
		run.m.busy.WithLabelValues("redrive").Inc()
		sdk.WriteError(w, http.StatusTooManyRequests, "reproc_queue_full", fmt.Sprintf("%d redrives already wait", redriveQueue))
		return
	case err != nil:
		run.fail(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	writeJSON(w, struct {
		Queued bool `json:"queued"`
	}{true})
}

func (mb *mailbox) topic(w http.ResponseWriter, r *http.Request, run *running, _ []byte) {
	t := r.PathValue("topic")
	if !validTopic(t) {
		run.fail(w, errTopic(t))
		return
	}
	if err := run.allow(r, t, "recv"); err != nil {
		run.fail(w, err)
		return
	}
	var st stats
	err := run.db.Scan(func(s *store.Snapshot) (err error) {
		st, err = topicStats(s, t, run.now())
		return err
	})
	if err != nil {
		run.fail(w, err)
		return
	}
	writeJSON(w, st)
}
