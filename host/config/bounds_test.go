package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// nest returns an attribute whose value nests open n times around 1.
func nest(n int, open, close string) string {
	return "x = " + strings.Repeat(open, n) + "1" + strings.Repeat(close, n) + "\n"
}

// chain returns an attribute whose value is 1 followed by n copies of op.
func chain(n int, op string) string {
	return "x = 1" + strings.Repeat(op, n) + "\n"
}

// TestCheckBounds pins each bound at its edge: a file exactly at it passes,
// one step beyond is refused, at the token that crosses it.
func TestCheckBounds(t *testing.T) {
	heredoc := "x = <<EOT\n" + strings.Repeat("a line of text with [[[ and ${\"x\"}\n", 5000) + "EOT\n"
	tests := []struct {
		name    string
		src     string
		summary string // "" when the file is within bounds
		line    int
	}{
		{"brackets at the bound", nest(maxNesting, "[", "]"), "", 0},
		{"brackets beyond it", nest(maxNesting+1, "[", "]"), "Config nested too deeply", 1},
		{"parentheses beyond it", "\n" + nest(maxNesting+1, "(", ")"), "Config nested too deeply", 2},
		{"objects beyond it", nest(maxNesting+1, "{a = ", "}"), "Config nested too deeply", 1},
		{"blocks beyond it", strings.Repeat("a {\n", maxNesting+1) + strings.Repeat("}\n", maxNesting+1), "Config nested too deeply", maxNesting + 1},
		{"template sequences beyond it", nest(maxNesting/2+1, `"${`, `}"`), "Config nested too deeply", 1},
		{"brackets in strings and comments", "# " + strings.Repeat("[", 5000) + "\n/* " + strings.Repeat("{", 5000) + " */\nx = \"" + strings.Repeat("(", 5000) + "\"\n", "", 0},
		{"long heredoc", heredoc, "", 0},
		{"long flat list", "x = [" + strings.Repeat("1, ", 50000) + "1]\n", "", 0},
		{"many attributes", strings.Repeat("x = 1 + 2 + 3\n", 10000), "", 0},
		{"operators at the bound", "x = " + strings.Repeat("!", maxExprDepth-1) + "true\n", "", 0},
		{"operators beyond it", "x = " + strings.Repeat("!", maxExprDepth) + "true\n", "Expression too complex", 1},
		{"binary operators beyond it", chain(maxExprDepth/2, "+1"), "Expression too complex", 1},
		{"conditionals beyond it", chain(maxExprDepth/4+1, " ? 1 : 1"), "Expression too complex", 1},
		{"index chain beyond it", "x = [1]" + strings.Repeat("[(0)]", maxExprDepth) + "\n", "Expression too complex", 1},
		{"splat chain beyond it", "x = [1]" + strings.Repeat("[*]", maxExprDepth) + "\n", "Expression too complex", 1},
		{"file at the size bound", strings.Repeat("# padding\n", maxFileBytes/10) + strings.Repeat(" ", maxFileBytes%10), "", 0},
		{"file beyond it", strings.Repeat("# padding\n", maxFileBytes/10) + strings.Repeat(" ", maxFileBytes%10+1), "Config file too large", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diags := checkBounds([]byte(tt.src), "f.hcl")
			if tt.summary == "" {
				if diags.HasErrors() {
					t.Fatalf("checkBounds() = %s, want no diagnostics", diags.Error())
				}
				return
			}
			if len(diags) != 1 || diags[0].Summary != tt.summary {
				t.Fatalf("checkBounds() = %v, want one %q", diags, tt.summary)
			}
			if s := diags[0].Subject; s == nil || s.Filename != "f.hcl" || s.Start.Line != tt.line {
				t.Errorf("checkBounds() subject = %v, want f.hcl line %d", s, tt.line)
			}
		})
	}
}

// TestParseHostile parses files within the size bound but far beyond the
// nesting and expression bounds, each of which exhausts the stack of
// hcl/v2's parser without them (a fatal error that ends the test binary):
// Parse refuses each with one diagnostic, and prints at most a short
// prefix of the offending line.
func TestParseHostile(t *testing.T) {
	const size = maxFileBytes - 100
	tests := []struct {
		name string
		src  string
	}{
		{"brackets", "x = " + strings.Repeat("[", size) + "\n"},
		{"braces in a plugin config", "plugin \"a\" {\n  path = \"a\"\n  config {\n    x = " + strings.Repeat("{a=", size/3) + "\n  }\n}\n"},
		{"template sequences", "x = " + strings.Repeat(`"${`, size/3) + "\n"},
		{"unary operators", "x = " + strings.Repeat("-", size) + "1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, diags := Parse([]byte(tt.src), "hostile.hcl")
			if len(diags) != 1 || !diags.HasErrors() {
				t.Fatalf("Parse() = %v, want one error", diags)
			}
			var buf bytes.Buffer
			if err := WriteDiagnostics(&buf, c.Files, diags); err != nil {
				t.Fatalf("WriteDiagnostics: %v", err)
			}
			if !strings.HasPrefix(buf.String(), "hostile.hcl:") || buf.Len() > 2*maxQuote {
				t.Errorf("WriteDiagnostics() = %d bytes starting %.200q, want hostile.hcl:LINE:COL and at most %d bytes",
					buf.Len(), buf.String(), 2*maxQuote)
			}
		})
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "large.hcl")
	if err := os.WriteFile(path, bytes.Repeat([]byte("# padding\n"), 4*maxFileBytes/10), 0o644); err != nil {
		t.Fatal(err)
	}
	_, diags := Load(path)
	if len(diags) != 1 || diags[0].Summary != "Config file too large" {
		t.Fatalf("Load(%d bytes) = %v, want one \"Config file too large\"", 4*maxFileBytes, diags)
	}
}
