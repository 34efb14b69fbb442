package e2e

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// regKey is test approver name's key, derived from its name.
func regKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("registry e2e approver " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

// regConfig is the registry's plugin block with approvers a, b and c,
// and the attribute lines extra.
func regConfig(extra ...string) string {
	var b strings.Builder
	b.WriteString("  config {\n    quorum = 2\n    checkpoint_interval = \"200ms\"\n")
	for _, l := range extra {
		b.WriteString("    " + l + "\n")
	}
	for _, n := range []string{"a", "b", "c"} {
		pub := regKey(n).Public().(ed25519.PublicKey)
		fmt.Fprintf(&b, "    approver %q {\n      public_key = %q\n    }\n", n, base64.StdEncoding.EncodeToString(pub))
	}
	b.WriteString("  }")
	return pluginBlock("registry", "registry", b.String())
}

// regClient talks to the registry through whichever host is running.
type regClient struct {
	base atomic.Pointer[string]
	http *http.Client
}

func (c *regClient) do(method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, *c.base.Load()+"/registry"+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

type regCommit struct {
	Version uint64 `json:"version"`
	Hash    string `json:"hash"`
}

// TestRegistryKill9UnderCommitLoad commits through the real host from 8
// clients (propose, then approvals by a and b, each retried until
// answered) while the registry plugin is killed with SIGKILL twice. After
// the restarts the versions are contiguous, every acknowledged commit is
// at its version with its hash and artifact, the chain links, and every
// entry's inclusion in a checkpoint opened with note.Open verifies with
// tlog.CheckRecord.
func TestRegistryKill9UnderCommitLoad(t *testing.T) {
	const (
		clients = 8
		perKill = 60 // acknowledged commits between kills
	)
	data := filepath.Join(t.TempDir(), "data")
	cfg := strings.Replace(baseConfig("2s"), `"./data"`, strconv.Quote(data), 1) + regConfig()
	h := startHost(t, cfg)
	readyPlugin(t, h, "registry")
	c := &regClient{http: &http.Client{Timeout: 10 * time.Second}}
	c.base.Store(&h.ingress)

	var (
		mu    sync.Mutex
		acked = map[uint64]string{} // version → artifact, as {"c":C,"n":N}
		hash  = map[uint64]string{}
		stop  atomic.Bool
		ok    atomic.Int64
		wg    sync.WaitGroup
	)
	// retry sends until answered with a status in want, or 60s pass.
	retry := func(method, path string, body any, want ...int) (int, []byte) {
		for giveUp := time.Now().Add(60 * time.Second); time.Now().Before(giveUp); {
			code, b, err := c.do(method, path, body)
			if err == nil {
				for _, w := range want {
					if code == w {
						return code, b
					}
				}
			}
			time.Sleep(20 * time.Millisecond) // back off from a refusal or a dead plugin
		}
		return 0, nil
	}
	for cl := range clients {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				artifact := fmt.Sprintf(`{"c":%d,"n":%d}`, cl, n)
				code, b := retry("POST", "/v1/proposals", map[string]json.RawMessage{"artifact": json.RawMessage(artifact)}, 202)
				var p struct{ ProposalID, Digest string }
				if code != 202 || json.Unmarshal(b, &struct {
					ProposalID *string `json:"proposal_id"`
					Digest     *string `json:"digest"`
				}{&p.ProposalID, &p.Digest}) != nil {
					t.Errorf("propose %s: no 202 within 60s", artifact)
					return
				}
				d, _ := hex.DecodeString(p.Digest)
				var last []byte
				for _, name := range []string{"a", "b"} {
					sig := base64.StdEncoding.EncodeToString(ed25519.Sign(regKey(name), d))
					code, last = retry("POST", "/v1/proposals/"+p.ProposalID+"/approvals", map[string]string{"approver": name, "signature": sig}, 200, 202)
					if code == 0 {
						t.Errorf("approve %s by %s: no answer within 60s", artifact, name)
						return
					}
				}
				var cm regCommit
				if code != 200 || json.Unmarshal(last, &cm) != nil || cm.Version == 0 {
					t.Errorf("quorum approval of %s = %d %s", artifact, code, last)
					return
				}
				mu.Lock()
				if prev, dup := acked[cm.Version]; dup {
					t.Errorf("version %d acknowledged for %s and %s", cm.Version, prev, artifact)
				}
				acked[cm.Version], hash[cm.Version] = artifact, cm.Hash
				mu.Unlock()
				ok.Add(1)
			}
		})
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	for kill := 1; kill <= 3; kill++ {
		want := ok.Load() + perKill
		waitFor(t, 90*time.Second, fmt.Sprintf("%d acknowledged commits before kill %d", want, kill), func() bool { return ok.Load() >= want })
		if kill == 3 {
			break
		}
		old := h.plugins()["registry"]
		if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 registry (pid %d): %v", old.Pid, err)
		}
		waitFor(t, 30*time.Second, "the registry restarted", func() bool {
			st := h.plugins()["registry"]
			return st.State == "ready" && st.Pid > 0 && st.Pid != old.Pid
		})
	}
	stop.Store(true)
	wg.Wait()

	_, b, err := c.do("GET", "/v1/head", nil)
	var head regCommit
	if err != nil || json.Unmarshal(b, &head) != nil {
		t.Fatalf("head: %s %v", b, err)
	}
	mu.Lock()
	defer mu.Unlock()
	var maxAcked uint64
	for v := range acked {
		maxAcked = max(maxAcked, v)
	}
	if head.Version < maxAcked {
		t.Fatalf("head %d is before the last acknowledged commit %d", head.Version, maxAcked)
	}
	type entry struct {
		Version  uint64          `json:"version"`
		PrevHash string          `json:"prev_hash"`
		Hash     string          `json:"hash"`
		Artifact json.RawMessage `json:"artifact"`
	}
	var es []entry
	for from := uint64(1); from <= head.Version; from += 1000 {
		code, b, err := c.do("GET", fmt.Sprintf("/v1/entries?from=%d&limit=1000", from), nil)
		var page struct{ Entries []entry }
		if err != nil || code != 200 || json.Unmarshal(b, &page) != nil {
			t.Fatalf("entries from %d = %d %.200s %v", from, code, b, err)
		}
		es = append(es, page.Entries...)
	}
	if uint64(len(es)) != head.Version {
		t.Fatalf("%d entries, head %d", len(es), head.Version)
	}
	prev := strings.Repeat("0", 64)
	seen := map[string]uint64{}
	for i, e := range es {
		if e.Version != uint64(i+1) || e.PrevHash != prev {
			t.Fatalf("entry %d: version %d prev_hash %s, want %d after %s", i+1, e.Version, e.PrevHash, i+1, prev)
		}
		prev = e.Hash
		if v, dup := seen[string(e.Artifact)]; dup {
			t.Errorf("artifact %s committed at %d and %d", e.Artifact, v, e.Version)
		}
		seen[string(e.Artifact)] = e.Version
		if a, ok := acked[e.Version]; ok && (a != string(e.Artifact) || hash[e.Version] != e.Hash) {
			t.Errorf("version %d holds %s %s, acknowledged as %s %s", e.Version, e.Artifact, e.Hash, a, hash[e.Version])
		}
	}

	// The tree: a checkpoint of HEAD, opened against the published key,
	// proves every entry's inclusion.
	code, signed, err := c.do("POST", "/v1/checkpoint", nil)
	if err != nil || code != 200 {
		t.Fatalf("sign checkpoint = %d %s %v", code, signed, err)
	}
	_, vkey, _ := c.do("GET", "/v1/key", nil)
	v, err := note.NewVerifier(strings.TrimSpace(string(vkey)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := note.Open(signed, note.VerifierList(v))
	if err != nil {
		t.Fatalf("note.Open: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	size, _ := strconv.ParseInt(lines[1], 10, 64)
	var root tlog.Hash
	rb, _ := base64.StdEncoding.DecodeString(lines[2])
	copy(root[:], rb)
	if size != int64(head.Version) {
		t.Fatalf("checkpoint size %d, head %d", size, head.Version)
	}
	for _, e := range es {
		code, b, err := c.do("GET", fmt.Sprintf("/v1/proof/inclusion?version=%d&size=%d", e.Version, size), nil)
		var p struct{ Proof []string }
		if err != nil || code != 200 || json.Unmarshal(b, &p) != nil {
			t.Fatalf("inclusion of %d = %d %s %v", e.Version, code, b, err)
		}
		proof := make(tlog.RecordProof, len(p.Proof))
		for i, s := range p.Proof {
			hb, _ := base64.StdEncoding.DecodeString(s)
			copy(proof[i][:], hb)
		}
		leaf, _ := hex.DecodeString(e.Hash)
		if err := tlog.CheckRecord(proof, size, root, int64(e.Version-1), tlog.RecordHash(leaf)); err != nil {
			t.Errorf("tlog.CheckRecord(version %d): %v", e.Version, err)
		}
	}
	t.Logf("%d commits acknowledged across 2 kills, head %d", len(acked), head.Version)
}

// TestRegistryTamperDetected changes one byte of a committed artifact in
// the registry's files while the host is stopped (every copy: the store's
// file and its write-ahead log). After the restart the corruption is
// found and counted, the registry refuses writes, and the untouched
// entries are still served.
func TestRegistryTamperDetected(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg := strings.Replace(baseConfig("2s"), `"./data"`, strconv.Quote(data), 1) + regConfig()
	h := startHost(t, cfg)
	readyPlugin(t, h, "registry")
	c := &regClient{http: &http.Client{Timeout: 10 * time.Second}}
	c.base.Store(&h.ingress)
	for i := range 4 {
		artifact := fmt.Sprintf(`{"tag":"tamper-me-%d"}`, i)
		code, b, err := c.do("POST", "/v1/proposals", map[string]json.RawMessage{"artifact": json.RawMessage(artifact)})
		var p struct {
			ProposalID string `json:"proposal_id"`
			Digest     string `json:"digest"`
		}
		if err != nil || code != 202 || json.Unmarshal(b, &p) != nil {
			t.Fatalf("propose = %d %s %v", code, b, err)
		}
		d, _ := hex.DecodeString(p.Digest)
		for _, name := range []string{"a", "b"} {
			sig := base64.StdEncoding.EncodeToString(ed25519.Sign(regKey(name), d))
			code, b, err = c.do("POST", "/v1/proposals/"+p.ProposalID+"/approvals", map[string]string{"approver": name, "signature": sig})
		}
		if err != nil || code != 200 {
			t.Fatalf("quorum approval = %d %s %v", code, b, err)
		}
	}
	h.signal(syscall.SIGTERM)
	if _, ok := h.waitExit(10 * time.Second); !ok {
		t.Fatal("host still running 10s after SIGTERM")
	}
	flipped := 0
	err := filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := bytes.Count(b, []byte("tamper-me-2")); n > 0 {
			flipped += n
			return os.WriteFile(path, bytes.ReplaceAll(b, []byte("tamper-me-2"), []byte("tamper-me-7")), 0o600)
		}
		return nil
	})
	if err != nil || flipped == 0 {
		t.Fatalf("flip: %d copies found, %v", flipped, err)
	}

	h = startHost(t, cfg)
	c.base.Store(&h.ingress)
	waitFor(t, 30*time.Second, "the corruption to be counted", func() bool {
		_, body := h.get(h.admin + "/metrics")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "registry_verify_failures_total{") && !strings.HasSuffix(l, " 0") {
				return true
			}
		}
		return false
	})
	waitFor(t, 10*time.Second, "writes refused", func() bool {
		code, _, err := c.do("POST", "/v1/proposals", map[string]json.RawMessage{"artifact": json.RawMessage(`{}`)})
		return err == nil && code == http.StatusServiceUnavailable
	})
	for _, v := range []int{1, 2, 4} {
		if code, b, err := c.do("GET", fmt.Sprintf("/v1/entries/%d", v), nil); err != nil || code != 200 {
			t.Errorf("entry %d after tampering = %d %s %v, want 200 (reads served)", v, code, b, err)
		}
	}
	if code, b, _ := c.do("GET", "/v1/head", nil); code != 200 {
		t.Errorf("head after tampering = %d %s", code, b)
	}
	t.Logf("plugin state after tampering: %+v", h.plugins()["registry"])
}

