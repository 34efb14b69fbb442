package e2e

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// regPropose proposes artifact through c and returns its id and digest.
func regPropose(t *testing.T, c *regClient, artifact string) (id string, digest []byte) {
	t.Helper()
	code, b, err := c.do("POST", "/v1/proposals", map[string]json.RawMessage{"artifact": json.RawMessage(artifact)})
	var p struct {
		ProposalID string `json:"proposal_id"`
		Digest     string `json:"digest"`
	}
	if err != nil || code != http.StatusAccepted || json.Unmarshal(b, &p) != nil {
		t.Fatalf("propose %s = %d %s %v, want 202", artifact, code, b, err)
	}
	d, err := hex.DecodeString(p.Digest)
	if err != nil {
		t.Fatalf("digest %q: %v", p.Digest, err)
	}
	return p.ProposalID, d
}

// regApproval is an approval's body by approver name over digest.
func regApproval(name string, digest []byte) map[string]string {
	return map[string]string{"approver": name, "signature": base64.StdEncoding.EncodeToString(ed25519.Sign(regKey(name), digest))}
}

// regOpen opens a signed checkpoint against the key the registry
// publishes and returns its size and root.
func regOpen(t *testing.T, c *regClient, signed []byte) (int64, tlog.Hash) {
	t.Helper()
	_, vkey, _ := c.do("GET", "/v1/key", nil)
	v, err := note.NewVerifier(strings.TrimSpace(string(vkey)))
	if err != nil {
		t.Fatalf("the published key %q: %v", vkey, err)
	}
	n, err := note.Open(signed, note.VerifierList(v))
	if err != nil {
		t.Fatalf("note.Open(%q): %v", signed, err)
	}
	lines := strings.Split(n.Text, "\n")
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		t.Fatalf("checkpoint size %q: %v", lines[1], err)
	}
	var root tlog.Hash
	rb, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(rb) != len(root) {
		t.Fatalf("checkpoint root %q: %v", lines[2], err)
	}
	copy(root[:], rb)
	return size, root
}

// regProof asks for a proof and returns its hashes.
func regProof(t *testing.T, c *regClient, path string) []tlog.Hash {
	t.Helper()
	code, b, err := c.do("GET", path, nil)
	var p struct{ Proof []string }
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &p) != nil {
		t.Fatalf("GET %s = %d %s %v", path, code, b, err)
	}
	out := make([]tlog.Hash, len(p.Proof))
	for i, s := range p.Proof {
		hb, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(hb) != len(out[i]) {
			t.Fatalf("proof hash %q: %v", s, err)
		}
		copy(out[i][:], hb)
	}
	return out
}

