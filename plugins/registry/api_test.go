package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"github.com/plughost/plughost/host/plugintest"
)

func TestCommitAtQuorum(t *testing.T) {
	c := newClock()
	h := serve(t, newDefinition(&registry{now: c.now}), "")
	// Keys in any order and spacing give one digest: the canonical encoding.
	p := propose(t, h, `{"name": "x", "v": 1, "a": [1, "<b>"]}`)
	want := blake3.Sum256([]byte(`{"a":[1,"<b>"],"name":"x","v":1}`))
	if p.Digest != hex.EncodeToString(want[:]) {
		t.Errorf("digest = %s, want BLAKE3 of the canonical encoding %x", p.Digest, want)
	}
	if q := propose(t, h, `{"v":1,"a":[1,"<b>"],"name":"x"}`); q.Digest != p.Digest || q.ProposalID == p.ProposalID {
		t.Errorf("the same artifact reordered: %+v, want digest %s under a new id", q, p.Digest)
	}
	if code, a := approve(t, h, p, "a"); code != http.StatusAccepted || a.Committed {
		t.Fatalf("first approval = %d %+v, want 202 not committed", code, a)
	}
	if code, a := approve(t, h, p, "a"); code != http.StatusAccepted || a.Committed {
		t.Fatalf("repeated approval = %d %+v, want 202 (idempotent) not committed", code, a)
	}
	if code, body := call(t, h, "GET", "/v1/head", ""); code != 200 || body != `{"version":0,"hash":"`+strings.Repeat("0", 64)+`"}`+"\n" {
		t.Errorf("head before quorum = %d %s, want version 0", code, body)
	}
	code, a := approve(t, h, p, "b")
	if code != http.StatusOK || !a.Committed || a.Version != 1 {
		t.Fatalf("quorum approval = %d %+v, want 200 committed at version 1", code, a)
	}
	if code, a2 := approve(t, h, p, "c"); code != http.StatusOK || a2 != a {
		t.Errorf("approval after commit = %d %+v, want 200 %+v (committed once)", code, a2, a)
	}
	if code, a2 := approve(t, h, p, "a"); code != http.StatusOK || a2 != a {
		t.Errorf("repeated approval after commit = %d %+v, want 200 %+v", code, a2, a)
	}
	if code, body := call(t, h, "GET", "/v1/head", ""); code != 200 || !strings.Contains(body, `"version":1,"hash":"`+a.Hash+`"`) {
		t.Errorf("head = %d %s, want version 1 hash %s", code, body, a.Hash)
	}
	es := checkChain(t, h, 1)
	e := es[0]
	if string(e.Artifact) != `{"a":[1,"<b>"],"name":"x","v":1}` || len(e.Approvals) != 2 || e.Approvals[0].Approver != "a" ||
		e.Approvals[1].Approver != "b" || e.CommittedAt != c.now().Format(time.RFC3339Nano) {
		t.Errorf("entry 1 = %+v, want the canonical artifact, approvals a and b, committed at the clock's time", e)
	}
	code, body := call(t, h, "GET", "/v1/entries/1", "")
	if code != 200 || !strings.Contains(body, `"hash":"`+a.Hash+`"`) {
		t.Errorf("GET /v1/entries/1 = %d %s", code, body)
	}
	if code, _ := call(t, h, "GET", "/v1/entries/2", ""); code != 404 {
		t.Errorf("GET /v1/entries/2 = %d, want 404", code)
	}
	// A second commit chains to the first.
	b := commit(t, h, `{"name":"y"}`)
	if b.Version != 2 {
		t.Errorf("second commit at version %d, want 2", b.Version)
	}
	checkChain(t, h, 2)
}

