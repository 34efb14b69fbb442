package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
)

// The flip tests (issue 17) damage one byte of the wallet's bbolt file
// where no value checksum covers it (the store's own keys, a leaf page's
// element header) in a data dir a kill -9 left, and hold the real host
// and wallet to one contract: the host stays up and the other plugins
// serve; the wallet is failed, or degraded, with a reason that names the
// damage; and no acknowledged receipt is denied. Each one answers 200
// with the receipt that was acknowledged, or a 5xx that says the storage
// is corrupt, never 404.

// boltFile is a bbolt file read whole, with the page size and the root
// of the tree of its live meta page (the valid one with the highest
// transaction id, as bbolt itself picks). Its layout is bbolt's, in the
// machine's byte order: a page starts with a 16-byte header {id u64,
// flags u16, count u16, overflow u32}; a leaf page's elements are
// {flags u32, pos u32, ksize u32, vsize u32}, a branch page's {pos u32,
// ksize u32, pgid u64}, each pos counted from the element's own start; a
// bucket's value is {root pgid u64, sequence u64}, followed, when root
// is 0, by the bucket's one inline leaf page.
type boltFile struct {
	b        []byte
	pageSize int
	root     uint64 // page id of the root bucket's tree
}

const (
	boltPageHeader = 16
	boltElement    = 16
	boltBranchPage = 0x01
	boltLeafPage   = 0x02
	boltBucketElem = 0x01 // a leaf element that is a nested bucket
	boltMagic      = 0xED0CDAED
)

var ne = binary.NativeEndian

// readBolt reads the bbolt file at path and finds its live meta page.
func readBolt(t *testing.T, path string) *boltFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &boltFile{b: b}
	var txid uint64
	found := false
	// The page size is in the first meta page; the second is one page on.
	for i := range 2 {
		off := boltPageHeader
		if i == 1 {
			off += f.pageSize
		}
		if off+64 > len(b) || ne.Uint32(b[off:]) != boltMagic {
			continue
		}
		h := fnv.New64a()
		h.Write(b[off : off+56])
		if h.Sum64() != ne.Uint64(b[off+56:]) {
			continue
		}
		if i == 0 {
			f.pageSize = int(ne.Uint32(b[off+8:]))
		}
		if tx := ne.Uint64(b[off+48:]); !found || tx > txid {
			txid, f.root, found = tx, ne.Uint64(b[off+16:]), true
		}
	}
	if !found || f.pageSize == 0 {
		t.Fatalf("%s: no valid bbolt meta page", path)
	}
	return f
}

// boltElem is one element of a leaf page: its header's offset in the
// file, its flags, and its key and value (slices of the file's bytes)
// with their offsets.
type boltElem struct {
	hdr            int
	flags          uint32
	key, value     []byte
	keyOff, valOff int
}

// leafPage returns the elements of the leaf page at file offset off.
func (f *boltFile) leafPage(t *testing.T, off int) []boltElem {
	t.Helper()
	if flags := ne.Uint16(f.b[off+8:]); flags != boltLeafPage {
		t.Fatalf("page at offset %d has flags %#x, want a leaf page (%#x)", off, flags, boltLeafPage)
	}
	n := int(ne.Uint16(f.b[off+10:]))
	elems := make([]boltElem, n)
	for i := range elems {
		e := off + boltPageHeader + i*boltElement
		pos, ksize, vsize := int(ne.Uint32(f.b[e+4:])), int(ne.Uint32(f.b[e+8:])), int(ne.Uint32(f.b[e+12:]))
		k := e + pos
		elems[i] = boltElem{hdr: e, flags: ne.Uint32(f.b[e:]), keyOff: k, valOff: k + ksize,
			key: f.b[k : k+ksize], value: f.b[k+ksize : k+ksize+vsize]}
	}
	return elems
}

// leaves returns the file offsets of the leaf pages of the tree whose
// root is page root, in key order.
func (f *boltFile) leaves(t *testing.T, root uint64) []int {
	t.Helper()
	off := int(root) * f.pageSize
	switch flags := ne.Uint16(f.b[off+8:]); flags {
	case boltLeafPage:
		return []int{off}
	case boltBranchPage:
		var out []int
		for i := range int(ne.Uint16(f.b[off+10:])) {
			e := off + boltPageHeader + i*boltElement
			out = append(out, f.leaves(t, ne.Uint64(f.b[e+8:]))...)
		}
		return out
	default:
		t.Fatalf("page %d has flags %#x, want a branch or leaf page", root, flags)
		return nil
	}
}

