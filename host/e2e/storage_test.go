package e2e

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// corruptDetail is what frail reports after sdk.ErrStorageCorrupt.
const corruptDetail = "wallet.db.wal.1 record 17 at offset 20: checksum mismatch; restore from backup or run `wallet check -repair`"

// withDataDir returns cfg (from baseConfig) with its data_dir at dir.
func withDataDir(t *testing.T, cfg, dir string) string {
	t.Helper()
	const rel = `data_dir       = "./data"`
	if !strings.Contains(cfg, rel) {
		t.Fatalf("base config has no %s", rel)
	}
	return strings.Replace(cfg, rel, fmt.Sprintf("data_dir = %q", dir), 1)
}

// TestStorageCorrupt runs frail on a data dir it reports corrupt: the host
// serves, with frail failed, its message as last_error, and no restart;
// a reload that leaves frail's block as it is leaves frail alone; once the
// data is repaired, an operator's restart brings it up.
func TestStorageCorrupt(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(data, "frail", "corrupt")
	if err := os.WriteFile(marker, []byte(corruptDetail), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := withDataDir(t, baseConfig("5s"), data) + pluginBlock("frail", "frail", "") + helloWith("hi")
	h := startHost(t, cfg)

	want := "storage corrupt: " + corruptDetail
	var st pluginStatus
	waitFor(t, 30*time.Second, "frail to be failed", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if st.LastError != want || st.Restarts != 0 {
		t.Errorf("frail = %s, last_error %q, %d restarts; want failed, %q, 0", st.State, st.LastError, st.Restarts, want)
	}
	if code, body := h.get(h.ingress + "/frail/"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /frail/ = %d %s, want 503", code, body)
	}
	if code, body := h.greeting(); code != http.StatusOK {
		t.Errorf("GET /hello/ = %d %s, want 200: the other plugins serve", code, body)
	}
	starts := strings.Count(h.log.String(), "plugin found its storage corrupt")

	// A reload that does not change frail's block does not start it.
	h.reload(cfg+"\n", "config reloaded")
	if got := strings.Count(h.log.String(), "plugin found its storage corrupt"); got != starts {
		t.Errorf("frail found its storage corrupt %d times after a reload, want %d: the reload started it", got, starts)
	}
	if st := h.plugins()["frail"]; st.State != "failed" || st.LastError != want || st.Restarts != 0 {
		t.Errorf("frail after a reload = %s, last_error %q, %d restarts; want failed, %q, 0", st.State, st.LastError, st.Restarts, want)
	}

	// An operator's restart with the data still corrupt: failed again,
	// with the plugin's message.
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/frail/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST restart = %d %s, want 202", code, body)
	}
	waitFor(t, 30*time.Second, "frail to find its storage corrupt again", func() bool {
		return strings.Count(h.log.String(), "plugin found its storage corrupt") > starts
	})
	waitFor(t, 30*time.Second, "frail to be failed again", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if st.LastError != want {
		t.Errorf("frail last_error after a restart = %q, want %q", st.LastError, want)
	}

	// A reload that changes frail's block tries it again, and shows it
	// failed with its own message, not a replacement's story.
	changed := withDataDir(t, baseConfig("5s"), data) + pluginBlock("frail", "frail", "  env {\n    FRAIL_TRY = \"2\"\n  }") + helloWith("hi")
	before := strings.Count(h.log.String(), "plugin found its storage corrupt")
	h.reload(changed, "plugins refused their new config")
	if got := strings.Count(h.log.String(), "plugin found its storage corrupt"); got <= before {
		t.Errorf("a reload that changed frail's block did not start it")
	}
	if st := h.plugins()["frail"]; st.State != "failed" || st.LastError != want {
		t.Errorf("frail after a reload that changed it = %s, last_error %q; want failed, %q", st.State, st.LastError, want)
	}

	// Repaired: the operator's restart brings it up.
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/frail/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST restart = %d %s, want 202", code, body)
	}
	waitFor(t, 30*time.Second, "frail to serve", func() bool {
		code, _ := h.get(h.ingress + "/frail/")
		return code == http.StatusOK
	})
}

// TestExitDuringStart runs frail set to panic in Configure: its
// last_error says it exited during start, with its exit status and its
// panic message.
func TestExitDuringStart(t *testing.T) {
	data := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data, "frail"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "frail", "crash"), []byte("bucket page 7: unexpected flags"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(withDataDir(t, baseConfig("5s"), data), "max_restarts    = 5", "max_restarts    = 1", 1)
	h := startHost(t, cfg+pluginBlock("frail", "frail", ""))
	var st pluginStatus
	waitFor(t, 30*time.Second, "frail to be failed", func() bool {
		st = h.plugins()["frail"]
		return st.State == "failed"
	})
	if want := "plugin exited during start (exit status 2): panic: frail: bucket page 7: unexpected flags"; !strings.Contains(st.LastError, want) {
		t.Errorf("frail last_error = %q, want it to contain %q", st.LastError, want)
	}
}

// The wallet's storage faults (issue 12): tests with the real host and
// wallet binaries that damage, fill and stall the wallet's data dir.

// hangGuard bounds the storage tests' waits that end on what the wallet
// did (a checkpoint committed, a scrub pass completed, a start ended),
// not on how long it took: far beyond the work, so that only a stuck
// wallet reaches it, however busy the machine.
const hangGuard = 2 * time.Minute

// storageStatus is the part of GET /v1/plugins the storage tests read.
type storageStatus struct {
	Name         string `json:"name"`
	State        string `json:"state"`
	Restarts     int    `json:"restarts"`
	LastError    string `json:"last_error"`
	Health       string `json:"health"`
	HealthReason string `json:"health_reason"`
}

// storageStatusOf returns plugin's entry of GET /v1/plugins.
func storageStatusOf(t *testing.T, h *hostProc, plugin string) storageStatus {
	t.Helper()
	code, body := h.get(h.admin + "/v1/plugins")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/plugins = %d %s", code, body)
	}
	var list []storageStatus
	if err := json.Unmarshal([]byte(body), &list); err != nil {
		t.Fatalf("decode /v1/plugins: %v: %s", err, body)
	}
	for _, p := range list {
		if p.Name == plugin {
			return p
		}
	}
	t.Fatalf("GET /v1/plugins has no %s: %s", plugin, body)
	return storageStatus{}
}

