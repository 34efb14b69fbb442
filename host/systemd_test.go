package main

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestNotifierWatchdog checks which watchdog settings the notifier keeps
// alive: systemd's WATCHDOG_USEC for this process, or for any when
// WATCHDOG_PID is unset; none for another process or a malformed value.
func TestNotifierWatchdog(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	other := strconv.Itoa(os.Getpid() + 1)
	tests := []struct {
		usec, pid string
		want      time.Duration
	}{
		{"", "", 0},
		{"500000", "", 500 * time.Millisecond},
		{"500000", self, 500 * time.Millisecond},
		{"500000", other, 0},
		{"soon", self, 0},
		{"-1", self, 0},
	}
	for _, tt := range tests {
		t.Run(tt.usec+"/"+tt.pid, func(t *testing.T) {
			// No one listens: the notifier logs its failed sends.
			t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent"))
			t.Setenv("WATCHDOG_USEC", tt.usec)
			t.Setenv("WATCHDOG_PID", tt.pid)
			n := startNotifier(hclog.NewNullLogger(), func() bool { return false })
			defer n.close()
			if n.watchdog != tt.want {
				t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: keep-alive interval basis %v, want %v", tt.usec, tt.pid, n.watchdog, tt.want)
			}
		})
	}
}

// TestNotifierUnset checks that without NOTIFY_SOCKET there is no
// notifier, and that its methods are then no-ops.
func TestNotifierUnset(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := startNotifier(hclog.NewNullLogger(), func() bool { return true })
	if n != nil {
		t.Fatalf("startNotifier without NOTIFY_SOCKET = %v, want nil", n)
	}
	n.reloading()
	n.reloaded()
	n.stopping()
	n.close()
}