// bucketLeaves returns the file offsets of the leaf pages that hold
// bucket name's keys: its inline page, or its tree's leaves.
func (f *boltFile) bucketLeaves(t *testing.T, name string) []int {
	t.Helper()
	for _, off := range f.leaves(t, f.root) {
		for _, e := range f.leafPage(t, off) {
			if e.flags&boltBucketElem == 0 || string(e.key) != name {
				continue
			}
			if root := ne.Uint64(e.value); root != 0 {
				return f.leaves(t, root)
			}
			return []int{e.valOff + 16}
		}
	}
	t.Fatalf("no bucket %q in the root bucket's tree", name)
	return nil
}

// bucketElem returns the live element of key in bucket name.
func (f *boltFile) bucketElem(t *testing.T, name, key string) boltElem {
	t.Helper()
	for _, off := range f.bucketLeaves(t, name) {
		for _, e := range f.leafPage(t, off) {
			if string(e.key) == key {
				return e
			}
		}
	}
	t.Fatalf("no key %q in bucket %q", key, name)
	return boltElem{}
}

// boltGet reads key of bucket from the bbolt file at path with bbolt
// itself, read-only: what the parsing above found must be what bbolt
// reads.
func boltGet(t *testing.T, path, bucket string, key []byte) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open %s read-only: %v", path, err)
	}
	defer db.Close()
	var v []byte
	if err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucket))
		if b == nil {
			return fmt.Errorf("no bucket %q", bucket)
		}
		v = bytes.Clone(b.Get(key))
		return nil
	}); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return v
}

// boltSeqs returns the receipt seqs (keys of bucket receipts) in the
// bbolt file at path, read with bbolt itself.
func boltSeqs(t *testing.T, path string) map[uint64]bool {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatalf("open %s read-only: %v", path, err)
	}
	defer db.Close()
	seqs := map[uint64]bool{}
	if err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("receipts"))
		if b == nil {
			return errors.New("no bucket receipts")
		}
		return b.ForEach(func(k, _ []byte) error {
			seqs[binary.BigEndian.Uint64(k)] = true
			return nil
		})
	}); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return seqs
}

// copyFile copies src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// copyWalletDir copies the wallet's files of data dir src into a new
// data dir and returns it.
func copyWalletDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dst, "wallet"), 0o750); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(src, "wallet"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			copyFile(t, filepath.Join(src, "wallet", e.Name()), filepath.Join(dst, "wallet", e.Name()))
		}
	}
	return dst
}

// ackedReceipt is a receipt the wallet acknowledged.
type ackedReceipt struct {
	what string // the request, for messages
	rc   receipt
}

