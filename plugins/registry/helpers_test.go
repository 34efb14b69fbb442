package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
	"github.com/plughost/plughost/sdk"
)

// key is a test approver's key pair, derived from its name.
func key(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("registry test approver " + name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func pubB64(name string) string {
	return base64.StdEncoding.EncodeToString(key(name).Public().(ed25519.PublicKey))
}

// approvers is the config of approvers a, b and c.
func approvers() string {
	var b strings.Builder
	for _, n := range []string{"a", "b", "c"} {
		fmt.Fprintf(&b, "approver %q {\n  public_key = %q\n}\n", n, pubB64(n))
	}
	return b.String()
}

// sign is approver name's base64 signature over the hex digest's bytes.
func sign(t testing.TB, name, digest string) string {
	t.Helper()
	d, err := hex.DecodeString(digest)
	if err != nil || len(d) != 32 {
		t.Fatalf("digest %q: %v", digest, err)
	}
	return base64.StdEncoding.EncodeToString(ed25519.Sign(key(name), d))
}

// clock is an injected clock that tests move.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// call sends one request through h and returns the status and the body.
func call(t testing.TB, h http.Handler, method, path, body string, hdr ...string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// serve serves def in-process and drains it when the test ends, so that
// its goroutines are gone before goleak looks.
func serve(t *testing.T, def sdk.Plugin, config string) *plugintest.Harness {
	t.Helper()
	return serveDir(t, def, t.TempDir(), config)
}

// serveDir is serve with the data dir dir.
func serveDir(t *testing.T, def sdk.Plugin, dir, config string) *plugintest.Harness {
	t.Helper()
	h := plugintest.New(t, def, plugintest.Options{Config: approvers() + config, DataDir: dir,
		// A host limit above the plugin's own, as for batches of large
		// artifacts, so that the plugin's 413 is reachable.
		Limits: sdk.Limits{MaxBodyBytes: maxBodyBytes, RequestTimeout: 10 * time.Second}})
	t.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(5*time.Second)) })
	return h
}

func errorCode(body string) string {
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

type proposed struct {
	ProposalID string `json:"proposal_id"`
	Digest     string `json:"digest"`
}

type approved struct {
	Committed bool   `json:"committed"`
	Version   uint64 `json:"version"`
	Hash      string `json:"hash"`
}

// propose proposes artifact and returns the answer.
func propose(t testing.TB, h http.Handler, artifact string) proposed {
	t.Helper()
	code, body := call(t, h, "POST", "/v1/proposals", `{"artifact":`+artifact+`}`)
	var p proposed
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("propose %s = %d %s, want 202", artifact, code, body)
	}
	return p
}

// approve sends name's approval of p and returns the status and answer.
func approve(t testing.TB, h http.Handler, p proposed, name string) (int, approved) {
	t.Helper()
	code, body := call(t, h, "POST", "/v1/proposals/"+p.ProposalID+"/approvals",
		fmt.Sprintf(`{"approver":%q,"signature":%q}`, name, sign(t, name, p.Digest)))
	var a approved
	_ = json.Unmarshal([]byte(body), &a)
	return code, a
}

// commit proposes artifact and approves it by a and b.
func commit(t testing.TB, h http.Handler, artifact string) approved {
	t.Helper()
	p := propose(t, h, artifact)
	if code, _ := approve(t, h, p, "a"); code != http.StatusAccepted {
		t.Fatalf("first approval = %d, want 202", code)
	}
	code, a := approve(t, h, p, "b")
	if code != http.StatusOK || !a.Committed {
		t.Fatalf("second approval = %d %+v, want 200 committed", code, a)
	}
	return a
}

// eventually polls cond every 10ms until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// entries reads versions 1..n and checks the chain: each prev_hash is the
// hash before it, each hash covers its entry.
func checkChain(t *testing.T, h http.Handler, n uint64) []entry {
	t.Helper()
	var out []entry
	for from := uint64(1); from <= n; from += maxRange {
		code, body := call(t, h, "GET", fmt.Sprintf("/v1/entries?from=%d&limit=%d", from, maxRange), "")
		var page struct{ Entries []entry }
		if code != 200 || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("entries from %d = %d %s", from, code, body)
		}
		out = append(out, page.Entries...)
	}
	if uint64(len(out)) != n {
		t.Fatalf("%d entries, want %d", len(out), n)
	}
	var prev [32]byte
	for i, e := range out {
		if e.Version != uint64(i+1) || e.PrevHash != hex.EncodeToString(prev[:]) {
			t.Fatalf("entry %d: version %d prev_hash %s, want version %d prev_hash %x", i+1, e.Version, e.PrevHash, i+1, prev)
		}
		prev = entryHash(prev, e)
		if e.Hash != hex.EncodeToString(prev[:]) {
			t.Fatalf("entry %d: hash %s, want %x", e.Version, e.Hash, prev)
		}
	}
	return out
}

// gate is a fault injector that holds every commit until opened.
type gate struct {
	held chan struct{} // receives once per commit held
	open chan struct{}
}

func (g *gate) Inject(ctx context.Context, _ string) error {
	select {
	case g.held <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func timeIn(s int) time.Time { return time.Now().Add(time.Duration(s) * time.Second) }

func b64Hash(h [32]byte) string { return base64.StdEncoding.EncodeToString(h[:]) }

// metric is the value of the series named series (with its labels, as
// the exposition writes them) in h's metrics; -1 when absent.
func metric(t *testing.T, h *plugintest.Harness, series string) float64 {
	t.Helper()
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(m) {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", l, err)
			}
			return f
		}
	}
	return -1
}
