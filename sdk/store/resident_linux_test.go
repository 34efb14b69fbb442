package store

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// residentValues is how many values residentFile writes.
const residentValues = 36 << 10

// residentFile imports a store of 1 KiB values in key order, larger than
// 64 MiB, and returns its path and size. Its leaf pages hold a few values
// each, so that bbolt's free page scan at Open reads every page.
func residentFile(t *testing.T) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	v := bytes.Repeat([]byte("v"), 1024)
	err := Import(path, kvOpts, func(l *Loader) error {
		for i := range residentValues {
			if err := l.Put(0, u64(uint64(i)), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Import = %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 64<<20 {
		t.Fatalf("store file is %d bytes, want over 64 MiB", fi.Size())
	}
	return path, fi.Size()
}

// mappedRSS returns how many bytes of the memory maps of the file at
// path are resident in this process (/proc/self/smaps).
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	path, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	var rss int64
	found, in := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		// A mapping's header: address range, permissions, offset,
		// device, inode, path; its "Key: value" lines follow.
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && strings.Join(fields[5:], " ") == path
			found = found || in
			continue
		}
		if v, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("/proc/self/smaps: %q: %v", line, err)
			}
			rss += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("/proc/self/smaps has no mapping of %s", path)
	}
	return rss
}

// TestMapNotResident checks that the store's memory map of its bbolt file
// does not stay resident once Open's free page scan, and a pass of
// Scrub, have read every page of it: those pages are page cache, but
// they would count in the plugin's RSS, and a store's file is far larger
// than its working set.
func TestMapNotResident(t *testing.T) {
	path, size := residentFile(t)
	d, err := Open(path, kvOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	limit := size / 16
	if rss := mappedRSS(t, path); rss > limit {
		t.Errorf("after Open, %d bytes of the %d-byte file's map are resident, want at most %d", rss, size, limit)
	}
	checked := 0
	for {
		st, err := d.Scrub(4096)
		if err != nil {
			t.Fatalf("Scrub = %v", err)
		}
		checked += st.Checked
		if st.Wrapped {
			break
		}
	}
	if want := residentValues; checked < want {
		t.Fatalf("a pass of Scrub checked %d values, want at least %d", checked, want)
	}
	if rss := mappedRSS(t, path); rss > limit {
		t.Errorf("after a pass of Scrub, %d bytes of the %d-byte file's map are resident, want at most %d", rss, size, limit)
	}
}
