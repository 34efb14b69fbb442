package e2e

import (
	"fmt"
	"strings"
	"testing"
)

// TestReloadLogsOldPid: the record of a replacement's drain names the
// process that drains, and the one that took its place.
func TestReloadLogsOldPid(t *testing.T) {
	base := baseConfig("2s")
	h := startHost(t, base+helloWith("one"))
	readyPlugin(t, h, "hello")
	old := h.plugins()["hello"].Pid
	h.reload(base+helloWith("two"), "plugin replaced; draining the old process")
	readyPlugin(t, h, "hello")
	now := h.plugins()["hello"].Pid
	if now == old {
		t.Fatalf("hello's pid after the reload = %d, the old one's; want a new process", now)
	}
	want := fmt.Sprintf("plugin replaced; draining the old process: plugin=hello pid=%d new_pid=%d", old, now)
	if !strings.Contains(h.log.String(), want) {
		t.Errorf("host log has no %q:\n%s", want, h.log.String())
	}
}
