package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// openCheckpoint verifies a signed checkpoint with note.Open against the
// published key and returns its size and root.
func openCheckpoint(t *testing.T, h http.Handler, signed string) (uint64, tlog.Hash) {
	t.Helper()
	_, vkey := call(t, h, "GET", "/v1/key", "")
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		t.Fatalf("verifier key %q: %v", vkey, err)
	}
	n, err := note.Open([]byte(signed), note.VerifierList(v))
	if err != nil {
		t.Fatalf("note.Open(%q): %v", signed, err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) != 4 || lines[0] != "plughost-registry" || lines[3] != "" {
		t.Fatalf("checkpoint text %q, want origin, size and root lines", n.Text)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var root tlog.Hash
	b, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(b) != 32 {
		t.Fatalf("root %q: %v", lines[2], err)
	}
	copy(root[:], b)
	return size, root
}

func decodeProof(t *testing.T, body string) (proofJSON, []tlog.Hash) {
	t.Helper()
	var p proofJSON
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("proof %s: %v", body, err)
	}
	hs := make([]tlog.Hash, len(p.Proof))
	for i, s := range p.Proof {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) != 32 {
			t.Fatalf("proof hash %q: %v", s, err)
		}
		copy(hs[i][:], b)
	}
	return p, hs
}

// TestCheckpointsAndProofs signs checkpoints at two sizes, opens them with
// note.Open, and checks every inclusion proof with tlog.CheckRecord and
// the consistency proof with tlog.CheckTree against the signed roots.
func TestCheckpointsAndProofs(t *testing.T) {
	dir := t.TempDir()
	rg := &registry{}
	h := serveDir(t, newDefinition(rg), dir, `checkpoint_interval = "24h"`)
	if code, _ := call(t, h, "GET", "/v1/checkpoint", ""); code != 404 {
		t.Errorf("checkpoint of an empty log = %d, want 404", code)
	}
	hashes := map[uint64]string{}
	for i := range 7 { // 7 is not a power of two: the tree has a ragged edge
		hashes[uint64(i+1)] = commit(t, h, fmt.Sprintf(`{"i":%d}`, i)).Hash
	}
	code, ck7 := call(t, h, "POST", "/v1/checkpoint", "")
	if code != 200 {
		t.Fatalf("sign checkpoint = %d %s", code, ck7)
	}
	if _, again := call(t, h, "POST", "/v1/checkpoint", ""); again != ck7 {
		t.Errorf("second checkpoint at size 7 differs:\n%s\nvs\n%s", again, ck7)
	}
	if _, got := call(t, h, "GET", "/v1/checkpoint", ""); got != ck7 {
		t.Errorf("GET /v1/checkpoint = %q, want the signed %q", got, ck7)
	}
	n7, root7 := openCheckpoint(t, h, ck7)
	if n7 != 7 {
		t.Fatalf("checkpoint size %d, want 7", n7)
	}
	for i := range 6 {
		hashes[uint64(i+8)] = commit(t, h, fmt.Sprintf(`{"j":%d}`, i)).Hash
	}
	_, ck13 := call(t, h, "POST", "/v1/checkpoint", "")
	n13, root13 := openCheckpoint(t, h, ck13)
	if n13 != 13 {
		t.Fatalf("checkpoint size %d, want 13", n13)
	}
	for _, tree := range []struct {
		n    uint64
		root tlog.Hash
	}{{7, root7}, {13, root13}} {
		for v := uint64(1); v <= tree.n; v++ {
			code, body := call(t, h, "GET", fmt.Sprintf("/v1/proof/inclusion?version=%d&size=%d", v, tree.n), "")
			if code != 200 {
				t.Fatalf("inclusion %d in %d = %d %s", v, tree.n, code, body)
			}
			_, proof := decodeProof(t, body)
			leaf, _ := hex.DecodeString(hashes[v])
			if err := tlog.CheckRecord(proof, int64(tree.n), tree.root, int64(v-1), tlog.RecordHash(leaf)); err != nil {
				t.Errorf("tlog.CheckRecord(version %d, size %d): %v", v, tree.n, err)
			}
			// The proof must not verify another entry.
			other, _ := hex.DecodeString(hashes[v%tree.n+1])
			if tlog.CheckRecord(proof, int64(tree.n), tree.root, int64(v-1), tlog.RecordHash(other)) == nil {
				t.Errorf("inclusion proof of %d also verifies entry %d", v, v%tree.n+1)
			}
		}
	}
	code, body := call(t, h, "GET", "/v1/proof/consistency?old=7&new=13", "")
	if code != 200 {
		t.Fatalf("consistency = %d %s", code, body)
	}
	_, proof := decodeProof(t, body)
	if err := tlog.CheckTree(proof, 13, root13, 7, root7); err != nil {
		t.Errorf("tlog.CheckTree(7 → 13): %v", err)
	}
	if code, _ := call(t, h, "GET", "/v1/proof/consistency?old=7&new=14", ""); code != 400 {
		t.Errorf("consistency past head = %d, want 400", code)
	}

	// Across a restart: the checkpoint of size 13 is the one signed, and
	// signing again at that size gives it back, not a second root.
	if _, _, err := h.Drain(t.Context(), timeIn(5)); err != nil {
		t.Fatal(err)
	}
	h2 := serveDir(t, newDefinition(&registry{}), dir, `checkpoint_interval = "24h"`)
	if _, got := call(t, h2, "GET", "/v1/checkpoint", ""); got != ck13 {
		t.Errorf("checkpoint after restart = %q, want %q", got, ck13)
	}
	if _, got := call(t, h2, "POST", "/v1/checkpoint", ""); got != ck13 {
		t.Errorf("checkpoint signed again after restart = %q, want %q", got, ck13)
	}
	if _, vkey := call(t, h2, "GET", "/v1/key", ""); !strings.HasPrefix(vkey, "plughost-registry+") {
		t.Errorf("key = %q", vkey)
	}
	openCheckpoint(t, h2, ck13) // the same key, kept in the data dir
	checkChain(t, h2, 13)
}
