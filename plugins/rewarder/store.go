package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/plughost/plughost/sdk/store"
)

// storeFile is the store's file in the plugin's data directory.
const storeFile = "rewarder.db"

// The store's buckets, by number (never reorder): epochs holds each
// epoch's record (JSON, under its id), inputs its sealed inputs (the
// canonical bytes, under its id), and outbox its settlement parts (under
// id, 0, part as 4 bytes big-endian), written in the same group as the
// state change that creates them. Two indexes, which putEpoch keeps in
// the group of every state change: pending holds the ids of the epochs
// that wait for work (queued, computing, computed, settling), which the
// rescanner reads instead of every epoch; settled holds the settled
// epochs not yet pruned, under their settled_at (8 bytes big-endian, Unix
// nanoseconds) and id, oldest first. meta holds keyIndexed once the
// indexes cover every epoch.
const (
	bucketEpochs = iota
	bucketInputs
	bucketOutbox
	bucketPending
	bucketSettled
	bucketMeta
)

var storeOpts = store.Options{Buckets: []store.Bucket{{Name: "epochs"}, {Name: "inputs"}, {Name: "outbox", Sequential: true},
	{Name: "pending"}, {Name: "settled", Sequential: true}, {Name: "meta"}}}

// keyIndexed, in meta, says that pending and settled cover every stored
// epoch; a store written before them has not, and index builds them once.
var keyIndexed = []byte("indexed")

// Epoch states.
const (
	stateQueued      = "queued"
	stateComputing   = "computing"
	stateComputed    = "computed"
	stateSettling    = "settling"
	stateSettled     = "settled"
	stateQuarantined = "quarantined"
)

var states = []string{stateQueued, stateComputing, stateComputed, stateSettling, stateSettled, stateQuarantined}

// epoch is an epoch's record, and its manifest on GET.
type epoch struct {
	Epoch        string     `json:"epoch"`
	State        string     `json:"state"`
	InputsHash   string     `json:"inputs_hash"`
	Commitment   string     `json:"commitment,omitempty"`
	PoolAccount  string     `json:"pool_account"`
	PoolAmount   uint64     `json:"pool_amount"`
	Recipients   int        `json:"recipients"`
	PayoutsTotal uint64     `json:"payouts_total"`
	Reason       string     `json:"reason,omitempty"`
	Settlement   settlement `json:"settlement"`
	CodeVersion  string     `json:"code_version"`
	// Generation is the idempotency keys' generation: it changes only
	// when the wallet definitively refused a part and the operator asked
	// for a retry.
	Generation int `json:"generation"`
	// SettledAt is when the last part settled; retention counts from it.
	SettledAt *time.Time `json:"settled_at,omitempty"`
	// Pruned is set once retention has passed: the sealed inputs, the
	// outbox and the artifacts are gone; the record stays, so that the
	// epoch is never computed or paid again.
	Pruned bool `json:"pruned,omitempty"`
}

// waiting reports whether an epoch in state waits for a worker or an
// emitter: the states the pending index holds.
func waiting(state string) bool {
	switch state {
	case stateQueued, stateComputing, stateComputed, stateSettling:
		return true
	}
	return false
}

type settlement struct {
	Parts        int `json:"parts"`
	SettledParts int `json:"settled_parts"`
	Attempts     int `json:"attempts"`
}

// Leg is one transfer of a batch part.
type Leg struct {
	To     string `json:"to"`
	Amount uint64 `json:"amount"`
}

// part is one outbox entry: a wallet batch with the key and nonce it is
// sent with. The key and the nonce are stored before the first attempt,
// so that every retry, also after a restart, sends the same request.
type part struct {
	Key     string `json:"key"`
	Nonce   uint64 `json:"nonce,omitempty"` // 0 until chosen
	Settled bool   `json:"settled,omitempty"`
	Legs    []Leg  `json:"legs"`
}

