package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// suggest returns the name in names that given most likely misspells, or
// "" when none is close. It is the rule behind every "Did you mean"
// diagnostic the package writes itself, and close to HCL's own: a name
// that differs only in case, or by an edit distance of at most 2 (1 for
// names of five characters or fewer, where two edits turn GOOS into GOGC).
// Earlier names win ties.
func suggest(given string, names []string) string {
	limit := 2
	if len(given) <= 5 {
		limit = 1
	}
	best, bestDist := "", limit+1
	for _, n := range names {
		if strings.EqualFold(given, n) {
			return n
		}
		if d := distance(given, n); d < bestDist {
			best, bestDist = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes: every
// name it compares is ASCII.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// blockBodies are the host's own blocks, by type, as gohcl decodes them.
var blockBodies = []struct {
	name string
	body any
}{
	{"admin", &adminBody{}},
	{"limits", &limitsBody{}},
	{"restart", &restartBody{}},
	{"health", &healthBody{}},
	{"debug", &debugBody{}},
	{"plugin", &pluginBody{}},
}

// attrNames returns the attribute names gohcl accepts in body, a pointer to
// one of the *Body types.
func attrNames(body any) []string {
	schema, _ := gohcl.ImpliedBodySchema(body)
	names := make([]string, len(schema.Attributes))
	for i, a := range schema.Attributes {
		names[i] = a.Name
	}
	return names
}

// suggestKeys adds a "Did you mean" to the "Unsupported argument"
// diagnostics of diags that HCL left without one: HCL suggests only a name
// of the same block within two edits. It suggests a name of the same block
// that the unknown one is the start or end of (inflight for max_inflight),
// the block where a name belongs (read_timeout at the top level belongs in
// limits), and for a plugin block the config block, where the plugin's own
// settings go.
func suggestKeys(body hcl.Body, diags hcl.Diagnostics) {
	top, ok := body.(*hclsyntax.Body)
	if !ok {
		return
	}
	homes := map[string][]string{} // attribute name -> blocks it belongs in
	for _, n := range attrNames(&fileBody{}) {
		homes[n] = append(homes[n], "at the top level")
	}
	for _, b := range blockBodies {
		for _, n := range attrNames(b.body) {
			homes[n] = append(homes[n], "in the "+b.name+" block")
		}
	}

	hint := func(a *hclsyntax.Attribute, level string, names []string) {
		for _, n := range names {
			if distance(a.Name, n) < 3 {
				return // HCL suggested it
			}
		}
		var h string
		if n := affixOf(a.Name, names); n != "" {
			h = fmt.Sprintf(" Did you mean %q?", n)
		} else if where := slices.DeleteFunc(slices.Clone(homes[a.Name]), func(w string) bool { return w == level }); len(where) > 0 {
			h = fmt.Sprintf(" Did you mean to set it %s?", strings.Join(where, " or "))
		} else if level == "in the plugin block" {
			h = " Did you mean to set it in the plugin's config block, where its own settings go?"
		}
		if h == "" {
			return
		}
		for _, d := range diags {
			if d.Summary == "Unsupported argument" && d.Subject != nil && !strings.Contains(d.Detail, "Did you mean") &&
				d.Subject.Filename == a.NameRange.Filename && d.Subject.Start.Byte == a.NameRange.Start.Byte {
				d.Detail += h
			}
		}
	}

	topNames := attrNames(&fileBody{})
	for _, a := range top.Attributes {
		if !slices.Contains(topNames, a.Name) {
			hint(a, "at the top level", topNames)
		}
	}
	for _, blk := range top.Blocks {
		for _, b := range blockBodies {
			if b.name != blk.Type {
				continue
			}
			names := attrNames(b.body)
			for _, a := range blk.Body.Attributes {
				if !slices.Contains(names, a.Name) {
					hint(a, "in the "+b.name+" block", names)
				}
			}
		}
	}
}

// affixOf returns the name in names that given is a whole-word start or
// end of (max_body for max_body_bytes, inflight for max_inflight), or "".
// suggestAffixes adds to the "Unsupported argument" diagnostics of diags
// that HCL left without a suggestion the name of schema's that the
// unknown one is the start or end of: the rule of suggestKeys, for the
// body of a plugin's config block.
func suggestAffixes(body hcl.Body, schema *hcl.BodySchema, diags hcl.Diagnostics) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return
	}
	names := make([]string, len(schema.Attributes))
	for i, a := range schema.Attributes {
		names[i] = a.Name
	}
	for _, a := range sb.Attributes {
		n := affixOf(a.Name, names)
		if n == "" || slices.Contains(names, a.Name) {
			continue
		}
		for _, d := range diags {
			if d.Summary == "Unsupported argument" && d.Subject != nil && !strings.Contains(d.Detail, "Did you mean") &&
				d.Subject.Filename == a.NameRange.Filename && d.Subject.Start.Byte == a.NameRange.Start.Byte {
				d.Detail += fmt.Sprintf(" Did you mean %q?", n)
			}
		}
	}
}

func affixOf(given string, names []string) string {
	for _, n := range names {
		if strings.HasPrefix(n, given+"_") || strings.HasSuffix(n, "_"+given) {
			return n
		}
	}
	return ""
}
