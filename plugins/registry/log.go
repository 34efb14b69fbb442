package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/plughost/plughost/sdk/store"
)

// storeFile is the store's file name in the data dir.
const storeFile = "registry.db"

// The store's buckets, by number.
const (
	// bucketMeta holds keyHead (version ‖ hash), keyCheckpoint (the size
	// of the latest signed checkpoint) and keyPruned (the first version
	// whose entry data is kept).
	bucketMeta = iota
	// bucketProposals maps a proposal id to its proposal, JSON.
	bucketProposals
	// bucketEntries maps a version (8 bytes, big-endian) to its entry,
	// JSON.
	bucketEntries
	// bucketHashes maps a stored-hash index of tlog (8 bytes) to the
	// 32-byte hash: the Merkle tree over the entry hashes, which proofs
	// and checkpoints read. Retention never deletes it.
	bucketHashes
	// bucketCheckpoints maps a tree size (8 bytes) to the signed note
	// of its checkpoint: one per size, never replaced.
	bucketCheckpoints
	// bucketExpiry indexes the proposals not yet committed by expiry:
	// the key is the expiry (unix ms, 8 bytes, big-endian) followed by
	// the proposal id, the value empty. The sweep reads it in key order,
	// so it reads only what has expired.
	bucketExpiry
)

var storeOpts = store.Options{Buckets: []store.Bucket{
	{Name: "meta"}, {Name: "proposals"}, {Name: "entries", Sequential: true},
	{Name: "hashes", Sequential: true}, {Name: "checkpoints", Sequential: true},
	{Name: "expiry", Sequential: true},
}}

var (
	keyHead       = []byte("head")
	keyCheckpoint = []byte("checkpoint")
	keyPruned     = []byte("pruned")
)

// maxArtifact is the largest canonical artifact.
const maxArtifact = 1 << 20

// head is HEAD: the version of the last entry (0 for an empty log) and
// its hash (zero for an empty log).
type head struct {
	Version uint64
	Hash    [32]byte
}

func (h head) encode() []byte { return append(be64(h.Version), h.Hash[:]...) }

func decodeHead(b []byte) (head, error) {
	var h head
	if b == nil {
		return h, nil
	}
	if len(b) != 40 {
		return h, fmt.Errorf("head: %d bytes, want 40: %w", len(b), store.ErrCorrupt)
	}
	h.Version = binary.BigEndian.Uint64(b)
	copy(h.Hash[:], b[8:])
	return h, nil
}

