package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plughost/plughost/host/plugintest"
)

// guideNotes marks the plugin guide's complete stateful plugin.
const guideNotes = "<!-- guide: notes.go -->"

// TestGuideNotesPlugin builds the plugin guide's stateful plugin, notes,
// from the guide's text, and holds it to what the guide says of it: it
// passes the conformance kit with the durability check (kill -9 under
// concurrent writes, every acknowledged note read back); through a real
// host, a put is answered 201, its retry with the same Idempotency-Key
// gets the same bytes with Idempotent-Replayed, also after the host is
// killed with SIGKILL and started again, and the same key with another
// note gets 422; and its check subcommand finds the stopped data dir
// healthy.
func TestGuideNotesPlugin(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(root, "docs", "plugin-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	for _, b := range fencedBlocks(t, string(src)) {
		blocks[b.marker] = append(blocks[b.marker], b.body)
	}
	if len(blocks[guideNotes]) != 1 || len(blocks[guideGoMod]) != 1 {
		t.Fatalf("docs/plugin-guide.md has %d blocks after %s and %d after %s, want 1 each", len(blocks[guideNotes]), guideNotes, len(blocks[guideGoMod]), guideGoMod)
	}
	bin := buildGuidePlugin(t, root, blocks[guideNotes][0]+"\n", blocks[guideGoMod][0], "go build -o notes .")

	t.Run("conformance", func(t *testing.T) {
		plugintest.Conformance(t, bin, "", plugintest.Durability(
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, body, err := do(ctx, "PUT", fmt.Sprintf("/notes/n%d", i), http.Header{"Idempotency-Key": {fmt.Sprint("k", i)}}, fmt.Appendf(nil, "note %d", i))
				if err == nil && code != http.StatusCreated {
					err = fmt.Errorf("PUT answered %d %s", code, body)
				}
				return err
			},
			func(ctx context.Context, do plugintest.Do, i int) error {
				code, body, err := do(ctx, "GET", fmt.Sprintf("/notes/n%d", i), nil, nil)
				if err == nil && (code != http.StatusOK || string(body) != fmt.Sprintf("note %d", i)) {
					err = fmt.Errorf("GET answered %d %s", code, body)
				}
				return err
			}))
	})

	t.Run("host", func(t *testing.T) {
		data := t.TempDir()
		cfg := fmt.Sprintf("listen = \"127.0.0.1:0\"\ndata_dir = %q\nplugin_dir = %q\nadmin {\n  listen = \"127.0.0.1:0\"\n}\n\nplugin \"notes\" {\n  path = \"notes\"\n}\n",
			data, filepath.Dir(bin))
		h := startHost(t, cfg)
		readyPlugin(t, h, "notes")
		put := func(h *hostProc, key, note string) (int, string, http.Header) {
			t.Helper()
			req, err := http.NewRequestWithContext(t.Context(), "PUT", h.ingress+"/notes/notes/n1", strings.NewReader(note))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp.StatusCode, string(b), resp.Header
		}
		code, first, _ := put(h, "k1", "buy milk")
		if code != http.StatusCreated || first != "{\"id\":\"n1\",\"bytes\":8}\n" {
			t.Fatalf("PUT = %d %q, want 201 and the guide's answer", code, first)
		}
		if code, body := h.get(h.ingress + "/notes/notes/n1"); code != http.StatusOK || body != "buy milk" {
			t.Errorf("GET = %d %q, want 200 buy milk", code, body)
		}
		replay := func(h *hostProc, when string) {
			t.Helper()
			code, body, hdr := put(h, "k1", "buy milk")
			if code != http.StatusCreated || body != first || hdr.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry %s = %d %q (Idempotent-Replayed %q), want the first answer replayed", when, code, body, hdr.Get("Idempotent-Replayed"))
			}
		}
		replay(h, "while running")
		if code, body, _ := put(h, "k1", "buy bread"); code != http.StatusUnprocessableEntity {
			t.Errorf("the same key with another note = %d %s, want 422", code, body)
		}

		h.signal(syscall.SIGKILL)
		if _, ok := h.waitExit(10 * time.Second); !ok {
			t.Fatal("the host did not exit after SIGKILL")
		}
		waitFor(t, 10*time.Second, "the killed host's plugin to exit", func() bool {
			for _, pid := range h.pluginPidsFromLog() {
				if syscall.Kill(pid, 0) == nil {
					return false
				}
			}
			return true
		})
		again := startHost(t, cfg)
		readyPlugin(t, again, "notes")
		replay(again, "after kill -9 and a restart")

		again.signal(syscall.SIGTERM)
		if code, ok := again.waitExit(30 * time.Second); !ok || code != 0 {
			t.Fatalf("the host's exit after SIGTERM = %d, %t; want 0", code, ok)
		}
		out, err := exec.CommandContext(t.Context(), bin, "check", filepath.Join(data, "notes")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "healthy") {
			t.Errorf("notes check of the stopped data dir = %v:\n%s\nwant healthy", err, out)
		}
	})
}