// killedWalletDir runs the host with the wallet and hello, acknowledges a
// few hundred transfers, and kills the host and the wallet with SIGKILL
// while at least one acknowledged group is in the write-ahead log only
// (its receipt not yet in wallet.db): a crash-consistent data dir whose
// store is marked open. It returns the data dir, the config top it was
// run with (baseConfig, data_dir set) and every acknowledged receipt.
func killedWalletDir(t *testing.T) (string, []ackedReceipt) {
	t.Helper()
	data := t.TempDir()
	h := startHost(t, withDataDir(t, baseConfig("2s"), data)+walletBlock("")+helloWith("hi"))
	readyPlugin(t, h, "wallet")

	const (
		workers   = 4
		perWorker = 75
		initial   = 1_000_000
	)
	var acked []ackedReceipt
	accounts := make([]string, workers)
	for i := range accounts {
		accounts[i] = fmt.Sprintf("flip-%02d", i)
		rc := walletIssue(t, h, "flip-issue-"+accounts[i], accounts[i], initial)
		acked = append(acked, ackedReceipt{"issue to " + accounts[i], rc})
	}
	ws := transfersFrom(t, h, client, accounts, perWorker, 17)
	// Every group so far checkpointed into the bbolt file, so that the
	// receipts fill several of its leaf pages whatever the machine's pace:
	// the log-only group the loop below looks for comes after them.
	waitFor(t, 15*time.Second, "the acknowledged transfers checkpointed into wallet.db", func() bool {
		lag, ok := h.metric(`wallet_checkpoint_lag_seconds{plugin="wallet"}`)
		return ok && lag == 0
	})

	// One more transfer at a time, each followed by a stop of the wallet
	// (SIGSTOP, every thread seen stopped), until the stopped wallet's
	// bbolt file lacks an acknowledged receipt: its group is in the log
	// only, where a store that took itself for closed cleanly would not
	// look. The checkpoint that writes a group into the file runs about
	// 100 ms after a generation's first group, so the first try nearly
	// always finds one.
	dir := filepath.Join(data, "wallet")
	wallet := h.plugins()["wallet"].Pid
	stopped := false
	t.Cleanup(func() {
		if stopped { // the test failed with it stopped: let it die with its host
			_ = syscall.Kill(wallet, syscall.SIGCONT)
		}
	})
	rng := rand.New(rand.NewPCG(99, 17))
	const maxTries = 200 // a bound on the work, not on its time
	var logOnly int
	for try := 0; ; try++ {
		if try == maxTries {
			t.Fatalf("in %d tries, the stopped wallet's bbolt file always held every acknowledged receipt", maxTries)
		}
		url := func() string { return h.ingress + "/wallet/v1/transfer" }
		if err := ws[0].run(t.Context(), client, url, rng, accounts, 100, 1, nil, func(ackedTransfer) {}); err != nil {
			t.Fatal(err)
		}
		stopped = true // before the stop: a failed stop leaves it to the cleanup
		stopProcess(t, wallet)
		snap := filepath.Join(t.TempDir(), "wallet.db")
		copyFile(t, filepath.Join(dir, "wallet.db"), snap)
		inFile := boltSeqs(t, snap)
		logOnly = 0
		for _, w := range ws {
			for _, a := range w.acked {
				if !inFile[a.rc.Seq] {
					logOnly++
				}
			}
		}
		if logOnly > 0 {
			break
		}
		if err := syscall.Kill(wallet, syscall.SIGCONT); err != nil {
			t.Fatalf("continue the wallet (pid %d): %v", wallet, err)
		}
		stopped = false
	}
	for _, w := range ws {
		for _, a := range w.acked {
			acked = append(acked, ackedReceipt{"transfer " + a.body, a.rc})
		}
	}
	t.Logf("%d receipts acknowledged, %d of them in the write-ahead log only", len(acked), logOnly)

	h.signal(syscall.SIGKILL)
	if _, ok := h.waitExit(5 * time.Second); !ok {
		t.Fatal("host still running 5s after SIGKILL")
	}
	if err := syscall.Kill(wallet, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("kill -9 the stopped wallet (pid %d): %v", wallet, err)
	}
	stopped = false
	if !waitGone(wallet, 5*time.Second) {
		t.Fatalf("wallet (pid %d) still alive 5s after kill -9 of the host and of itself", wallet)
	}
	return data, acked
}