func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func getU64(r store.Reader, k []byte) uint64 {
	b := r.Get(bucketMeta, k)
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// approval is one approver's signature over a proposal's digest.
type approval struct {
	Approver  string `json:"approver"`
	Signature string `json:"signature"` // standard base64
}

// proposal is a stored proposal. Once committed it keeps only its digest,
// version and hash (the artifact and approvals are in the entry), so that
// a late approval still answers with the version.
type proposal struct {
	Digest    string          `json:"digest"` // lowercase hex
	Artifact  json.RawMessage `json:"artifact,omitempty"`
	Expires   int64           `json:"expires"` // unix ms
	Approvals []approval      `json:"approvals,omitempty"`
	Version   uint64          `json:"version,omitempty"` // set once committed
	Hash      string          `json:"hash,omitempty"`
}

// expiryKey is a proposal's key in bucketExpiry.
func expiryKey(expires int64, id string) []byte {
	return append(be64(uint64(expires)), id...)
}

// entry is a committed entry as stored and served. Its hash is BLAKE3 of
// the previous entry's hash (32 raw bytes) followed by canonicalEntry.
type entry struct {
	Version     uint64          `json:"version"`
	PrevHash    string          `json:"prev_hash"`
	Hash        string          `json:"hash"`
	Artifact    json.RawMessage `json:"artifact"`
	Approvals   []approval      `json:"approvals"`
	CommittedAt string          `json:"committed_at"` // RFC 3339, UTC
}

// canonicalEntry is the encoding of e that its hash covers: e without its
// hash, fields in a fixed order, no spaces.
func canonicalEntry(e entry) []byte {
	e.Hash = ""
	b, _ := marshal(struct {
		Version     uint64          `json:"version"`
		PrevHash    string          `json:"prev_hash"`
		Artifact    json.RawMessage `json:"artifact"`
		Approvals   []approval      `json:"approvals"`
		CommittedAt string          `json:"committed_at"`
	}{e.Version, e.PrevHash, e.Artifact, e.Approvals, e.CommittedAt})
	return b
}

// entryHash is the chain hash of e after prev.
func entryHash(prev [32]byte, e entry) [32]byte {
	h := blake3.New()
	h.Write(prev[:])
	h.Write(canonicalEntry(e))
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// marshal is json.Marshal without HTML escaping or a trailing newline.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// errNotObject is canonicalArtifact's refusal of anything but an object.
var errNotObject = errors.New("artifact must be a JSON object")

// canonicalArtifact returns the canonical encoding of a JSON object:
// object keys sorted (a repeated key keeps its last value), no
// insignificant space, no HTML escaping, numbers as written. Two
// encodings of the same object give the same bytes, and so one digest.
func canonicalArtifact(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("artifact: %w", err)
	}
	if dec.More() {
		return nil, errors.New("artifact: data after the value")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, errNotObject
	}
	return marshal(v)
}

// digestOf is the BLAKE3-256 of a canonical artifact.
func digestOf(canonical []byte) [32]byte { return blake3.Sum256(canonical) }

// hashReader reads the Merkle tree's stored hashes from r.
type hashReader struct{ r store.Reader }

func (h hashReader) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		b := h.r.Get(bucketHashes, be64(uint64(x)))
		if len(b) != tlog.HashSize {
			return nil, fmt.Errorf("stored hash %d missing: %w", x, store.ErrCorrupt)
		}
		copy(out[i][:], b)
	}
	return out, nil
}

// opKind is what an op does.
type opKind uint8

const (
	opPropose opKind = iota
	opApprove
	opCheckpoint
	opPrune
	opSweep
)

var opNames = [...]string{"propose", "approve", "checkpoint", "prune", "sweep"}

func (k opKind) String() string { return opNames[k] }

// op is one operation for the committer. Handlers have checked what they
// can without the store: the artifact's encoding, the approver and its
// signature.
type op struct {
	kind     opKind
	id       string   // proposal id
	digest   [32]byte // propose
	artifact []byte   // propose: canonical
	approval approval // approve
	below    uint64   // prune: prune versions below this one
}

// result is an op's outcome: an HTTP status with, for a refusal, its code
// and message.
type result struct {
	status  int
	code    string
	msg     string
	id      string
	digest  string
	head    head   // the entry this approval committed (or had), when committed
	fresh   bool   // this approval committed it
	entry   *entry // the committed entry, when fresh
	ckpt    []byte // checkpoint: the signed note
	ckptN   uint64 // checkpoint: its size
	pruned  uint64 // prune: the first version kept afterwards
	swept   int    // sweep: expired proposals deleted
	more    bool   // sweep: a whole batch was swept; more may have expired
	wrote   bool
	refusal bool
}

func refuse(status int, code, msg string) result {
	return result{status: status, code: code, msg: msg, refusal: true}
}

// errCAS is apply's error when the stored HEAD is not the head last
// committed: another writer moved it, which must never happen.
var errCAS = errors.New("head moved under the committer")

// rules are what apply needs besides the ops.
type rules struct {
	quorum int
	ttl    time.Duration
	origin string
	signer note.Signer
	keep   uint64 // retention: entries kept below the checkpoint
}