// TestRegistryStreamLagged follows the stream through the real host with a
// raw client that stops reading its socket (a receive buffer of 4 KiB,
// the host's stream credit at its minimum, the registry's stream_buffer
// at 128 events, twice a batch) while commits go on in batches of 64: the
// consumer's buffer fills, it is cut off, bus_lagged_total{consumer="slow"}
// counts it, and every commit meanwhile succeeds. A consumer that reads
// all along is never cut off and gets every entry. Read again, the slow
// socket holds entry events in order from version 1, then one lagged
// event with the head, and the stream ends; resuming with Last-Event-ID
// goes on from the next version.
func TestRegistryStreamLagged(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	top := strings.NewReplacer(`"./data"`, strconv.Quote(data), "max_body_bytes  = 4096", "max_body_bytes  = 65536\n  stream_buffer   = 4096",
		`request_timeout = "5s"`, `request_timeout = "60s"`).Replace(baseConfig("2s"))
	h := startHost(t, top+regConfig("stream_buffer = 128", `stream_consumers = ["slow", "fast"]`))
	readyPlugin(t, h, "registry")
	c := &regClient{http: &http.Client{Timeout: 10 * time.Second}}
	c.base.Store(&h.ingress)

	conn, resp := slowStream(t, h, "/registry/v1/stream?consumer=slow")
	// From here the client reads nothing until the consumer is cut off;
	// the fast consumer reads all along.
	fast := follow(t, h.ingress+"/registry/v1/stream?consumer=fast", 60*time.Second)
	var head uint64
	for batch := 0; !h.busLagged("slow"); batch++ {
		if batch == 60 {
			t.Fatalf("no lag after %d commits", head)
		}
		head = regCommitBatch(t, c, batch, head)
	}
	t.Logf("the consumer lagged within %d commits", head)
	// Commits go on after the cut.
	head = regCommitBatch(t, c, -1, head)
	waitFor(t, 30*time.Second, "the fast consumer to read every entry", func() bool { return fast.last.Load() == head || fast.bad.Load() != nil })
	if bad := fast.bad.Load(); bad != nil {
		t.Fatalf("the consumer that reads all along got %v", bad)
	}
	if h.busLagged("fast") {
		t.Errorf("the consumer that reads all along was cut off")
	}

	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	events, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the stream to its end: %v (%d bytes)", err, len(events))
	}
	var (
		next     = uint64(1)
		lagHead  regCommit
		gotLag   bool
		kind, id string
	)
	for l := range strings.Lines(string(events)) {
		l = strings.TrimRight(l, "\n")
		switch {
		case strings.HasPrefix(l, "event: "):
			kind = l[len("event: "):]
		case strings.HasPrefix(l, "id: "):
			id = l[len("id: "):]
		case strings.HasPrefix(l, "data: ") && kind == "entry":
			if gotLag || id != strconv.FormatUint(next, 10) {
				t.Fatalf("entry event id %s after %d entries (lagged %v), want %d", id, next-1, gotLag, next)
			}
			next++
		case strings.HasPrefix(l, "data: ") && kind == "lagged":
			if gotLag || json.Unmarshal([]byte(l[len("data: "):]), &lagHead) != nil {
				t.Fatalf("lagged event %q (one before: %v)", l, gotLag)
			}
			gotLag = true
		}
	}
	if !gotLag || lagHead.Version < next-1 || next-1 >= head {
		t.Fatalf("stream: %d entries then lagged %v at head %d; want fewer than the %d committed, then lagged at a head at least the last one", next-1, gotLag, lagHead.Version, head)
	}
	req, _ := http.NewRequestWithContext(ctxTimeout(t, 10*time.Second), "GET", h.ingress+"/registry/v1/stream?consumer=slow", nil)
	req.Header.Set("Last-Event-ID", strconv.FormatUint(next-1, 10))
	again, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Body.Close()
	sc := bufio.NewScanner(again.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "id: ") {
	}
	if want := fmt.Sprintf("id: %d", next); sc.Text() != want {
		t.Errorf("resumed stream's first event %q, want %q", sc.Text(), want)
	}
}

