//go:build unix

package catalog_test

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/dataplane"
)

// TestDataPlane checks that an SDK plugin serves every data-plane
// connection the host passes it, that Kill ends them, and that no launch
// leaves a descriptor open in the host.
func TestDataPlane(t *testing.T) {
	openFDs := func() int {
		t.Helper()
		ents, err := os.ReadDir("/dev/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// A first launch and kill, so that what the process keeps for good
	// (go-plugin's and the runtime's) is open before counting.
	launch(t, "hello", catalog.Options{}).Kill()
	before := openFDs()

	inst := launch(t, "hello", catalog.Options{})
	if got, want := inst.Transport().Live(), min(runtime.GOMAXPROCS(0), 16); got != want {
		t.Errorf("Transport().Live() = %d data-plane connections, want %d, one per host CPU", got, want)
	}
	// Every connection carries requests: one at a time in turn.
	for i := range 2 * inst.Transport().Live() {
		if code, _, err := get(t.Context(), inst.Transport(), "/"); err != nil || code != 200 {
			t.Errorf("request %d over the data plane = %d, %v, want 200", i, code, err)
		}
	}
	inst.Kill()
	select {
	case <-inst.Transport().Done():
	default:
		t.Error("Transport().Done() is open after Kill")
	}
	if _, _, err := get(t.Context(), inst.Transport(), "/"); !errors.Is(err, dataplane.ErrUnavailable) {
		t.Errorf("a request after Kill = %v, want dataplane.ErrUnavailable", err)
	}
	launch(t, "hello", catalog.Options{}).Kill()

	// go-plugin closes some of a killed client's connections in the
	// background; a leak never closes.
	deadline := time.Now().Add(10 * time.Second)
	for after := openFDs(); after > before; after = openFDs() {
		if time.Now().After(deadline) {
			t.Fatalf("open descriptors 10s after three launches = %d, want at most the %d before them", after, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
