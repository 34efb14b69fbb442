package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/plughost/plughost/plugins/wallet/internal/ledger"
)

// stream serves GET /v1/events: the receipts committed from now on, as
// server-sent events, in seq order:
//
//	id: 42
//	event: receipt
//	data: {"tx_id":"tx_000000000000002a",...}
//
// A client reconnecting with Last-Event-ID: N (as EventSource does) first
// gets the receipts after N from the ledger, at most Options.Backfill of
// them, and then the live ones, without duplicates.
//
// The stream is lossy by design: a client that reads too slowly loses the
// oldest receipts its buffer (events_buffer) cannot hold, and is told
// before the next receipt it gets:
//
//	event: lagged
//	data: {"dropped":17}
//
// Lost receipts can be fetched with GET /v1/receipts/{tx_id}, or by
// reconnecting with Last-Event-ID. Idle streams get a comment line every
// KeepAlive. The stream ends when the client goes away or the plugin
// drains.
func (a *API) stream(w http.ResponseWriter, r *http.Request) {
	if err := checkNoQuery(r.URL.RawQuery); err != nil {
		a.writeError(w, err)
		return
	}
	after, resume, err := lastEventID(r.Header)
	if head := a.ledger.Seq(); err == nil && after > head {
		// Seqs are sent only once committed, and the ledger's only grow:
		// the client followed another ledger, or this one before it was
		// restored, and would wait forever for receipts up to its id. A
		// 4xx ends an EventSource's reconnecting.
		err = fmt.Errorf("Last-Event-ID %d is past the ledger's last seq, %d: %w", after, head, errAheadOfHead)
	}
	if err != nil {
		a.writeError(w, err)
		return
	}
	// Subscribe before reading the backlog, so that nothing committed
	// in between is missed; what arrives twice is skipped by seq.
	sub := a.events.Subscribe()
	defer sub.Close()
	var backlog []*ledger.Receipt
	var skipped uint64
	if resume {
		if backlog, skipped, err = a.backlog(after); err != nil {
			a.writeError(w, err)
			return
		}
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	// Send the head at once, so the client knows it is subscribed.
	if _, err := fmt.Fprint(w, ": subscribed\n\n"); err != nil {
		return
	}
	last := after
	if err := writeEvents(w, backlog, skipped, &last); err != nil || rc.Flush() != nil {
		return
	}
	keepAlive := time.NewTicker(a.keepAlive)
	defer keepAlive.Stop()
	var buf []*ledger.Receipt
	for {
		select {
		case <-r.Context().Done():
			return
		case <-a.drain:
			return
		case <-keepAlive.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		case <-sub.Ready():
			var lagged uint64
			buf, lagged = sub.Take(buf[:0])
			if err := writeEvents(w, buf, lagged, &last); err != nil {
				return
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// lastEventID parses the Last-Event-ID header of a reconnecting client.
func lastEventID(h http.Header) (seq uint64, ok bool, err error) {
	vs := h.Values("Last-Event-ID")
	if len(vs) == 0 || len(vs) == 1 && vs[0] == "" {
		return 0, false, nil
	}
	if len(vs) > 1 {
		return 0, false, invalidf("Last-Event-ID must be given once")
	}
	v := vs[0]
	seq, err = strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, invalidf("Last-Event-ID must be the seq of a receipt event")
	}
	return seq, true, nil
}

// backlog returns the committed receipts after seq, at most a.backfill of
// the newest, and how many older ones it skipped.
func (a *API) backlog(after uint64) ([]*ledger.Receipt, uint64, error) {
	head := a.ledger.Seq()
	if after >= head {
		return nil, 0, nil
	}
	var skipped uint64
	if head-after > uint64(a.backfill) {
		skipped = head - after - uint64(a.backfill)
		after = head - uint64(a.backfill)
	}
	rs, err := a.ledger.Receipts(after, a.backfill)
	if err != nil {
		return nil, 0, err
	}
	out := make([]*ledger.Receipt, len(rs))
	for i := range rs {
		out[i] = &rs[i]
	}
	return out, skipped, nil
}

// writeEvents writes a lag report, if any, and then the receipts after
// *last, moving *last on. A write error means the client is gone.
func writeEvents(w http.ResponseWriter, rs []*ledger.Receipt, lagged uint64, last *uint64) error {
	if lagged > 0 {
		if _, err := fmt.Fprintf(w, "event: lagged\ndata: {\"dropped\":%d}\n\n", lagged); err != nil {
			return err
		}
	}
	for _, rc := range rs {
		if rc.Seq <= *last {
			continue // already sent from the backlog
		}
		b, err := json.Marshal(rc)
		if err != nil {
			return fmt.Errorf("encode receipt %d: %w", rc.Seq, err)
		}
		if _, err := fmt.Fprintf(w, "id: %d\nevent: receipt\ndata: %s\n\n", rc.Seq, b); err != nil {
			return err
		}
		*last = rc.Seq
	}
	return nil
}