// TestRegistryThroughHost drives the registry's API through the real host
// and plugin binary: approvals racing from many clients on many proposals
// commit each proposal exactly once, with contiguous versions and a chain
// that links; bad approvals are 403 and unknown proposals 404; a full
// proposals queue answers 429 with Retry-After and moves
// busy_rejections_total; checkpoints open with note.Open against the
// published key, a consistency proof between two of them passes
// tlog.CheckTree, and the checkpoint of a size is the same note after a
// restart; with retention on, the entries below the checkpoint less
// keep_after_checkpoint answer 410 with the covering checkpoint while
// their inclusion proofs still verify.
func TestRegistryThroughHost(t *testing.T) {
	const proposals = 8
	data := filepath.Join(t.TempDir(), "data")
	// Requests wait up to 30s: the queue test holds commits for seconds.
	base := strings.Replace(strings.Replace(baseConfig("5s"), `"./data"`, strconv.Quote(data), 1),
		`request_timeout = "5s"`, `request_timeout = "30s"`, 1) + faultsOn
	if !strings.Contains(base, `request_timeout = "30s"`) {
		t.Fatal("the base config has no request_timeout to raise")
	}
	h := startHost(t, base+regConfig(`commit_timeout = "10s"`, `commit_deadline = "20s"`, `proposals_queue = 4`))
	readyPlugin(t, h, "registry")
	c := &regClient{http: &http.Client{Timeout: 30 * time.Second}}
	c.base.Store(&h.ingress)

	// Racing approvals: every approver approves every proposal from three
	// clients at once.
	ids := make([]string, proposals)
	digests := make([][]byte, proposals)
	for i := range proposals {
		ids[i], digests[i] = regPropose(t, c, fmt.Sprintf(`{"race":%d}`, i))
	}
	type answer struct {
		code int
		body []byte
	}
	answers := make([][]answer, proposals)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range proposals {
		for _, name := range []string{"a", "b", "c"} {
			for range 3 {
				wg.Go(func() {
					code, b, err := c.do("POST", "/v1/proposals/"+ids[i]+"/approvals", regApproval(name, digests[i]))
					if err != nil {
						t.Errorf("approve %d by %s: %v", i, name, err)
						return
					}
					mu.Lock()
					answers[i] = append(answers[i], answer{code, b})
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
	versions := map[uint64]int{}
	for i, as := range answers {
		var version uint64
		for _, a := range as {
			var r struct {
				Committed bool   `json:"committed"`
				Version   uint64 `json:"version"`
			}
			if (a.code != http.StatusOK && a.code != http.StatusAccepted) || json.Unmarshal(a.body, &r) != nil {
				t.Fatalf("an approval of proposal %d = %d %s, want 200 or 202", i, a.code, a.body)
			}
			if !r.Committed {
				continue
			}
			if version != 0 && r.Version != version {
				t.Errorf("proposal %d answered committed at versions %d and %d", i, version, r.Version)
			}
			version = r.Version
		}
		if version == 0 {
			t.Fatalf("proposal %d: no approval answered committed: %v", i, as)
		}
		versions[version]++
	}
	for v := uint64(1); v <= proposals; v++ {
		if versions[v] != 1 {
			t.Errorf("version %d committed for %d proposals, want exactly 1 (versions %v)", v, versions[v], versions)
		}
	}
	var es []struct {
		Version  uint64 `json:"version"`
		PrevHash string `json:"prev_hash"`
		Hash     string `json:"hash"`
	}
	code, b, err := c.do("GET", "/v1/entries?from=1&limit=1000", nil)
	var page struct {
		Entries json.RawMessage `json:"entries"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &page) != nil || json.Unmarshal(page.Entries, &es) != nil {
		t.Fatalf("GET /v1/entries = %d %.300s %v", code, b, err)
	}
	prev := strings.Repeat("0", 64)
	for i, e := range es {
		if e.Version != uint64(i+1) || e.PrevHash != prev {
			t.Fatalf("entry %d: version %d prev_hash %s, want %d after %s", i+1, e.Version, e.PrevHash, i+1, prev)
		}
		prev = e.Hash
	}
	if len(es) != proposals {
		t.Fatalf("%d entries, want %d", len(es), proposals)
	}

	// Refusals.
	id, d := regPropose(t, c, `{"refusals":1}`)
	for _, tt := range []struct {
		what string
		path string
		body map[string]string
		want int
	}{
		{"an unknown approver", "/v1/proposals/" + id + "/approvals", regApproval("mallory", d), http.StatusForbidden},
		{"another approver's signature", "/v1/proposals/" + id + "/approvals", map[string]string{"approver": "a", "signature": regApproval("b", d)["signature"]}, http.StatusForbidden},
		{"a signature that is not base64", "/v1/proposals/" + id + "/approvals", map[string]string{"approver": "a", "signature": "not base64!"}, http.StatusForbidden},
		{"an unknown proposal", "/v1/proposals/" + strings.Repeat("0", len(id)) + "/approvals", regApproval("a", d), http.StatusNotFound},
	} {
		if code, b, err := c.do("POST", tt.path, tt.body); err != nil || code != tt.want {
			t.Errorf("%s = %d %s %v, want %d", tt.what, code, b, err, tt.want)
		}
	}

	// A full queue: commits held at the store until the fault is cleared
	// (within commit_timeout), twelve proposals at once against a queue
	// of four.
	setFaults(t, h, "registry", `{"faults":[{"point":"store.commit","delay":"9s"}]}`)
	var busy, accepted int
	wg = sync.WaitGroup{}
	for i := range 12 {
		wg.Go(func() {
			bs, _ := json.Marshal(map[string]json.RawMessage{"artifact": json.RawMessage(fmt.Sprintf(`{"queue":%d}`, i))})
			resp, err := c.http.Post(*c.base.Load()+"/registry/v1/proposals", "application/json", bytes.NewReader(bs))
			if err != nil {
				t.Errorf("propose during the stall: %v", err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			switch resp.StatusCode {
			case http.StatusTooManyRequests:
				busy++
				if resp.Header.Get("Retry-After") == "" {
					t.Errorf("a 429 without Retry-After")
				}
			case http.StatusAccepted:
				accepted++
			default:
				t.Errorf("propose during the stall = %d, want 202 or 429", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	setFaults(t, h, "registry", "")
	if busy == 0 || accepted == 0 || accepted > 5 {
		t.Errorf("with commits held and a queue of 4: %d accepted, %d refused 429; want at most 4 queued and 1 committing, the rest refused", accepted, busy)
	}
	if v, ok := h.metric(`busy_rejections_total{endpoint="proposals",plugin="registry"}`); !ok || v < float64(busy) {
		t.Errorf(`busy_rejections_total{endpoint="proposals"} = %v (found %v), want at least %d`, v, ok, busy)
	}

	// Checkpoints: one of a smaller size and one of HEAD, consistent.
	sign := func() []byte {
		t.Helper()
		code, signed, err := c.do("POST", "/v1/checkpoint", nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("POST /v1/checkpoint = %d %s %v", code, signed, err)
		}
		return signed
	}
	oldSize, oldRoot := regOpen(t, c, sign())
	id, d = regPropose(t, c, `{"after":"checkpoint"}`)
	for _, name := range []string{"a", "b"} {
		if code, b, err := c.do("POST", "/v1/proposals/"+id+"/approvals", regApproval(name, d)); err != nil || code/100 != 2 {
			t.Fatalf("approve by %s = %d %s %v", name, code, b, err)
		}
	}
	signed := sign()
	size, root := regOpen(t, c, signed)
	if size <= oldSize {
		t.Fatalf("checkpoint sizes %d then %d, want growth", oldSize, size)
	}
	proof := regProof(t, c, fmt.Sprintf("/v1/proof/consistency?old=%d&new=%d", oldSize, size))
	if err := tlog.CheckTree(proof, size, root, oldSize, oldRoot); err != nil {
		t.Errorf("tlog.CheckTree(%d → %d): %v", oldSize, size, err)
	}

	// A restart with retention on: the size's checkpoint is the same
	// note, and a commit's new checkpoint lets retention prune.
	h.signal(syscall.SIGTERM)
	if _, ok := h.waitExit(30 * time.Second); !ok {
		t.Fatal("the host did not exit after SIGTERM")
	}
	h = startHost(t, base+regConfig(`retention {`, `  enabled = true`, `  keep_after_checkpoint = 2`, `}`))
	readyPlugin(t, h, "registry")
	c.base.Store(&h.ingress)
	if again := sign(); !bytes.Equal(again, signed) {
		t.Errorf("the checkpoint of size %d after a restart:\n%s\nwant the note signed before it:\n%s", size, again, signed)
	}
	id, d = regPropose(t, c, `{"after":"restart"}`)
	for _, name := range []string{"a", "b"} {
		if code, b, err := c.do("POST", "/v1/proposals/"+id+"/approvals", regApproval(name, d)); err != nil || code/100 != 2 {
			t.Fatalf("approve by %s after the restart = %d %s %v", name, code, b, err)
		}
	}
	signed = sign()
	size, root = regOpen(t, c, signed)
	gone := uint64(size) - 2 - 1 // below size less keep_after_checkpoint
	waitFor(t, 30*time.Second, fmt.Sprintf("retention to prune versions 1 to %d", gone), func() bool {
		code, _, _ := c.do("GET", fmt.Sprintf("/v1/entries/%d", gone), nil)
		return code == http.StatusGone
	})
	code, b, err = c.do("GET", "/v1/entries/1", nil)
	var pruned struct {
		Error struct{ Code, Checkpoint string }
	}
	if err != nil || code != http.StatusGone || json.Unmarshal(b, &pruned) != nil || pruned.Error.Code != "pruned" || pruned.Error.Checkpoint == "" {
		t.Errorf("GET pruned entry 1 = %d %s %v, want 410 pruned with the covering checkpoint", code, b, err)
	} else if n, _ := regOpen(t, c, []byte(pruned.Error.Checkpoint)); n < int64(gone) {
		t.Errorf("the 410's checkpoint is of size %d, which does not cover version %d", n, gone)
	}
	if code, b, err := c.do("GET", fmt.Sprintf("/v1/entries/%d", gone+1), nil); err != nil || code != http.StatusOK {
		t.Errorf("GET kept entry %d = %d %s %v, want 200", gone+1, code, b, err)
	}
	leaf, _ := hex.DecodeString(es[0].Hash)
	rp := regProof(t, c, fmt.Sprintf("/v1/proof/inclusion?version=1&size=%d", size))
	if err := tlog.CheckRecord(rp, size, root, 0, tlog.RecordHash(leaf)); err != nil {
		t.Errorf("tlog.CheckRecord of pruned entry 1 in the checkpoint of size %d: %v", size, err)
	}
}