// reader is what both a Tx and a Snapshot read.
type reader interface {
	Get(b int, k []byte) []byte
	Ascend(b int, from, to []byte, fn func(k, v []byte) bool)
}

func getEpoch(r reader, id string) (epoch, bool, error) {
	v := r.Get(bucketEpochs, []byte(id))
	if v == nil {
		return epoch{}, false, nil
	}
	var e epoch
	if err := json.Unmarshal(v, &e); err != nil {
		return e, false, fmt.Errorf("decode epoch %q: %w", id, err)
	}
	return e, true, nil
}

// putEpoch stores e and keeps the pending and settled indexes in the
// same group.
func putEpoch(tx *store.Tx, e epoch) error {
	b, _ := json.Marshal(e)
	id := []byte(e.Epoch)
	err := tx.Put(bucketEpochs, id, b)
	if err == nil && waiting(e.State) {
		err = tx.Put(bucketPending, id, []byte(e.State))
	} else if err == nil {
		err = tx.Delete(bucketPending, id)
	}
	if err == nil && e.State == stateSettled && e.SettledAt != nil {
		if e.Pruned {
			err = tx.Delete(bucketSettled, settledKey(*e.SettledAt, e.Epoch))
		} else {
			err = tx.Put(bucketSettled, settledKey(*e.SettledAt, e.Epoch), id)
		}
	}
	return err
}

// settledKey is the settled index's key of epoch id settled at t.
func settledKey(t time.Time, id string) []byte {
	return append(binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())), id...)
}

// index builds the pending and settled indexes of a store written before
// them, once: at start, before the committer takes the store's writes.
// Epochs settled before it count as settled now.
func index(db *store.DB, now time.Time) error {
	return db.Update(func(tx *store.Tx) error {
		if tx.Get(bucketMeta, keyIndexed) != nil {
			return nil
		}
		var es []epoch
		var err error
		tx.Ascend(bucketEpochs, nil, nil, func(k, _ []byte) bool {
			var e epoch
			e, _, err = getEpoch(tx, string(k))
			es = append(es, e)
			return err == nil
		})
		for _, e := range es {
			if err != nil {
				break
			}
			if e.State == stateSettled && e.SettledAt == nil {
				e.SettledAt = &now
			}
			err = putEpoch(tx, e)
		}
		if err != nil {
			return fmt.Errorf("index the stored epochs: %w", err)
		}
		return tx.Put(bucketMeta, keyIndexed, []byte{1})
	})
}

func partKey(id string, i int) []byte {
	k := make([]byte, 0, len(id)+5)
	k = append(k, id...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint32(k, uint32(i))
}

func getPart(r reader, id string, i int) (part, error) {
	var p part
	v := r.Get(bucketOutbox, partKey(id, i))
	if v == nil {
		return p, fmt.Errorf("epoch %q has no outbox part %d", id, i)
	}
	if err := json.Unmarshal(v, &p); err != nil {
		return p, fmt.Errorf("decode outbox part %d of %q: %w", i, id, err)
	}
	return p, nil
}

func putPart(tx *store.Tx, id string, i int, p part) error {
	b, _ := json.Marshal(p)
	return tx.Put(bucketOutbox, partKey(id, i), b)
}

// idemKey is part i's Idempotency-Key in generation gen.
func idemKey(id string, gen, i int) string { return fmt.Sprintf("rewarder:%s:%d:%d", id, gen, i) }

// getInputs returns an epoch's sealed inputs, decoded, once their hash
// is the one recorded when they were sealed.
func getInputs(r reader, id, inputsHash string) (sealed, error) {
	var s sealed
	v := r.Get(bucketInputs, []byte(id))
	if v == nil {
		return s, fmt.Errorf("epoch %q has no sealed inputs", id)
	}
	if h := hash(v); h != inputsHash {
		return s, fmt.Errorf("the sealed inputs of %q hash to %s, sealed as %s", id, h, inputsHash)
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return s, fmt.Errorf("decode the sealed inputs of %q: %w", id, err)
	}
	return s, nil
}
