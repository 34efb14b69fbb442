//go:build unix

package catalog_test

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/plughost/plughost/host/catalog"
)

// TestDataPlane checks that an SDK plugin serves the data-plane
// connections the host passes it, that they can be taken once, and that no
// launch leaves a descriptor open in the host, whether its connections were
// taken or not.
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
	if got, want := int(inst.Manifest().GetDataPlaneConns()), min(runtime.GOMAXPROCS(0), 16); got != want {
		t.Errorf("hello's Describe says it serves %d data-plane connections, want %d", got, want)
	}
	data := inst.TakeDataPlane()
	if len(data) != int(inst.Manifest().GetDataPlaneConns()) {
		t.Errorf("TakeDataPlane() = %d connections, want %d", len(data), inst.Manifest().GetDataPlaneConns())
	}
	if again := inst.TakeDataPlane(); len(again) != 0 {
		t.Errorf("second TakeDataPlane() = %d connections, want none", len(again))
	}
	for _, c := range data {
		if err := c.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	}
	inst.Kill()
	// Not taken: Kill closes them.
	launch(t, "hello", catalog.Options{}).Kill()

	// go-plugin closes some of a killed client's connections in the
	// background; a leak never closes.
	deadline := time.Now().Add(10 * time.Second)
	for after := openFDs(); after != before; after = openFDs() {
		if time.Now().After(deadline) {
			t.Fatalf("open descriptors 10s after three launches = %d, want %d as before them", after, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
