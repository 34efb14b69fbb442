package main

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/tlog"

	"github.com/plughost/plughost/sdk/store"
	"github.com/plughost/plughost/sdk/store/storetest"
)

// TestCrash runs the store's crash suite against the registry's layout:
// group i proposes artifact {"i":i} and approves it by a and b, so that
// it commits version i+1; every tenth group also signs a checkpoint.
// Copies taken at random moments (as kill -9 leaves the files) hold HEAD,
// the entries, the tree, the proposals and the checkpoints of a prefix of
// the groups, consistent with each other.
func TestCrash(t *testing.T) {
	signer, _, err := loadSigner(t.TempDir(), "", "crash")
	if err != nil {
		t.Fatal(err)
	}
	r := rules{quorum: 2, ttl: time.Hour, origin: "crash", signer: signer}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	storetest.Crash(t, storeOpts, 8,
		func(tx *store.Tx, i int) error {
			h, err := decodeHead(tx.Get(bucketMeta, keyHead))
			if err != nil {
				return err
			}
			canon := fmt.Appendf(nil, `{"i":%d}`, i)
			d := digestOf(canon)
			id := fmt.Sprintf("%032x", i)
			ops := []op{{kind: opPropose, id: id, digest: d, artifact: canon}}
			for _, n := range []string{"a", "b"} {
				sig := base64.StdEncoding.EncodeToString(ed25519.Sign(key(n), d[:]))
				ops = append(ops, op{kind: opApprove, id: id, approval: approval{n, sig}})
			}
			if i%10 == 9 {
				ops = append(ops, op{kind: opCheckpoint})
			}
			_, err = r.apply(tx, now, h, ops)
			return err
		},
		func(s *store.Snapshot, acked int) error {
			h, err := decodeHead(s.Get(bucketMeta, keyHead))
			if err != nil {
				return err
			}
			n := int(h.Version)
			if n != acked && n != acked+1 {
				return fmt.Errorf("head at %d, want %d acknowledged (or one more, committing)", n, acked)
			}
			var v verifier
			for v.next = 1; v.next <= h.Version; {
				e := s.Get(bucketEntries, be64(v.next))
				var en entry
				if err := json.Unmarshal(e, &en); err != nil || string(en.Artifact) != fmt.Sprintf(`{"i":%d}`, v.next-1) {
					return fmt.Errorf("entry %d = %s, %v", v.next, e, err)
				}
				if err := checkEntry(s, &v); err != nil {
					return err
				}
				v.next++
			}
			if v.prev != h.Hash && n > 0 {
				return fmt.Errorf("head hash %x is not the last entry's %x", h.Hash, v.prev)
			}
			if n > 0 {
				if _, err := tlog.TreeHash(int64(n), hashReader{s}); err != nil {
					return fmt.Errorf("tree of size %d: %w", n, err)
				}
			}
			if ck := getU64(s, keyCheckpoint); ck > 0 {
				if err := checkTree(s, &signedCheckpoint{n: ck, note: s.Get(bucketCheckpoints, be64(ck))}); err != nil {
					return err
				}
			} else if n >= 10 {
				return fmt.Errorf("head at %d without the checkpoint of group 9", n)
			}
			return nil
		})
}
