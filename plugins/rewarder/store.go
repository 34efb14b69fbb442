package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/plughost/plughost/sdk/store"
)

// storeFile is the store's file in the plugin's data directory.
const storeFile = "rewarder.db"

// The store's buckets, by number (never reorder): epochs holds each
// epoch's record (JSON, under its id), inputs its sealed inputs (the
// canonical bytes, under its id), and outbox its settlement parts (under
// id, 0, part as 4 bytes big-endian), written in the same group as the
// state change that creates them.
const (
	bucketEpochs = iota
	bucketInputs
	bucketOutbox
)

var storeOpts = store.Options{Buckets: []store.Bucket{{Name: "epochs"}, {Name: "inputs"}, {Name: "outbox", Sequential: true}}}

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

func putEpoch(tx *store.Tx, e epoch) error {
	b, _ := json.Marshal(e)
	return tx.Put(bucketEpochs, []byte(e.Epoch), b)
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
