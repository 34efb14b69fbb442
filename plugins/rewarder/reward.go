package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strings"
	"sync"

	"github.com/zeebo/blake3"

	"github.com/plughost/plughost/sdk"
)

// codeVersion names the reward computation and the artifact format. It
// changes whenever the same sealed inputs could give other bytes.
const codeVersion = "rewarder/1"

// maxAccountLen is the longest account id, in bytes (the wallet's limit).
const maxAccountLen = 128

// Contribution is one recipient's weight in an epoch.
type Contribution struct {
	Account string `json:"account"`
	Weight  uint64 `json:"weight"`
}

// Inputs are the body of a compute request.
type Inputs struct {
	PoolAccount   string         `json:"pool_account"`
	PoolAmount    uint64         `json:"pool_amount"`
	Contributions []Contribution `json:"contributions"`
}

// FieldError is an input refused before any work, naming its field.
type FieldError struct {
	Field   string
	Message string
	Err     error // the reader's or the decoder's, if any
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Unwrap returns the reader's or the decoder's error.
func (e *FieldError) Unwrap() error { return e.Err }

// decodeInputs decodes and validates a compute body: one JSON object with
// exactly the fields of Inputs, at most maxContributions contributions,
// account ids the wallet accepts, positive weights and pool amount that
// fit in uint64. Duplicate accounts pass: the computation quarantines
// them, as the issue asks.
func decodeInputs(r io.Reader, maxContributions int) (Inputs, error) {
	var in Inputs
	// A contribution's value of the wrong type: encoding/json names its
	// field without the index, and decodes on, leaving the value zero.
	// The checks below then find the first contribution with a zero
	// value, and say what it was.
	var elemType map[string]string // field of a contribution → the type error's message
	if err := sdk.DecodeJSON(r, &in); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && strings.HasPrefix(te.Field, "contributions."):
			elemType = map[string]string{strings.TrimPrefix(te.Field, "contributions."): "must be a " + te.Type.String() + ", got " + te.Value}
		case errors.As(err, &te) && te.Field != "":
			return in, &FieldError{Field: te.Field, Message: "must be a " + te.Type.String() + ", got " + te.Value}
		case errors.Is(err, sdk.ErrTrailingData):
			return in, &FieldError{Field: "body", Message: "one JSON object, and nothing after it"}
		default:
			return in, &FieldError{Field: "body", Message: err.Error(), Err: err}
		}
	}
	if err := validAccount(in.PoolAccount); err != nil {
		return in, &FieldError{Field: "pool_account", Message: err.Error()}
	}
	if in.PoolAmount == 0 {
		return in, &FieldError{Field: "pool_amount", Message: "must be a positive integer"}
	}
	if len(in.Contributions) > maxContributions {
		return in, &FieldError{Field: "contributions", Message: fmt.Sprintf("at most %d, got %d", maxContributions, len(in.Contributions))}
	}
	for i, c := range in.Contributions {
		if msg, ok := elemType["account"]; ok && c.Account == "" {
			return in, &FieldError{Field: fmt.Sprintf("contributions[%d].account", i), Message: msg}
		}
		if err := validAccount(c.Account); err != nil {
			return in, &FieldError{Field: fmt.Sprintf("contributions[%d].account", i), Message: err.Error()}
		}
		if c.Account == in.PoolAccount {
			return in, &FieldError{Field: fmt.Sprintf("contributions[%d].account", i), Message: "the pool account cannot receive from itself"}
		}
		if c.Weight == 0 {
			msg, ok := elemType["weight"]
			if !ok {
				msg = "must be a positive integer"
			}
			return in, &FieldError{Field: fmt.Sprintf("contributions[%d].weight", i), Message: msg}
		}
	}
	for field, msg := range elemType { // not met above: an element of another kind
		return in, &FieldError{Field: "contributions[]." + field, Message: msg}
	}
	return in, nil
}

// validAccount applies the wallet's account grammar: 1 to 128 of
// A-Z a-z 0-9 _ . : -.
func validAccount(s string) error {
	if s == "" || len(s) > maxAccountLen {
		return fmt.Errorf("must be 1 to %d bytes", maxAccountLen)
	}
	for i := range len(s) {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_.:-", c) >= 0) {
			return errors.New("may hold only A-Z a-z 0-9 _ . : -")
		}
	}
	return nil
}