// walRecords parses the write-ahead log file at path (sdk/store/wal.go:
// length(4) crc32c(4) | gen(8) index(4) entries) from offset 0 and
// returns the generation of its first record and the offsets of the
// run of records of that generation with consecutive indexes. A file
// that starts with a zero header holds no records.
func walRecords(t *testing.T, path string) (gen uint64, offsets []int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off+20 <= int64(len(b)); {
		n := int64(binary.BigEndian.Uint32(b[off:]))
		if n < 12 || off+8+n > int64(len(b)) {
			break
		}
		g := binary.BigEndian.Uint64(b[off+8:])
		idx := binary.BigEndian.Uint32(b[off+16:])
		if len(offsets) == 0 {
			gen = g
		}
		if g != gen || int(idx) != len(offsets) {
			break
		}
		offsets = append(offsets, off)
		off += 8 + n
	}
	return gen, offsets
}

// newestWAL returns the log file (of the two, wallet.db.wal and
// wallet.db.wal.1, in dir) that holds the newest generation with
// records, and the offsets of its records.
func newestWAL(t *testing.T, dir string) (string, []int64) {
	t.Helper()
	var best string
	var bestGen uint64
	var bestOffs []int64
	for _, name := range []string{"wallet.db.wal", "wallet.db.wal.1"} {
		path := filepath.Join(dir, name)
		gen, offs := walRecords(t, path)
		if len(offs) > 0 && (best == "" || gen > bestGen) {
			best, bestGen, bestOffs = path, gen, offs
		}
	}
	return best, bestOffs
}

// flipByte XORs the byte at off of path with 0xff and returns its old
// value.
func flipByte(t *testing.T, path string, off int64) byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	old := b[0]
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	return old
}

// writeByte writes v at off of path.
func writeByte(t *testing.T, path string, off int64, v byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{v}, off); err != nil {
		t.Fatal(err)
	}
}

