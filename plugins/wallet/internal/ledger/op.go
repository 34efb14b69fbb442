package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/plughost/plughost/sdk/idem"
	"github.com/plughost/plughost/sdk/store"
)

// Kind is the kind of an operation.
type Kind uint8

// The operation kinds.
const (
	// KindIssue mints Amount into To; the supply grows.
	KindIssue Kind = iota + 1
	// KindTransfer moves Amount from From to To.
	KindTransfer
	// KindBurn destroys Amount held by From; the supply shrinks.
	KindBurn
	// KindBatch moves each leg's amount from From to the leg's To, all
	// legs or none, under one nonce.
	KindBatch
	// KindSweep deletes up to Limit expired idempotency records, oldest
	// first. It is the wallet's own upkeep, not a client's operation: it
	// has no receipt, no key, and is not in Kinds.
	KindSweep
)

// Kinds lists every kind of a client's operation, for metric labels and
// endpoints.
var Kinds = []Kind{KindIssue, KindTransfer, KindBurn, KindBatch}

// String returns the kind's lowercase name, as used in receipts and
// metric labels.
func (k Kind) String() string {
	switch k {
	case KindIssue:
		return "issue"
	case KindTransfer:
		return "transfer"
	case KindBurn:
		return "burn"
	case KindBatch:
		return "batch"
	case KindSweep:
		return "sweep"
	default:
		return fmt.Sprintf("kind(%d)", int(k))
	}
}

// debits reports whether the kind spends From's balance and nonce.
func (k Kind) debits() bool { return k == KindTransfer || k == KindBurn || k == KindBatch }

// Leg is one credit of a batch.
type Leg struct {
	To     string `json:"to"`
	Amount uint64 `json:"amount"`
}

// Op is one operation to commit. The caller validates its shape (ids,
// positive amounts, From != To, no overflowing leg sum); Apply checks it
// again and refuses a malformed one with ErrInvalid.
type Op struct {
	Kind   Kind
	From   string // transfer, burn, batch
	To     string // issue, transfer
	Amount uint64 // issue, transfer, burn; a batch's amount is the sum of its legs
	Nonce  uint64 // transfer, burn, batch: must be From's nonce + 1
	Legs   []Leg  // batch
	Limit  int    // sweep: the most records to delete
	// Idem, if set, makes the operation idempotent under Idem.Key: its
	// recorded outcome is stored with it, and a later operation with the
	// same unexpired key is not applied but answered with that record.
	Idem *Idem
}

// Idem is the idempotency key of an operation and the fingerprint of the
// request it came with.
type Idem struct {
	Key         string
	Fingerprint idem.Fingerprint
}

// Receipt is the proof of a committed operation.
type Receipt struct {
	TxID   string `json:"tx_id"`
	Kind   string `json:"kind"`
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Legs   []Leg  `json:"legs,omitempty"`
	Amount uint64 `json:"amount"`
	Nonce  uint64 `json:"nonce,omitempty"`
	// Seq is the receipt's position in the ledger: every receipt has a
	// distinct seq, in commit order, starting at 1.
	Seq         uint64    `json:"seq"`
	CommittedAt time.Time `json:"committed_at"`
}

// Accounts returns the accounts the receipt changed.
func (r *Receipt) Accounts() []string {
	out := make([]string, 0, 2+len(r.Legs))
	if r.From != "" {
		out = append(out, r.From)
	}
	if r.To != "" {
		out = append(out, r.To)
	}
	for _, l := range r.Legs {
		out = append(out, l.To)
	}
	return out
}

// TxID returns the transaction id of the receipt with sequence seq.
func TxID(seq uint64) string { return fmt.Sprintf("tx_%016x", seq) }

// ParseTxID returns the seq of a transaction id made by TxID.
func ParseTxID(id string) (uint64, bool) {
	var seq uint64
	if len(id) != 19 || id[:3] != "tx_" {
		return 0, false
	}
	for _, c := range id[3:] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = byte(c - '0')
		case c >= 'a' && c <= 'f':
			d = byte(c-'a') + 10
		default:
			return 0, false
		}
		seq = seq<<4 | uint64(d)
	}
	return seq, seq != 0
}

// Result is the outcome of one operation of Apply.
type Result struct {
	// Receipt is set when the operation committed.
	Receipt *Receipt
	// ReceiptJSON is the receipt's JSON as stored (Receipt.AppendJSON's
	// bytes), set by Apply with Receipt, for Options.Render and callers
	// that answer with it: they must not change it.
	ReceiptJSON []byte
	// Err is the ledger's refusal of the operation: an
	// *InsufficientFundsError, a *NonceError, ErrSupplyOverflow or
	// ErrInvalid. Nothing of a refused operation is applied.
	Err error
	// Record is the idempotency record of an operation with a key: the
	// one stored now for a committed or recorded refusal, or the earlier
	// one when Replayed. It is nil for an operation without a key and for
	// a refusal that is not recorded (Recorded).
	Record *Record
	// Replayed is true when an unexpired record for the key already
	// existed: the operation was not applied and Record is that record.
	Replayed bool
	// Sweep is true for a sweep's result (KindSweep), and Swept is how
	// many expired records it deleted.
	Sweep bool
	Swept int
}

// Record is a stored idempotency record: the request's fingerprint and the
// response it was answered with.
type Record struct {
	Fingerprint idem.Fingerprint
	Status      int
	Body        []byte
	Expires     time.Time
}

