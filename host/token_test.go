package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plughost/plughost/host/internal/testbin"
)

// TestTokenFileMode: validate and run refuse an admin token file that
// other users can read or change, as ssh refuses such a key, with a
// diagnostic at the token_file attribute that names the file, its mode
// and the fix.
func TestTokenFileMode(t *testing.T) {
	tests := []struct {
		name    string
		mode    fs.FileMode // 0: no file at all
		dir     bool
		content string   // "": "s3cret\n"
		wantErr []string // empty: valid
		runOnly bool     // validate does not read the token
	}{
		{name: "owner only", mode: 0o600},
		{name: "owner read-only", mode: 0o400},
		{name: "world readable", mode: 0o644, wantErr: []string{"Admin token file open to other users", "has mode 0644", "chmod 600"}},
		{name: "group readable", mode: 0o640, wantErr: []string{"Admin token file open to other users", "has mode 0640", "chmod 600"}},
		{name: "others readable", mode: 0o604, wantErr: []string{"has mode 0604", "chmod 600"}},
		{name: "group writable", mode: 0o620, wantErr: []string{"has mode 0620", "chmod 600"}},
		{name: "missing", wantErr: []string{"Unreadable admin token file", "no such file"}},
		{name: "a directory", mode: 0o700, dir: true, wantErr: []string{"Unreadable admin token file", "not a regular file"}},
		{name: "empty", mode: 0o600, content: " \n\n", wantErr: []string{"Empty admin token file"}, runOnly: true},
		{name: "two lines", mode: 0o600, content: "s3cret\nmore\n", wantErr: []string{"Admin token cannot be sent", "line break"}, runOnly: true},
		{name: "a NUL inside", mode: 0o600, content: "s3\x00cret", wantErr: []string{"Admin token cannot be sent"}, runOnly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			token := filepath.Join(t.TempDir(), "admin.token")
			switch {
			case tt.dir:
				if err := os.Mkdir(token, tt.mode); err != nil {
					t.Fatal(err)
				}
			case tt.mode != 0:
				content := tt.content
				if content == "" {
					content = "s3cret\n"
				}
				if err := os.WriteFile(token, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(token, tt.mode); err != nil { // not subject to the umask
					t.Fatal(err)
				}
			}
			// Should run not refuse it, it serves on ports of its own until
			// the context ends.
			cfg := writeConfig(t, fmt.Sprintf("listen = \"127.0.0.1:0\"\nadmin {\n  listen     = \"127.0.0.1:0\"\n  token_file = %q\n}\n", token))
			cmds := []string{"validate"}
			if len(tt.wantErr) > 0 {
				cmds = append(cmds, "run") // refused before it listens
			}
			for _, cmd := range cmds {
				if tt.runOnly && cmd == "validate" {
					continue
				}
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				var out, errOut testbin.SyncBuffer
				err := run(ctx, []string{cmd, "-config", cfg}, &out, &errOut)
				cancel()
				stdout, stderr := out.String(), errOut.String()
				if len(tt.wantErr) == 0 {
					if err != nil || !strings.Contains(stdout, "valid (0 plugins)") {
						t.Errorf("%s with a %04o token file = %v, stdout %q, stderr %s; want valid", cmd, tt.mode, err, stdout, stderr)
					}
					continue
				}
				if !errors.Is(err, errReported) {
					t.Errorf("%s = %v, want errReported", cmd, err)
				}
				if loc := fmt.Sprintf("%s:%d:", cfg, lineOf(t, cfg, "token_file")); !strings.Contains(stderr, loc) {
					t.Errorf("%s stderr = %s\nwant a diagnostic at %s", cmd, stderr, loc)
				}
				for _, w := range append(tt.wantErr, token) {
					if !strings.Contains(stderr, w) {
						t.Errorf("%s stderr = %s\nwant it to contain %q", cmd, stderr, w)
					}
				}
			}
		})
	}
}