// regCommitBatch commits 64 artifacts through the batch routes (proposals,
// then approvals by a, then by b) and returns the head after them, which
// must be head + 64: every commit succeeds.
func regCommitBatch(t *testing.T, c *regClient, batch int, head uint64) uint64 {
	t.Helper()
	const n = 64
	type result struct {
		Status     int    `json:"status"`
		ProposalID string `json:"proposal_id"`
		Digest     string `json:"digest"`
		Version    uint64 `json:"version"`
	}
	post := func(path string, body any) []result {
		t.Helper()
		code, b, err := c.do("POST", path, body)
		var out struct{ Results []result }
		if err != nil || code != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Results) != n {
			t.Fatalf("POST %s = %d %.300s %v", path, code, b, err)
		}
		return out.Results
	}
	props := make([]map[string]json.RawMessage, n)
	for i := range props {
		props[i] = map[string]json.RawMessage{"artifact": json.RawMessage(fmt.Sprintf(`{"batch":%d,"i":%d}`, batch, i))}
	}
	ps := post("/v1/proposals/batch", map[string]any{"proposals": props})
	var rs []result
	for _, name := range []string{"a", "b"} {
		as := make([]map[string]string, n)
		for i, p := range ps {
			if p.Status != http.StatusAccepted {
				t.Fatalf("proposal %d of batch %d: %+v", i, batch, p)
			}
			dg, _ := hex.DecodeString(p.Digest)
			as[i] = map[string]string{"proposal_id": p.ProposalID, "approver": name,
				"signature": base64.StdEncoding.EncodeToString(ed25519.Sign(regKey(name), dg))}
		}
		rs = post("/v1/approvals/batch", map[string]any{"approvals": as})
	}
	for i, r := range rs {
		if r.Status != http.StatusOK || r.Version <= head || r.Version > head+n {
			t.Fatalf("quorum approval %d of batch %d = %+v, want 200 at a version from %d to %d", i, batch, r, head+1, head+n)
		}
	}
	return head + n
}