// TestStorageFlip flips one byte (XOR 0xff) of the wallet's bbolt file,
// in a copy of a data dir a kill -9 left with acknowledged groups in the
// log, where no value's checksum covers it, and starts the host on it:
// the host stays up and hello answers; the wallet is failed or degraded
// with a reason that names the damage; every acknowledged receipt
// answers 200 with itself or a 5xx storage-corrupt error, never 404.
func TestStorageFlip(t *testing.T) {
	killed, acked := killedWalletDir(t)
	seqs := map[uint64]bool{}
	for _, a := range acked {
		seqs[a.rc.Seq] = true
	}

	tests := []struct {
		name string
		// at returns the offset of the byte to flip in the bbolt file
		// at path, and says what it is.
		at func(t *testing.T, path string) (int64, string)
	}{
		{"store-open-flag", func(t *testing.T, path string) (int64, string) {
			e := readBolt(t, path).bucketElem(t, "store", "open")
			// The store's values are framed: crc32c(4), then the number.
			if got := boltGet(t, path, "store", []byte("open")); !bytes.Equal(got, e.value) || len(e.value) != 12 {
				t.Fatalf("store open: parsed %x, bbolt reads %x", e.value, got)
			}
			if binary.BigEndian.Uint64(e.value[4:]) != 1 {
				t.Fatalf("store open = %x in a data dir a kill -9 left, want 1", e.value)
			}
			// The low byte: 1 becomes 0xfe, which is not "open".
			return int64(e.valOff + 11), fmt.Sprintf("the low byte of the value of key \"open\" (%x) in bucket store", e.value)
		}},
		{"receipt-leaf-element-ksize", func(t *testing.T, path string) (int64, string) {
			f := readBolt(t, path)
			leaves := f.bucketLeaves(t, "receipts")
			if len(leaves) < 3 {
				t.Fatalf("bucket receipts has %d leaf pages, want >= 3 (one inside the tree, where the log's replay does not rewrite it)", len(leaves))
			}
			leaf := leaves[len(leaves)/2]
			elems := f.leafPage(t, leaf)
			e := elems[len(elems)/2]
			seq := binary.BigEndian.Uint64(e.key)
			if !seqs[seq] {
				t.Fatalf("receipt %d in leaf page %d is not one the test acknowledged", seq, leaf/f.pageSize)
			}
			if got := boltGet(t, path, "receipts", e.key); !bytes.Equal(got, e.value) {
				t.Fatalf("receipt %d: parsed %q, bbolt reads %q", seq, e.value, got)
			}
			// ksize's low byte: 8 becomes 0xf7.
			ksize := e.hdr + 8
			if ne.Uint16([]byte{0, 1}) == 1 { // big-endian
				ksize += 3
			}
			return int64(ksize), fmt.Sprintf("the low byte of ksize (8) of the element header of receipt seq %d, element %d of %d in leaf page %d (leaf %d of %d of bucket receipts)",
				seq, len(elems)/2, len(elems), leaf/f.pageSize, len(leaves)/2, len(leaves))
		}},
		{"store-format", func(t *testing.T, path string) (int64, string) {
			e := readBolt(t, path).bucketElem(t, "store", "format")
			if got := boltGet(t, path, "store", []byte("format")); !bytes.Equal(got, e.value) || len(e.value) != 12 {
				t.Fatalf("store format: parsed %x, bbolt reads %x", e.value, got)
			}
			return int64(e.valOff + 11), fmt.Sprintf("the low byte of the value of key \"format\" (%x) in bucket store", e.value)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := copyWalletDir(t, killed)
			db := filepath.Join(data, "wallet", "wallet.db")
			off, what := tt.at(t, db)
			old := flipByte(t, db, off)
			t.Logf("flipped byte %d of wallet.db (%#02x to %#02x): %s", off, old, old^0xff, what)
			h := startHost(t, withDataDir(t, baseConfig("2s"), data)+walletBlock("")+helloWith("hi"))
			checkFlipped(t, h, acked)
		})
	}
}

// checkFlipped holds h, started on a damaged wallet data dir, to the
// flip tests' contract, and logs what the wallet shows.
func checkFlipped(t *testing.T, h *hostProc, acked []ackedReceipt) {
	t.Helper()
	var st storageStatus
	// A start that fails in another way is retried with its last_error.
	waitFor(t, hangGuard, "the wallet's start to end: failed, ready, or retried with a last_error", func() bool {
		st = storageStatusOf(t, h, "wallet")
		return st.State == "failed" || st.State == "ready" || st.Restarts > 0 && st.LastError != ""
	})
	t.Logf("wallet after its start: %s, %d restarts, last_error %q, health %q %q", st.State, st.Restarts, st.LastError, st.Health, st.HealthReason)

	// Right after the start, before a scrub pass could have found the
	// damage, and once more after the wallet has settled.
	checkReceipts(t, h, acked, "after the start")

	if st.State == "ready" {
		// The scrubber verifies every value of the file in passes; two
		// passes completed after the start have met any damage it can
		// see.
		passes := func() float64 {
			v, _ := h.metric(`wallet_scrub_passes_total{plugin="wallet"}`)
			return v
		}
		from := passes()
		waitFor(t, hangGuard, "the wallet to turn degraded or the scrubber to complete two passes", func() bool {
			st = storageStatusOf(t, h, "wallet")
			return st.State != "ready" || st.Health == "degraded" || passes() >= from+2
		})
		t.Logf("wallet after %v scrub passes: %s, %d restarts, last_error %q, health %q %q", passes()-from, st.State, st.Restarts, st.LastError, st.Health, st.HealthReason)
	}
	names := func(s string) bool { return strings.Contains(s, "storage corrupt") && strings.Contains(s, "wallet.db") }
	switch {
	case st.State == "failed" && names(st.LastError):
	case st.State == "ready" && st.Health == "degraded" && names(st.HealthReason):
	default:
		t.Errorf("wallet = %s, %d restarts, last_error %q, health %q %q; want failed with a last_error, or degraded with a health_reason, that says its storage is corrupt and names wallet.db",
			st.State, st.Restarts, st.LastError, st.Health, st.HealthReason)
	}
	checkReceipts(t, h, acked, "once the wallet settled")

	select {
	case <-h.exited:
		t.Errorf("the host exited (%v) on a damaged wallet data dir, want it to stay up", h.exitErr)
	default:
	}
	if code, body := h.greeting(); code != http.StatusOK {
		t.Errorf("GET /hello/ = %d %s, want 200: the other plugins serve", code, body)
	}
}