func TestRefused(t *testing.T) {
	h := serve(t, definition(), "")
	p := propose(t, h, `{"n":1}`)
	big := `{"x":"` + strings.Repeat("a", maxArtifact-7) + `"}` // canonical: 1 MiB + 1
	goodSig := sign(t, "a", p.Digest)
	otherSig := sign(t, "a", strings.Repeat("00", 32))
	appr := "/v1/proposals/" + p.ProposalID + "/approvals"
	tests := []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"unknown field", "/v1/proposals", `{"artifact":{},"x":1}`, 400, "bad_request"},
		{"no artifact", "/v1/proposals", `{}`, 400, "bad_request"},
		{"artifact not an object", "/v1/proposals", `{"artifact":[1]}`, 400, "bad_request"},
		{"trailing data", "/v1/proposals", `{"artifact":{}} {}`, 400, "bad_request"},
		{"artifact over 1 MiB", "/v1/proposals", `{"artifact":` + big + `}`, 413, "too_large"},
		{"empty batch", "/v1/proposals/batch", `{"proposals":[]}`, 400, "bad_request"},
		{"batch over 64", "/v1/proposals/batch", `{"proposals":[` + strings.Repeat(`{"artifact":{}},`, 64) + `{"artifact":{}}]}`, 400, "bad_request"},
		{"approval unknown field", appr, `{"approver":"a","signature":"` + goodSig + `","x":1}`, 400, "bad_request"},
		{"unknown approver", appr, `{"approver":"z","signature":"` + goodSig + `"}`, 403, "forbidden"},
		{"signature by another key", appr, `{"approver":"b","signature":"` + goodSig + `"}`, 403, "forbidden"},
		{"signature over another digest", appr, `{"approver":"a","signature":"` + otherSig + `"}`, 403, "forbidden"},
		{"signature not base64", appr, `{"approver":"a","signature":"!!"}`, 403, "forbidden"},
		{"no such proposal", "/v1/proposals/" + strings.Repeat("0", 32) + "/approvals", `{"approver":"a","signature":"` + goodSig + `"}`, 404, "not_found"},
		{"malformed id", "/v1/proposals/xyz/approvals", `{"approver":"a","signature":"` + goodSig + `"}`, 404, "not_found"},
		{"approval batch over 64", "/v1/approvals/batch", `{"approvals":[` + strings.Repeat(`{"proposal_id":"x","approver":"a","signature":""},`, 64) + `{}]}`, 400, "bad_request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := call(t, h, "POST", tt.path, tt.body)
			if code != tt.code || errorCode(body) != tt.want {
				t.Errorf("POST %s = %d %.200s, want %d %s", tt.path, code, body, tt.code, tt.want)
			}
		})
	}
	if code, body := call(t, h, "POST", "/v1/proposals", `{"artifact":{"x":"`+strings.Repeat("a", maxArtifact-8)+`"}}`); code != 202 {
		t.Errorf("artifact of exactly 1 MiB = %d %.200s, want 202", code, body)
	}
	for _, q := range []string{"version=0&size=1", "version=1&size=1", "version=x&size=1"} {
		if code, body := call(t, h, "GET", "/v1/proof/inclusion?"+q, ""); code != 400 {
			t.Errorf("inclusion?%s on an empty log = %d %s, want 400", q, code, body)
		}
	}
	for _, path := range []string{"/v1/entries?from=1&from=2", "/v1/entries?form=2", "/v1/entries?limit=1&limit=2",
		"/v1/proof/inclusion?version=1&size=1&size=2", "/v1/proof/consistency?old=1&new=1&x=1"} {
		if code, body := call(t, h, "GET", path, ""); code != 400 || !strings.Contains(body, "query parameter") {
			t.Errorf("GET %s = %d %s, want 400 naming the query parameter", path, code, body)
		}
	}
	if code, body := call(t, h, "GET", "/v1/entries?from=1&limit=5", ""); code != 200 {
		t.Errorf("GET /v1/entries?from=1&limit=5 = %d %s, want 200", code, body)
	}
	if code, body := call(t, h, "GET", "/v1/stream", "", "Last-Event-ID", "1"); code != 409 || errorCode(body) != "ahead_of_head" {
		t.Errorf("stream with Last-Event-ID 1 on an empty log = %d %s, want 409 ahead_of_head", code, body)
	}
	if code, body := call(t, h, "GET", "/v1/stream", "", "Last-Event-ID", "x"); code != 400 {
		t.Errorf("stream with Last-Event-ID x = %d %s, want 400", code, body)
	}
	// None of the refusals committed anything.
	if _, body := call(t, h, "GET", "/v1/head", ""); !strings.Contains(body, `"version":0`) {
		t.Errorf("head after refusals = %s, want version 0", body)
	}
}