// Errors of Apply's per-operation results and of the lookups.
var (
	// ErrInsufficientFunds is wrapped by *InsufficientFundsError.
	ErrInsufficientFunds = errors.New("insufficient funds")
	// ErrNonceMismatch is wrapped by *NonceError.
	ErrNonceMismatch = errors.New("nonce mismatch")
	// ErrSupplyOverflow refuses an issue that would take the total issued
	// past the largest uint64.
	ErrSupplyOverflow = errors.New("issue would overflow the total supply")
	// ErrInvalid refuses an operation whose shape the caller should have
	// rejected (zero amount, From == To, bad kind, overflowing legs).
	ErrInvalid = errors.New("invalid operation")
	// ErrNotFound is returned by Receipt for an unknown transaction id.
	ErrNotFound = errors.New("not found")
	// ErrClosed is returned by every method after Close.
	ErrClosed = store.ErrClosed
	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = store.ErrLocked
	// ErrCorrupt is wrapped by the error of Open, or of any method, that
	// met damaged files or broken invariants (a *store.CorruptError).
	ErrCorrupt = store.ErrCorrupt
	// ErrFailed is wrapped by every write once a disk error has left the
	// files in a state the ledger cannot vouch for (Ledger.Err); Reopen
	// recovers from the write-ahead log.
	ErrFailed = store.ErrFailed
	// ErrOutcomeUnknown is wrapped by the error of a group that may or
	// may not have been committed: its log record could be neither
	// written for sure nor erased. A recovery may replay it.
	ErrOutcomeUnknown = store.ErrOutcomeUnknown
)

// InsufficientFundsError refuses a debit larger than the balance.
type InsufficientFundsError struct {
	Account string
	Balance uint64
	Needed  uint64
}

// Error names the account, its balance and the amount needed.
func (e *InsufficientFundsError) Error() string {
	return fmt.Sprintf("account %q holds %d, needs %d", e.Account, e.Balance, e.Needed)
}

// Unwrap returns ErrInsufficientFunds.
func (e *InsufficientFundsError) Unwrap() error { return ErrInsufficientFunds }

// NonceError refuses a debit whose nonce is not the account's nonce + 1.
type NonceError struct {
	Account  string
	Got      uint64
	Expected uint64
}

// Error names the account and the nonce it expects.
func (e *NonceError) Error() string {
	return fmt.Sprintf("account %q expects nonce %d, got %d", e.Account, e.Expected, e.Got)
}

// Unwrap returns ErrNonceMismatch.
func (e *NonceError) Unwrap() error { return ErrNonceMismatch }

// Recorded reports whether a result is stored under the operation's
// idempotency key: commits and the ledger's definite refusals
// (insufficient funds, supply overflow) are, so that a retry is told the
// same; a nonce mismatch or a malformed operation is not, so that the
// client can retry the key with a corrected request.
func Recorded(err error) bool {
	return err == nil || errors.Is(err, ErrInsufficientFunds) || errors.Is(err, ErrSupplyOverflow)
}

// Account is an account's state. An account that never received anything
// has balance 0 and nonce 0.
type Account struct {
	ID      string
	Balance uint64
	// Nonce counts the account's successful debits; its next debit must
	// carry Nonce + 1.
	Nonce uint64
}

// Supply is the ledger's totals. Issued − Burned is the supply, which
// equals the sum of all balances.
type Supply struct {
	Issued uint64
	Burned uint64
}

// Audit is the result of a full scan; see Ledger.Audit.
type Audit struct {
	Supply
	// Balances is the sum of all balances; it overflows only if the
	// invariant is already broken, which Overflow reports.
	Balances uint64
	Overflow bool
	Accounts int
	Receipts int
	Seq      uint64
}

// AppendJSON appends the receipt's JSON to b: the same bytes as
// json.Marshal(r), built without reflection because every commit encodes
// one receipt per operation inside its transaction.
func (r *Receipt) AppendJSON(b []byte) []byte {
	b = append(b, `{"tx_id":`...)
	b = appendJSONString(b, r.TxID)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, r.Kind)
	if r.From != "" {
		b = append(b, `,"from":`...)
		b = appendJSONString(b, r.From)
	}
	if r.To != "" {
		b = append(b, `,"to":`...)
		b = appendJSONString(b, r.To)
	}
	if len(r.Legs) > 0 {
		b = append(b, `,"legs":[`...)
		for i, l := range r.Legs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"to":`...)
			b = appendJSONString(b, l.To)
			b = append(b, `,"amount":`...)
			b = strconv.AppendUint(b, l.Amount, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"amount":`...)
	b = strconv.AppendUint(b, r.Amount, 10)
	if r.Nonce != 0 {
		b = append(b, `,"nonce":`...)
		b = strconv.AppendUint(b, r.Nonce, 10)
	}
	b = append(b, `,"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"committed_at":`...)
	b = appendJSONTime(b, r.CommittedAt)
	return append(b, '}')
}

// appendJSONString appends s as json.Marshal writes it. Account ids, kinds
// and transaction ids are plain ASCII, which is copied; anything else is
// left to encoding/json, escaping and all.
func appendJSONString(b []byte, s string) []byte {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON writes it, for
// years 0 to 9999 (which MarshalJSON alone accepts).
func appendJSONTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
