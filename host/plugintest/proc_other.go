//go:build !unix

package plugintest

import "os"

// alive reports whether pid is a live process. Off Unix the host runs no
// plugins, so Conformance fails at launch before it asks.
func alive(pid int) bool {
	_, err := os.FindProcess(pid)
	return err == nil
}

// kill ends pid.
func kill(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