// supplyIsSum checks that the wallet's supply equals the sum of the
// balances of accounts, which must be every account with a balance.
func supplyIsSum(t *testing.T, h *hostProc, accounts []string, minSeq uint64) supplySnap {
	t.Helper()
	s := walletSupply(t, h, minSeq)
	var sum uint64
	for _, id := range accounts {
		sum += walletAccount(t, h, id, minSeq).Balance
	}
	if sum != s.Supply {
		t.Errorf("supply = %+v, the balances sum to %d: want them equal", s, sum)
	}
	return s
}

// TestStorageCorruptRefuses flips a byte in an early record of the
// newest log generation, with acknowledged records after it, while the
// host is down: the wallet refuses to start (failed, last_error naming
// the file, record and offset, no restarts), the host serves the other
// plugins, /readyz/wallet is 503. With the byte restored, an operator's
// restart brings the wallet back with every acknowledged transfer.
func TestStorageCorruptRefuses(t *testing.T) {
	data := t.TempDir()
	cfg := withDataDir(t, baseConfig("2s"), data) + walletBlock("") + helloWith("hi")
	h := startHost(t, cfg)
	readyPlugin(t, h, "wallet")

	// Transfers from 4 workers, each acknowledged one recorded.
	const (
		workers = 4
		initial = 1_000_000
	)
	accounts := make([]string, workers)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("corrupt-%02d", i)
		walletIssue(t, h, "corrupt-issue-"+accounts[i], accounts[i], initial)
	}
	ws := transfersFrom(t, h, client, accounts, 100, 12)

	// Sequential transfers, one log record each, until the newest
	// generation holds at least 3 records (its start record and two
	// groups'): the flipped byte is in its first group's record, and an
	// acknowledged one follows it, so the damage cannot pass for a torn
	// last write. The wallet checkpoints a generation 100 ms after its
	// first group: 3 records need two transfers within that, where 4
	// would need three, which a busy machine may never give. Once the
	// oldest group is due, the checkpointer may start the next
	// generation at any moment (its start record is then the newest
	// generation's only record), so the records are counted with the
	// wallet stopped (SIGSTOP, every thread seen stopped), and the wallet
	// never runs again before the kill. If the stopped wallet's log holds
	// fewer, it continues and more transfers follow. A checkpoint the
	// stop froze midway changes nothing the test asserts: one that has
	// started the next generation shows it as the newest, with 1 record,
	// so the wallet is not killed then; one still writing the generation
	// before into wallet.db has not marked it written, so the next start
	// replays that generation's log, intact, before it meets the damaged
	// one, and refuses there.
	dir := filepath.Join(data, "wallet")
	wallet := h.plugins()["wallet"].Pid
	stopped := false
	t.Cleanup(func() {
		if stopped { // the test failed with it stopped: let it die with its host
			_ = syscall.Kill(wallet, syscall.SIGCONT)
		}
	})
	w0 := ws[0]
	rng := rand.New(rand.NewPCG(99, 99))
	var file string
	var offs []int64
	const (
		minRecords   = 3
		maxTransfers = 2000 // a bound on the work, not on its time
	)
	transfers, stops := 0, 0
	for {
		if _, peek := newestWAL(t, dir); len(peek) >= minRecords {
			stopped = true // before the stop: a failed stop leaves it to the cleanup
			stopProcess(t, wallet)
			stops++
			if file, offs = newestWAL(t, dir); len(offs) >= minRecords {
				break
			}
			if err := syscall.Kill(wallet, syscall.SIGCONT); err != nil {
				t.Fatalf("continue the wallet (pid %d): %v", wallet, err)
			}
			stopped = false
		}
		if transfers == maxTransfers {
			t.Fatalf("the newest log generation never held %d records, with the wallet stopped, in %d sequential transfers (%d stops)", minRecords, transfers, stops)
		}
		if err := w0.run(t.Context(), client, func() string { return h.ingress + "/wallet/v1/transfer" }, rng, accounts, 100, 1, nil, func(ackedTransfer) {}); err != nil {
			t.Fatal(err)
		}
		transfers++
	}
	t.Logf("with the wallet stopped, %s holds %d records of the newest generation (%d sequential transfers, %d stops)", filepath.Base(file), len(offs), transfers, stops)

	h.signal(syscall.SIGKILL)
	if _, ok := h.waitExit(5 * time.Second); !ok {
		t.Fatal("host still running 5s after SIGKILL")
	}
	// The kernel kills the stopped wallet with its host (the plugins'
	// parent-death signal is SIGKILL, which a stopped process does not
	// hold off); kill it here too, where there is no such signal.
	if err := syscall.Kill(wallet, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill -9 the stopped wallet (pid %d): %v", wallet, err)
	}
	stopped = false
	if !waitGone(wallet, 5*time.Second) {
		t.Fatalf("wallet (pid %d) still alive 5s after kill -9 of the host and of itself", wallet)
	}
	if f, o := newestWAL(t, dir); f != file || !slices.Equal(o, offs) {
		t.Fatalf("the log changed after the wallet was stopped: its newest generation was in %s with %d records, after the kill in %s with %d", filepath.Base(file), len(offs), filepath.Base(f), len(o))
	}
	// Record 0 is the generation's start record; 20 bytes into record 1
	// is its first entry byte (after its length, checksum, generation and
	// index): inside a group's record, records 2..n after it.
	flipAt := offs[1] + 20
	orig := flipByte(t, file, flipAt)
	t.Logf("flipped byte %d of %s, whose generation holds %d records", flipAt, filepath.Base(file), len(offs))

	h = startHost(t, cfg)
	var st storageStatus
	waitFor(t, hangGuard, "the wallet's start to end, failed or ready", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return st.State == "failed" || st.State == "ready"
	})
	if st.State != "failed" {
		t.Fatalf("wallet = %s after its start on a log with a damaged record 1 and records 2 to %d after it, want failed", st.State, len(offs)-1)
	}
	prefix := "storage corrupt: " + filepath.Base(file) + " record "
	if !strings.HasPrefix(st.LastError, prefix) || !regexp.MustCompile(`record \d+ at offset \d+: `).MatchString(st.LastError) {
		t.Errorf("wallet last_error = %q, want it to start %q and name the record and offset", st.LastError, prefix)
	}
	// Watched over 3 health intervals (1s each): no restart.
	watchUntil := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(watchUntil) {
		if st := storageStatusOf(t, h, "wallet"); st.State != "failed" || st.Restarts != 0 {
			t.Fatalf("wallet = %s with %d restarts, want failed with 0: a corrupt store is not restarted", st.State, st.Restarts)
		}
		time.Sleep(100 * time.Millisecond) // the pace of the watch, not a condition
	}
	if code, body := h.greeting(); code != http.StatusOK {
		t.Errorf("GET /hello/ = %d %s, want 200: the other plugins serve", code, body)
	}
	if code, state := h.readiness("wallet"); code != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz/wallet = %d %s, want 503", code, state)
	}

	// The offline check, where the wallet binary has it.
	checkCmd := exec.CommandContext(ctxTimeout(t, 20*time.Second), filepath.Join(bins.plugins, "wallet"), "check", dir)
	out, err := checkCmd.CombinedOutput()
	switch {
	case strings.Contains(string(out), "not meant to be executed directly"):
		t.Log("the wallet binary has no check command yet: skipped `wallet check`")
	case err == nil:
		t.Errorf("wallet check on the damaged data dir exited 0, want non-zero:\n%s", out)
	case !strings.Contains(string(out), filepath.Base(file)):
		t.Errorf("wallet check on the damaged data dir: %v, want it to name %s:\n%s", err, filepath.Base(file), out)
	default:
		t.Logf("wallet check: %v:\n%s", err, out)
	}

	// Repaired (the byte restored): an operator's restart brings it up
	// with every acknowledged transfer.
	writeByte(t, file, flipAt, orig)
	if code, body := do(t, http.MethodPost, h.admin+"/v1/plugins/wallet/restart", nil, nil); code != http.StatusAccepted {
		t.Fatalf("POST /v1/plugins/wallet/restart = %d %s, want 202", code, body)
	}
	readyPlugin(t, h, "wallet")
	var bad []string
	var maxSeq uint64
	for _, w := range ws {
		bad = append(bad, w.verify(t.Context(), client, h.ingress)...)
		for _, a := range w.acked {
			maxSeq = max(maxSeq, a.rc.Seq)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%d acknowledged transfers are not in the ledger as acknowledged; first ones:\n%s", len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
	if s := supplyIsSum(t, h, accounts, maxSeq); s.Supply != workers*initial {
		t.Errorf("supply = %+v, want %d", s, workers*initial)
	}
}