// apply applies ops in tx at now, from expected, the head last committed.
// It is the only code that writes HEAD, entries and the tree.
func (r rules) apply(tx *store.Tx, now time.Time, expected head, ops []op) ([]result, error) {
	h, err := decodeHead(tx.Get(bucketMeta, keyHead))
	if err != nil {
		return nil, err
	}
	if h != expected {
		return nil, fmt.Errorf("stored head %d, expected %d: %w", h.Version, expected.Version, errCAS)
	}
	out := make([]result, len(ops))
	for i, o := range ops {
		var res result
		switch o.kind {
		case opPropose:
			res, err = r.propose(tx, now, o)
		case opApprove:
			res, err = r.approve(tx, now, &h, o)
		case opCheckpoint:
			res, err = r.checkpoint(tx, h)
		case opPrune:
			res, err = r.prune(tx, o.below)
		case opSweep:
			res, err = r.sweep(tx, now)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.kind, err)
		}
		out[i] = res
	}
	return out, nil
}

func (r rules) propose(tx *store.Tx, now time.Time, o op) (result, error) {
	if tx.Get(bucketProposals, []byte(o.id)) != nil {
		return refuse(http.StatusConflict, "exists", "a proposal with this id exists"), nil
	}
	p := proposal{Digest: hex.EncodeToString(o.digest[:]), Artifact: o.artifact, Expires: now.Add(r.ttl).UnixMilli()}
	b, err := marshal(p)
	if err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketProposals, []byte(o.id), b); err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketExpiry, expiryKey(p.Expires, o.id), nil); err != nil {
		return result{}, err
	}
	return result{status: http.StatusAccepted, id: o.id, digest: p.Digest, wrote: true}, nil
}

func (r rules) approve(tx *store.Tx, now time.Time, h *head, o op) (result, error) {
	b := tx.Get(bucketProposals, []byte(o.id))
	if b == nil {
		return refuse(http.StatusNotFound, "not_found", "no such proposal"), nil
	}
	var p proposal
	if err := json.Unmarshal(b, &p); err != nil {
		return result{}, fmt.Errorf("proposal %q: %v: %w", o.id, err, store.ErrCorrupt)
	}
	res := result{status: http.StatusAccepted, id: o.id, digest: p.Digest}
	if p.Version != 0 {
		res.status = http.StatusOK
		res.head.Version = p.Version
		_, err := hex.Decode(res.head.Hash[:], []byte(p.Hash))
		return res, err
	}
	if slices.ContainsFunc(p.Approvals, func(a approval) bool { return a.Approver == o.approval.Approver }) {
		return res, nil // repeated: idempotent
	}
	if now.UnixMilli() >= p.Expires {
		return refuse(http.StatusGone, "expired", "the proposal expired before its quorum"), nil
	}
	p.Approvals = append(p.Approvals, o.approval)
	res.wrote = true
	if len(p.Approvals) >= r.quorum {
		e := entry{Version: h.Version + 1, PrevHash: hex.EncodeToString(h.Hash[:]), Artifact: p.Artifact,
			Approvals:   slices.SortedFunc(slices.Values(p.Approvals), func(a, b approval) int { return strings.Compare(a.Approver, b.Approver) }),
			CommittedAt: now.UTC().Format(time.RFC3339Nano)}
		hash := entryHash(h.Hash, e)
		e.Hash = hex.EncodeToString(hash[:])
		if err := appendEntry(tx, e, hash); err != nil {
			return result{}, err
		}
		*h = head{Version: e.Version, Hash: hash}
		if err := tx.Put(bucketMeta, keyHead, h.encode()); err != nil {
			return result{}, err
		}
		// Committed: the record keeps what a late approval is answered
		// with, and leaves the expiry index, so that no sweep deletes it.
		if err := tx.Delete(bucketExpiry, expiryKey(p.Expires, o.id)); err != nil {
			return result{}, err
		}
		p.Version, p.Hash, p.Artifact, p.Approvals = e.Version, e.Hash, nil, nil
		res.status, res.head, res.fresh, res.entry = http.StatusOK, *h, true, &e
	}
	nb, err := marshal(p)
	if err != nil {
		return result{}, err
	}
	return res, tx.Put(bucketProposals, []byte(o.id), nb)
}

