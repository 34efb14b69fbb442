package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/plughost/plughost/sdk/idem"
)

// entryError is a batch entry's error, in the platform's error shape
// with the status the entry would have had alone.
type entryError struct {
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func newEntryError(err error) *entryError {
	status, code := statusOf(err)
	return &entryError{Status: status, Code: code, Message: err.Error()}
}

// batchEntries decodes a batch body, {"entries":[...]} with 1 to
// maxBatchEntries entries, each left raw for its own decoder.
func batchEntries(body []byte) ([]json.RawMessage, error) {
	var b struct {
		Entries []json.RawMessage `json:"entries"`
	}
	var ok bool
	if b.Entries, ok = splitEntries(body); !ok {
		if err := decodeJSON(body, &b); err != nil {
			return nil, err
		}
	}
	if len(b.Entries) < 1 || len(b.Entries) > maxBatchEntries {
		return nil, badRequest("%d entries: want 1 to %d", len(b.Entries), maxBatchEntries)
	}
	return b.Entries, nil
}

// decodeSendEntry decodes one entry of a send batch: a send's body with
// its Idempotency-Key as "idempotency_key".
func decodeSendEntry(raw []byte, maxBytes int) (op, error) {
	if !bytes.Contains(raw, []byte("idempotency_key")) && bytes.IndexByte(raw, '\\') < 0 {
		// No key, spelled out or escaped: the entry is a send's body
		// as it is.
		return decodeSend(raw, maxBytes)
	}
	var k struct {
		Key *string `json:"idempotency_key"`
	}
	// The key is taken out first, so that decodeSend's strict decoding
	// sees only a send's fields.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return op{}, badRequest("decode entry: %v", err)
	}
	if kr, ok := fields["idempotency_key"]; ok {
		if err := json.Unmarshal(kr, &k.Key); err != nil || k.Key == nil {
			return op{}, badRequest("idempotency_key: want a string")
		}
		delete(fields, "idempotency_key")
		raw, _ = json.Marshal(fields)
	}
	o, err := decodeSend(raw, maxBytes)
	if err != nil || k.Key == nil {
		return o, err
	}
	h := http.Header{}
	h.Set(idem.Header, *k.Key)
	o.key, err = idem.Key(h)
	return o, err
}

// sendBatch sends up to maxBatchEntries messages, each answered on its
// own, as SQS's SendMessageBatch: the entries are submitted together, so
// that they share group commits.
func (mb *mailbox) sendBatch(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
	if r.Header.Get(idem.Header) != "" {
		// Not ignored: a client that sets it expects the batch to be
		// deduplicated, and a retry would send every entry again.
		run.fail(w, badRequest("the %s header names one send; give each entry its own idempotency_key", idem.Header))
		return
	}
	runBatch(w, r, run, body, true, func(raw []byte, _ *entryResult, done func(result, error), held map[string]bool) error {
		o, err := decodeSendEntry(raw, run.s.maxMessageBytes)
		if err == nil {
			err = run.allow(r, o.topic, "send")
		}
		if err == nil && o.key != "" {
			// An earlier entry's key: this one goes once that has
			// finished, and reads its record as a send alone would.
			k := idemKey(o.topic, o.key)
			if held[k] {
				return errAfter
			}
			held[k] = true
		}
		if err == nil {
			err = run.startSend(o, done)
		}
		return err
	}, func(out *entryResult, res result) {
		out.id, out.duplicate = res.id, res.duplicate
	})
}

// ackBatch acks up to maxBatchEntries deliveries, each answered on its own.
func (mb *mailbox) ackBatch(w http.ResponseWriter, r *http.Request, run *running, body []byte) {
	runBatch(w, r, run, body, false, func(raw []byte, out *entryResult, done func(result, error), _ map[string]bool) error {
		o, err := decodeSettle(raw, opAck, run.s)
		if err == nil {
			out.id = o.id
			err = run.allowMessage(r, o.id, "ack")
		}
		if err == nil {
			err = run.c.Submit(o, done)
		}
		return err
	}, func(*entryResult, result) {})
}

// errAfter is start's answer for an entry that must wait until the
// entries started before it have finished.
var errAfter = errors.New("mailbox: after the batch's earlier entries")

