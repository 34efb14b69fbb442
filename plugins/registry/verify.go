package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/plughost/plughost/sdk/store"
)

// verifySlice is the most entries the deep verifier checks per slice.
const verifySlice = 256

// verifier is the deep verifier's position: the next version to check and
// the hash of the one before it, when known.
type verifier struct {
	next     uint64
	prev     [32]byte
	havePrev bool
}

// verify is the deep verifier: every tick it re-checks one slice of the
// chain (each entry's hash, its link to the previous one, its leaf in the
// tree) and, at the end of a pass, the tree's root against the latest
// signed checkpoint. A mismatch is counted and logged, and makes the
// registry write-unready; reads go on.
func (run *running) verify(ctx context.Context, every time.Duration) {
	var v verifier
	tick(ctx, every, func() {
		if err := run.verifySlice(&v); err != nil {
			run.m.verifyErr.Inc()
			msg := err.Error()
			run.corrupt.Store(&msg)
			run.logger.Error("deep verifier found a mismatch; refusing writes", "error", err)
		}
	})
}

// verifySlice checks the next slice; at the end of a pass it checks the
// checkpoint and starts the next pass.
func (run *running) verifySlice(v *verifier) error {
	h := *run.head.Load()
	first := run.pruned.Load()
	if v.next < first {
		v.next, v.havePrev = first, false
	}
	if v.next > h.Version {
		v.next, v.havePrev = first, false
		if ck := run.ckpt.Load(); ck != nil {
			return run.db.View(func(sn *store.Snapshot) error { return checkTree(sn, ck) })
		}
		return nil
	}
	return run.db.View(func(sn *store.Snapshot) error {
		for end := min(h.Version, v.next+verifySlice-1); v.next <= end; v.next++ {
			if err := checkEntry(sn, v); err != nil {
				v.next++
				v.havePrev = false
				return err
			}
		}
		return nil
	})
}

// checkEntry checks entry v.next and records its hash in v.
func checkEntry(sn *store.Snapshot, v *verifier) error {
	b := sn.Get(bucketEntries, be64(v.next))
	if b == nil {
		return fmt.Errorf("entry %d missing", v.next)
	}
	var e entry
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("entry %d: %w", v.next, err)
	}
	var prev, hash [32]byte
	if _, err := hex.Decode(prev[:], []byte(e.PrevHash)); err != nil || len(e.PrevHash) != 64 {
		return fmt.Errorf("entry %d: bad prev_hash", v.next)
	}
	switch {
	case e.Version != v.next:
		return fmt.Errorf("entry %d says version %d", v.next, e.Version)
	case v.havePrev && prev != v.prev:
		return fmt.Errorf("entry %d: prev_hash is not the hash of entry %d", v.next, v.next-1)
	}
	hash = entryHash(prev, e)
	if hex.EncodeToString(hash[:]) != e.Hash {
		return fmt.Errorf("entry %d: hash does not match its contents", v.next)
	}
	leaf, err := hashReader{sn}.ReadHashes([]int64{tlog.StoredHashIndex(0, int64(v.next-1))})
	if err != nil {
		return fmt.Errorf("entry %d: %w", v.next, err)
	}
	if leaf[0] != tlog.RecordHash(hash[:]) {
		return fmt.Errorf("entry %d: tree leaf does not match its hash", v.next)
	}
	v.prev, v.havePrev = hash, true
	return nil
}

// checkTree checks that the stored tree at the checkpoint's size has the
// root the checkpoint signed.
func checkTree(sn *store.Snapshot, ck *signedCheckpoint) error {
	_, root, err := parseCheckpoint(ck.note)
	if err != nil {
		return err
	}
	got, err := tlog.TreeHash(int64(ck.n), hashReader{sn})
	if err != nil {
		return fmt.Errorf("tree of checkpoint %d: %w", ck.n, err)
	}
	if got != root {
		return fmt.Errorf("tree of size %d does not have the root its checkpoint signed", ck.n)
	}
	return nil
}

// parseCheckpoint reads the size and root of a signed checkpoint's body
// (origin, size and root lines; the signatures follow a blank line).
func parseCheckpoint(signed []byte) (uint64, tlog.Hash, error) {
	var root tlog.Hash
	body, _, _ := bytes.Cut(signed, []byte("\n\n"))
	lines := strings.Split(string(body), "\n")
	if len(lines) < 3 {
		return 0, root, fmt.Errorf("checkpoint: %d lines: %w", len(lines), store.ErrCorrupt)
	}
	n, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		return 0, root, fmt.Errorf("checkpoint size: %w", err)
	}
	b, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(b) != tlog.HashSize {
		return 0, root, fmt.Errorf("checkpoint root: %w", store.ErrCorrupt)
	}
	copy(root[:], b)
	return n, root, nil
}