// checkReceipts GETs every acknowledged receipt: each must answer 200
// with the receipt acknowledged, or a 5xx JSON error that says the
// storage is corrupt (the wallet's 500 storage_corrupt, or the host's 503
// while the wallet is failed with a storage-corrupt last_error); never
// 404, nor anything else.
func checkReceipts(t *testing.T, h *hostProc, acked []ackedReceipt, when string) {
	t.Helper()
	counts := map[string]int{}
	var bad []string
	var unavailable []string
	for _, a := range acked {
		code, body := h.get(h.ingress + "/wallet/v1/receipts/" + a.rc.TxID)
		ec := errorCode(body)
		counts[fmt.Sprintf("%d %s", code, ec)]++
		switch {
		case code == http.StatusOK:
			var got receipt
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				bad = append(bad, fmt.Sprintf("GET receipt %s (seq %d, %s) = 200 %s: %v", a.rc.TxID, a.rc.Seq, a.what, strings.TrimSpace(body), err))
			} else if d := cmp.Diff(a.rc, got); d != "" {
				bad = append(bad, fmt.Sprintf("GET receipt %s (seq %d, %s) = 200 with another receipt (-acked +got):\n%s", a.rc.TxID, a.rc.Seq, a.what, d))
			}
		case code >= 500 && ec == "storage_corrupt":
		case code == http.StatusServiceUnavailable && ec == "plugin_unavailable":
			unavailable = append(unavailable, fmt.Sprintf("GET receipt %s (seq %d, %s) = %d %s", a.rc.TxID, a.rc.Seq, a.what, code, strings.TrimSpace(body)))
		default:
			bad = append(bad, fmt.Sprintf("GET receipt %s (seq %d, %s) = %d %s, want 200 with the acknowledged receipt or a 5xx storage_corrupt", a.rc.TxID, a.rc.Seq, a.what, code, strings.TrimSpace(body)))
		}
	}
	if len(unavailable) > 0 {
		// The host's 503 says the storage is corrupt only while the
		// wallet is failed for that reason.
		if st := storageStatusOf(t, h, "wallet"); st.State != "failed" || !strings.Contains(st.LastError, "storage corrupt") {
			bad = append(bad, fmt.Sprintf("%d answered 503 plugin_unavailable with the wallet %s, last_error %q, which does not say its storage is corrupt; want 200 with the acknowledged receipt or a 5xx storage_corrupt; first: %s",
				len(unavailable), st.State, st.LastError, unavailable[0]))
		}
	}
	var summary []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		summary = append(summary, fmt.Sprintf("%s: %d", k, counts[k]))
	}
	t.Logf("GET of the %d acknowledged receipts %s: %s", len(acked), when, strings.Join(summary, ", "))
	if len(bad) > 0 {
		t.Errorf("of the %d acknowledged receipts, some %s are denied or wrong (problems: %d); first ones:\n%s", len(acked), when, len(bad), strings.Join(bad[:min(len(bad), 10)], "\n"))
	}
}