func TestProposalExpires(t *testing.T) {
	c := newClock()
	h := serve(t, newDefinition(&registry{now: c.now}), `proposal_ttl = "1h"`)
	p := propose(t, h, `{"n":1}`)
	if code, _ := approve(t, h, p, "a"); code != 202 {
		t.Fatalf("approval = %d, want 202", code)
	}
	c.advance(time.Hour - time.Millisecond)
	q := propose(t, h, `{"n":2}`)
	if code, _ := approve(t, h, q, "a"); code != 202 {
		t.Fatalf("approval = %d, want 202", code)
	}
	c.advance(time.Millisecond) // p's ttl is up, q's is not
	if code, _ := approve(t, h, p, "b"); code != http.StatusGone {
		t.Errorf("quorum approval at the ttl = %d, want 410", code)
	}
	if code, a := approve(t, h, q, "b"); code != 200 || a.Version != 1 {
		t.Errorf("quorum approval 1ms before the ttl = %d %+v, want 200 at version 1", code, a)
	}
}

func TestBatches(t *testing.T) {
	h := serve(t, definition(), "")
	code, body := call(t, h, "POST", "/v1/proposals/batch", `{"proposals":[{"artifact":{"n":1}},{"artifact":7},{"artifact":{"n":2}}]}`)
	var pb struct {
		Results []struct {
			Status int
			proposed
			Error *struct{ Code string }
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &pb) != nil || len(pb.Results) != 3 ||
		pb.Results[0].Status != 202 || pb.Results[1].Status != 400 || pb.Results[2].Status != 202 {
		t.Fatalf("proposal batch = %d %s, want 202, 400, 202", code, body)
	}
	var items []string
	for _, r := range []int{0, 2} {
		for _, n := range []string{"a", "b", "b"} {
			items = append(items, fmt.Sprintf(`{"proposal_id":%q,"approver":%q,"signature":%q}`, pb.Results[r].ProposalID, n, sign(t, n, pb.Results[r].Digest)))
		}
	}
	items = append(items, fmt.Sprintf(`{"proposal_id":%q,"approver":"z","signature":%q}`, pb.Results[0].ProposalID, sign(t, "a", pb.Results[0].Digest)),
		`null`, `{"approver":"a","signature":""}`)
	code, body = call(t, h, "POST", "/v1/approvals/batch", `{"approvals":[`+strings.Join(items, ",")+`]}`)
	var ab struct {
		Results []struct {
			Status int
			approved
		}
	}
	if code != 200 || json.Unmarshal([]byte(body), &ab) != nil || len(ab.Results) != 9 {
		t.Fatalf("approval batch = %d %s", code, body)
	}
	// The last two name no proposal: 400, not 404 for a proposal "".
	want := []int{202, 200, 200, 202, 200, 200, 403, 400, 400}
	versions := map[uint64]bool{}
	for i, r := range ab.Results {
		if r.Status != want[i] {
			t.Errorf("approval %d: status %d, want %d (%s)", i, r.Status, want[i], body)
		}
		if r.Committed {
			versions[r.Version] = true
		}
	}
	if len(versions) != 2 || !versions[1] || !versions[2] {
		t.Errorf("committed versions %v, want 1 and 2, each once", versions)
	}
	checkChain(t, h, 2)
}

// TestRacingApprovals has many clients approve many proposals at once, all
// three approvers each: every proposal commits exactly once, and the
// versions are 1..n with a chain that verifies.
func TestRacingApprovals(t *testing.T) {
	h := serve(t, definition(), `quorum = 2`)
	const n = 60
	ps := make([]proposed, n)
	for i := range ps {
		ps[i] = propose(t, h, fmt.Sprintf(`{"i":%d}`, i))
	}
	type got struct {
		i    int
		code int
		a    approved
	}
	out := make(chan got, 3*n)
	var wg sync.WaitGroup
	for i, p := range ps {
		for _, name := range []string{"a", "b", "c"} {
			wg.Go(func() {
				code, a := approve(t, h, p, name)
				out <- got{i, code, a}
			})
		}
	}
	wg.Wait()
	close(out)
	byProposal := map[int]map[approved]bool{}
	for g := range out {
		if g.code != 200 && g.code != 202 {
			t.Fatalf("approval of %d = %d", g.i, g.code)
		}
		if g.code == 200 {
			if byProposal[g.i] == nil {
				byProposal[g.i] = map[approved]bool{}
			}
			byProposal[g.i][g.a] = true
		}
	}
	seen := map[uint64]int{}
	for i := range n {
		if len(byProposal[i]) != 1 {
			t.Fatalf("proposal %d committed as %v, want exactly one version", i, byProposal[i])
		}
		for a := range byProposal[i] {
			seen[a.Version] = i
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct versions, want %d", len(seen), n)
	}
	es := checkChain(t, h, n)
	for v, i := range seen {
		if string(es[v-1].Artifact) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Errorf("entry %d holds %s, want proposal %d's artifact", v, es[v-1].Artifact, i)
		}
	}
}

func TestQueueFull(t *testing.T) {
	g := &gate{held: make(chan struct{}, 1), open: make(chan struct{})}
	h := serve(t, newDefinition(&registry{faults: g}), `
proposals_queue = 1
commit_timeout = "30s"
commit_deadline = "30s"`)
	first := make(chan int, 1)
	go func() {
		code, _ := call(t, h, "POST", "/v1/proposals", `{"artifact":{"n":1}}`)
		first <- code
	}()
	<-g.held // the first proposal's commit is held
	code, body := call(t, h, "POST", "/v1/proposals", `{"artifact":{"n":2}}`)
	if code != 429 || errorCode(body) != "busy" {
		t.Errorf("proposal with the queue full = %d %s, want 429 busy", code, body)
	}
	close(g.open)
	if code := <-first; code != 202 {
		t.Errorf("the held proposal = %d, want 202", code)
	}
	m, err := h.Metrics(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `busy_rejections_total{endpoint="proposals"} 1`) {
		t.Errorf("metrics lack busy_rejections_total{endpoint=\"proposals\"} 1:\n%s", grep(m, "busy"))
	}
}

func TestCommitDeadline(t *testing.T) {
	g := &gate{held: make(chan struct{}, 1), open: make(chan struct{})}
	h := serve(t, newDefinition(&registry{faults: g}), `
commit_timeout = "30s"
commit_deadline = "100ms"`)
	code, body := call(t, h, "POST", "/v1/proposals", `{"artifact":{"n":1}}`)
	if code != 503 || errorCode(body) != "commit_timeout" {
		t.Errorf("proposal past its commit deadline = %d %s, want 503 commit_timeout", code, body)
	}
	close(g.open)
	m, _ := h.Metrics(t.Context())
	if !strings.Contains(m, `io_timeouts_total{op="commit"} 1`) {
		t.Errorf("metrics lack io_timeouts_total{op=\"commit\"} 1:\n%s", grep(m, "io_timeouts"))
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

var _ = base64.StdEncoding

// TestReadOnlyWithoutApprovers: a registry that declares no approver
// refuses proposals, one or a batch, with 403 read_only: none could
// commit. It still serves its log.
func TestReadOnlyWithoutApprovers(t *testing.T) {
	h := plugintest.New(t, definition(), plugintest.Options{DataDir: t.TempDir()})
	t.Cleanup(func() { _, _, _ = h.Drain(context.Background(), time.Now().Add(5*time.Second)) })
	for _, c := range []struct{ path, body string }{
		{"/v1/proposals", `{"artifact":{"a":1}}`},
		{"/v1/proposals/batch", `{"proposals":[{"artifact":{"a":1}}]}`},
	} {
		if code, body := call(t, h, "POST", c.path, c.body); code != http.StatusForbidden || errorCode(body) != "read_only" {
			t.Errorf("POST %s with no approver = %d %s, want 403 read_only", c.path, code, body)
		}
	}
	if code, body := call(t, h, "GET", "/v1/head", ""); code != http.StatusOK || !strings.Contains(body, `"version":0`) {
		t.Errorf("GET /v1/head = %d %s, want 200 at version 0", code, body)
	}
}