// validEpoch says whether id can name an epoch: it becomes a directory
// name and part of the wallet's idempotency keys.
func validEpoch(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// sealed is the canonical encoding of an epoch's inputs: contributions
// sorted by account (then weight), so that the order a client sends
// them in does not change the seal.
type sealed struct {
	Version       string         `json:"version"`
	Epoch         string         `json:"epoch"`
	PoolAccount   string         `json:"pool_account"`
	PoolAmount    uint64         `json:"pool_amount"`
	Contributions []Contribution `json:"contributions"`
}

// seal returns the canonical bytes of an epoch's inputs and their
// BLAKE3 hash in hex (inputs_hash).
func seal(epoch string, in Inputs) ([]byte, string) {
	cs := slices.Clone(in.Contributions)
	slices.SortFunc(cs, func(a, b Contribution) int {
		if c := strings.Compare(a.Account, b.Account); c != 0 {
			return c
		}
		switch {
		case a.Weight < b.Weight:
			return -1
		case a.Weight > b.Weight:
			return 1
		}
		return 0
	})
	if cs == nil {
		cs = []Contribution{}
	}
	b, _ := json.Marshal(sealed{Version: codeVersion, Epoch: epoch, PoolAccount: in.PoolAccount, PoolAmount: in.PoolAmount, Contributions: cs})
	return b, hash(b)
}

func hash(b []byte) string {
	h := blake3.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Quarantine reasons of the computation.
const (
	reasonZeroWeight   = "zero_total_weight"
	reasonOverflow     = "overflow"
	reasonDuplicate    = "duplicate_account"
	reasonConservation = "conservation_failed"
)

// quarantineError is a computation that must not be settled.
type quarantineError struct{ reason, detail string }

func (e *quarantineError) Error() string { return e.reason + ": " + e.detail }

// Payout is one recipient's reward.
type Payout struct {
	Account string `json:"account"`
	Amount  uint64 `json:"amount"`
}

// tamper, if set by a test, changes the payouts before the conservation
// check, to stand in for a defect in the computation.
var tamper func([]Payout)

// compute is the reward function, pure: payout_i = floor(pool × w_i / W),
// plus one unit for each of the (pool − Σ floors) largest remainders,
// ties by account id, so that Σ payouts = pool exactly. cs must be sorted
// by account (as sealed). workers splits the floors across goroutines;
// the result does not depend on it. A zero total weight, a total weight
// past uint64, a duplicate account or a failed conservation check give a
// *quarantineError.
func compute(pool uint64, cs []Contribution, workers int) ([]Payout, error) {
	if len(cs) == 0 {
		return nil, &quarantineError{reasonZeroWeight, "no contributions"}
	}
	var total uint64
	for i, c := range cs {
		if i > 0 && cs[i-1].Account == c.Account {
			return nil, &quarantineError{reasonDuplicate, fmt.Sprintf("account %q appears more than once", c.Account)}
		}
		var carry uint64
		total, carry = bits.Add64(total, c.Weight, 0)
		if carry != 0 {
			return nil, &quarantineError{reasonOverflow, "the total weight exceeds 2^64-1"}
		}
	}
	if total == 0 {
		return nil, &quarantineError{reasonZeroWeight, "the total weight is 0"}
	}
	out := make([]Payout, len(cs))
	rem := make([]uint64, len(cs))
	workers = max(1, min(workers, len(cs)))
	chunk := (len(cs) + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < len(cs); lo += chunk {
		hi := min(lo+chunk, len(cs))
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				// pool × w ≤ pool × W, so the quotient fits in 64 bits
				// and Div64 cannot panic.
				h, l := bits.Mul64(pool, cs[i].Weight)
				q, r := bits.Div64(h, l, total)
				out[i] = Payout{Account: cs[i].Account, Amount: q}
				rem[i] = r
			}
		})
	}
	wg.Wait()
	var floors uint64
	for _, p := range out {
		floors += p.Amount // ≤ pool
	}
	rest := pool - floors // < len(cs)
	if rest > 0 {
		idx := make([]int, len(cs))
		for i := range idx {
			idx[i] = i
		}
		// cs is sorted by account, so a stable sort by remainder keeps
		// ties in account order.
		slices.SortStableFunc(idx, func(a, b int) int {
			switch {
			case rem[a] > rem[b]:
				return -1
			case rem[a] < rem[b]:
				return 1
			}
			return 0
		})
		for _, i := range idx[:rest] {
			out[i].Amount++
		}
	}
	if tamper != nil {
		tamper(out)
	}
	var sum uint64
	for _, p := range out {
		var carry uint64
		sum, carry = bits.Add64(sum, p.Amount, 0)
		if carry != 0 {
			return nil, &quarantineError{reasonConservation, "the payouts overflow"}
		}
	}
	if sum != pool {
		return nil, &quarantineError{reasonConservation, fmt.Sprintf("payouts add up to %d, pool is %d", sum, pool)}
	}
	return out, nil
}

// runFile is the artifact run.json. The commitment is BLAKE3 over the same
// encoding with Commitment empty (and so absent).
type runFile struct {
	Epoch       string   `json:"epoch"`
	InputsHash  string   `json:"inputs_hash"`
	CodeVersion string   `json:"code_version"`
	PoolAccount string   `json:"pool_account"`
	PoolAmount  uint64   `json:"pool_amount"`
	Payouts     []Payout `json:"payouts"`
	Commitment  string   `json:"commitment,omitempty"`
}

// artifacts returns run.json and the commitment file of a computed run.
func artifacts(epoch, inputsHash string, in Inputs, payouts []Payout) (runJSON []byte, commitment string) {
	r := runFile{Epoch: epoch, InputsHash: inputsHash, CodeVersion: codeVersion, PoolAccount: in.PoolAccount, PoolAmount: in.PoolAmount, Payouts: payouts}
	canonical, _ := json.Marshal(r)
	r.Commitment = hash(canonical)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	_ = enc.Encode(r)
	return buf.Bytes(), r.Commitment
}
