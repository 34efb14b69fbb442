package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestRewarderLargeEpochAtDefaultLimit runs the real host, wallet and
// rewarder with the host-wide max_body_bytes at its 1 MiB default: an
// epoch of over 1 MiB is taken by the compute route's own limit (16 MiB)
// and settles; a Content-Length over that limit is answered 413 at once,
// without a 100 Continue; and a reload that sets max_body_bytes in the
// rewarder's block replaces the rewarder and caps the route at it.
func TestRewarderLargeEpochAtDefaultLimit(t *testing.T) {
	const computeLimit = 16 << 20
	base := strings.Replace(baseConfig("5s"), "  max_body_bytes  = 4096\n", "", 1)
	if strings.Contains(base, "max_body_bytes") {
		t.Fatalf("the config still sets max_body_bytes:\n%s", base)
	}
	rewarder := func(extra string) string {
		return pluginBlock("rewarder", "rewarder", extra+"  config {\n    rescan = \"100ms\"\n  }")
	}
	h := startHost(t, base+walletBlock("")+rewarder(""))
	readyPlugin(t, h, "wallet")
	first := readyPlugin(t, h, "rewarder")
	ctJSON := http.Header{"Content-Type": {"application/json"}}

	const pool, n = 1_000_000_007, 40_000 // 40 batch parts
	if code, body := do(t, "POST", h.ingress+"/wallet/v1/issue", strings.NewReader(fmt.Sprintf(`{"to":"pool","amount":%d}`, pool)),
		http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {"fund-pool"}}); code != http.StatusOK {
		t.Fatalf("issue to the pool = %d %s", code, body)
	}
	body := rewarderInputs("big", pool, n)
	if len(body) <= 1<<20 {
		t.Fatalf("the epoch's body is %d bytes, want over the host's 1 MiB default", len(body))
	}
	if code, resp := do(t, "POST", h.ingress+"/rewarder/v1/epochs/big/compute", strings.NewReader(body), ctJSON); code != http.StatusAccepted {
		t.Fatalf("POST /rewarder/v1/epochs/big/compute with %d bytes = %d %s, want 202", len(body), code, resp)
	}
	waitFor(t, 90*time.Second, "epoch big settled", func() bool {
		code, resp := h.get(h.ingress + "/rewarder/v1/epochs/big")
		var m rewarderManifest
		return code == http.StatusOK && jsonDecode(resp, &m) && m.State == "settled" && m.PayoutsTotal == pool
	})

	// Over the route's limit: the 413 comes before any of the body.
	if code, resp := declareOnly(t, h.ingress, "/rewarder/v1/epochs/over/compute", computeLimit+1); code != http.StatusRequestEntityTooLarge ||
		!strings.Contains(resp, fmt.Sprintf("the limit is %d", computeLimit)) {
		t.Errorf("POST /rewarder/v1/epochs/over/compute declaring %d bytes = %d %s, want 413 naming the route's limit of %d at once",
			computeLimit+1, code, resp, computeLimit)
	}

	// The operator caps the plugin at 1 MiB: the reload replaces it.
	h.reload(base+walletBlock("")+rewarder("  max_body_bytes = 1048576\n"), "config reloaded")
	waitFor(t, 30*time.Second, "the rewarder replaced", func() bool {
		st := h.plugins()["rewarder"]
		return st.State == "ready" && st.Pid > 0 && st.Pid != first.Pid
	})
	if code, resp := do(t, "POST", h.ingress+"/rewarder/v1/epochs/big2/compute", strings.NewReader(body), ctJSON); code != http.StatusRequestEntityTooLarge ||
		!strings.Contains(resp, "the limit is 1048576") {
		t.Errorf("POST /rewarder/v1/epochs/big2/compute with %d bytes under a 1 MiB plugin block = %d %s, want 413 naming 1048576", len(body), code, resp)
	}
	if !strings.Contains(h.log.String(), "route body limit capped by the plugin block's max_body_bytes") {
		t.Errorf("host log has no line on the capped route limit:\n%s", h.log.String())
	}
}

// declareOnly sends the head of POST path to the ingress at base,
// declaring a body of length bytes and asking to send it after a 100
// Continue, and returns the first answer's status and body: a server that
// wants the body answers 100 first.
func declareOnly(t *testing.T, base, path string, length int) (int, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", path, length); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer to POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