// appendEntry writes e and its leaf of the Merkle tree (whose record data
// is the entry's 32-byte hash).
func appendEntry(tx *store.Tx, e entry, hash [32]byte) error {
	b, err := marshal(e)
	if err != nil {
		return err
	}
	if err := tx.Put(bucketEntries, be64(e.Version), b); err != nil {
		return err
	}
	n := int64(e.Version - 1)
	hs, err := tlog.StoredHashes(n, hash[:], hashReader{tx})
	if err != nil {
		return err
	}
	base := tlog.StoredHashIndex(0, n)
	for i, x := range hs {
		if err := tx.Put(bucketHashes, be64(uint64(base+int64(i))), x[:]); err != nil {
			return err
		}
	}
	return nil
}

// checkpointText is the C2SP tlog-checkpoint body for a tree.
func checkpointText(origin string, n uint64, root tlog.Hash) string {
	return fmt.Sprintf("%s\n%d\n%s\n", origin, n, base64.StdEncoding.EncodeToString(root[:]))
}

// checkpoint signs the tree at HEAD unless a checkpoint of that size is
// stored: then it returns that one, so that no size ever has two roots.
func (r rules) checkpoint(tx *store.Tx, h head) (result, error) {
	if h.Version == 0 {
		return result{status: http.StatusOK}, nil
	}
	if b := tx.Get(bucketCheckpoints, be64(h.Version)); b != nil {
		return result{status: http.StatusOK, ckpt: b, ckptN: h.Version}, nil
	}
	root, err := tlog.TreeHash(int64(h.Version), hashReader{tx})
	if err != nil {
		return result{}, err
	}
	signed, err := note.Sign(&note.Note{Text: checkpointText(r.origin, h.Version, root)}, r.signer)
	if err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketCheckpoints, be64(h.Version), signed); err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketMeta, keyCheckpoint, be64(h.Version)); err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, ckpt: signed, ckptN: h.Version, wrote: true}, nil
}

// pruneBatch is the most entries one prune op deletes.
const pruneBatch = 256

// prune deletes the data of up to pruneBatch entries below below, which
// retention has computed from a signed checkpoint; never HEAD, never the
// tree.
func (r rules) prune(tx *store.Tx, below uint64) (result, error) {
	from := max(getU64(tx, keyPruned), 1)
	if ck := getU64(tx, keyCheckpoint); below > ck {
		below = ck // never past what a checkpoint covers
	}
	to := min(below, from+pruneBatch)
	if to <= from {
		return result{status: http.StatusOK, pruned: from}, nil
	}
	if err := tx.DeleteRange(bucketEntries, be64(from), be64(to)); err != nil {
		return result{}, err
	}
	if err := tx.Put(bucketMeta, keyPruned, be64(to)); err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, pruned: to, wrote: true}, nil
}

// sweepBatch is the most expired proposals one sweep op deletes.
const sweepBatch = 256

// sweep deletes up to sweepBatch proposals that expired at or before now
// without committing, reading the expiry index from its start: it reads
// only expired proposals, however many are still pending. Committed
// proposals are not in the index and stay.
func (r rules) sweep(tx *store.Tx, now time.Time) (result, error) {
	var keys [][]byte
	tx.Ascend(bucketExpiry, nil, be64(uint64(now.UnixMilli())+1), func(k, _ []byte) bool {
		keys = append(keys, bytes.Clone(k))
		return len(keys) < sweepBatch
	})
	res := result{status: http.StatusOK, more: len(keys) == sweepBatch}
	for _, k := range keys {
		if len(k) <= 8 {
			return result{}, fmt.Errorf("expiry key %x: %w", k, store.ErrCorrupt)
		}
		id := k[8:]
		if b := tx.Get(bucketProposals, id); b != nil {
			var p proposal
			if err := json.Unmarshal(b, &p); err != nil {
				return result{}, fmt.Errorf("proposal %q: %v: %w", id, err, store.ErrCorrupt)
			}
			if p.Version == 0 {
				if err := tx.Delete(bucketProposals, id); err != nil {
					return result{}, err
				}
				res.swept++
			}
		}
		if err := tx.Delete(bucketExpiry, k); err != nil {
			return result{}, err
		}
		res.wrote = true
	}
	return res, nil
}