// runBatch answers a batch call: start begins each entry, submitting it
// with done or saying why it cannot; the submitted entries are awaited
// together and finish records each one's result; every entry is answered
// on its own (writeResults, send as there). An entry start answers
// errAfter is started again once the others have finished: held, which
// start may fill, is new for each such round. The first entry of a round
// is never deferred, so there are at most as many rounds as entries.
func runBatch(w http.ResponseWriter, r *http.Request, run *running, body []byte, send bool,
	start func(raw []byte, out *entryResult, done func(result, error), held map[string]bool) error,
	finish func(out *entryResult, res result)) {
	entries, err := batchEntries(body)
	if err != nil {
		run.fail(w, err)
		return
	}
	out := make([]entryResult, len(entries))
	todo := make([]int, len(entries))
	for i := range todo {
		todo[i] = i
	}
	for len(todo) > 0 {
		wait := newOutcomes(len(entries))
		held := map[string]bool{}
		var later []int
		for _, i := range todo {
			switch err := start(entries[i], &out[i], wait.to(i), held); {
			case errors.Is(err, errAfter):
				later = append(later, i)
			case err != nil:
				out[i].err = newEntryError(err)
			default:
				wait.submitted(i)
			}
		}
		wait.each(r.Context(), func(i int, res result, err error) {
			if err != nil {
				out[i].err = newEntryError(err)
				return
			}
			finish(&out[i], res)
		})
		if err := r.Context().Err(); err != nil {
			for _, i := range later {
				out[i].err = newEntryError(err)
			}
			break
		}
		todo = later
	}
	writeResults(w, out, send)
}

// entryResult is a batch entry's answer: its message (0 if none: an
// entry that named no message, or a send refused), a send's duplicate,
// or its error.
type entryResult struct {
	id        uint64
	duplicate bool
	err       *entryError
}

// writeResults answers a batch: appendResults' JSON, in a buffer from
// answers.
func writeResults(w http.ResponseWriter, rs []entryResult, send bool) {
	bp := answers.Get().(*[]byte)
	defer answers.Put(bp)
	b := appendResults((*bp)[:0], rs, send)
	*bp = b[:0] // a Writer does not keep what it is given
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// appendResults appends a batch's answer, {"results":[...]} and a
// newline, as encoding/json writes it: an entry of a send batch is
// {"msg_id","duplicate"} or {"error"}, one of an ack batch
// {"msg_id"?,"error"?}. Only an error's message needs encoding/json's
// escaping. FuzzBatchResults checks it against encoding/json byte for
// byte.
func appendResults(b []byte, rs []entryResult, send bool) []byte {
	b = append(b, `{"results":[`...)
	for i, r := range rs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		if r.id != 0 && (!send || r.err == nil) {
			b = append(b, `"msg_id":"`...)
			b = append(appendHex16(b, r.id), '"')
			if send {
				b = strconv.AppendBool(append(b, `,"duplicate":`...), r.duplicate)
			}
		}
		if r.err != nil {
			if b[len(b)-1] != '{' {
				b = append(b, ',')
			}
			eb, _ := json.Marshal(r.err)
			b = append(append(b, `"error":`...), eb...)
		}
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// outcomes collects the outcomes of a batch's entries, each submitted to
// the committer before any is waited for: their callbacks send on one
// channel, buffered to the batch's size so that the committer never
// waits on it, and no entry needs a goroutine of its own.
type outcomes struct {
	ch      chan outcome
	pending []bool
	n       int
}

// outcome is entry i's result, a refusal by the rules as its error.
type outcome struct {
	i   int
	r   result
	err error
}

func newOutcomes(n int) *outcomes {
	return &outcomes{ch: make(chan outcome, n), pending: make([]bool, n)}
}

// to returns the callback of entry i's submission. Once the submission
// is taken (a refused one calls no callback), call submitted(i).
func (o *outcomes) to(i int) func(result, error) {
	return func(r result, err error) {
		if err == nil {
			err = r.err
		}
		o.ch <- outcome{i, r, err}
	}
}

// submitted counts entry i as taken by the committer.
func (o *outcomes) submitted(i int) {
	o.pending[i] = true
	o.n++
}

// each calls f with every submitted entry's outcome as it comes, until
// all have come or ctx ends (the host gave up; their groups may still
// commit): then with ctx's error for each entry still pending.
func (o *outcomes) each(ctx context.Context, f func(i int, r result, err error)) {
	for ; o.n > 0; o.n-- {
		select {
		case oc := <-o.ch:
			o.pending[oc.i] = false
			f(oc.i, oc.r, oc.err)
		case <-ctx.Done():
			for i, p := range o.pending {
				if p {
					f(i, result{}, ctx.Err())
				}
			}
			return
		}
	}
}
