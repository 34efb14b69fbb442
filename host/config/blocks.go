package config

import (
	"fmt"
	"maps"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// decode decodes body against s into the attributes of an object value.
// owner is the block whose body it is, with labels its labels, or nil for
// the config block.
func (s *bodySpec) decode(body hcl.Body, owner *blockSpec, labels []string) (map[string]cty.Value, hcl.Diagnostics) {
	body, diags := s.checkLabels(body, owner, labels)

	attrs, remain, more := hcldec.PartialDecode(body, s.attrs, nil)
	diags = append(diags, more...)
	content, more := remain.Content(s.schema)
	suggestAffixes(body, s.schema, more)
	diags = append(diags, more...)

	vals := map[string]cty.Value{}
	if attrs.IsKnown() && !attrs.IsNull() {
		maps.Copy(vals, attrs.AsValueMap())
	}
	for _, b := range s.blocks {
		var blocks hcl.Blocks
		for _, blk := range content.Blocks {
			if blk.Type == b.name {
				blocks = append(blocks, blk)
			}
		}
		var more hcl.Diagnostics
		vals[b.name], more = b.decode(blocks, body.MissingItemRange())
		diags = append(diags, more...)
	}
	return vals, diags
}

// decode decodes the blocks of b's type found in one body, whose missing
// item range is missing, into a JSON array (a list) or object or null (a
// single block).
func (b *blockSpec) decode(blocks hcl.Blocks, missing hcl.Range) (cty.Value, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	if b.required && len(blocks) == 0 {
		summary, detail := fmt.Sprintf("Missing %s block", b.name), fmt.Sprintf("A block of type %q is required here.", b.name)
		if b.list {
			summary, detail = fmt.Sprintf("Insufficient %s blocks", b.name), fmt.Sprintf("At least 1 %q blocks are required.", b.name)
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: missing.Ptr()})
	}

	seen := map[string]hcl.Range{} // labels joined by NUL -> first block
	elems := make([]cty.Value, 0, len(blocks))
	for i, blk := range blocks {
		if !b.list && i > 0 {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("Duplicate %s block", b.name),
				Detail:   fmt.Sprintf("Only one block of type %q is allowed. Previous definition was at %s.", b.name, blocks[0].DefRange),
				Subject:  blk.DefRange.Ptr(),
			})
			continue
		}
		if len(b.labels) > 0 {
			key := strings.Join(blk.Labels, "\x00")
			if prev, dup := seen[key]; dup {
				diags = append(diags, &hcl.Diagnostic{
					Severity: hcl.DiagError,
					Summary:  fmt.Sprintf("Duplicate %s block", b.name),
					Detail: fmt.Sprintf("%s was already declared at %s. No two %s blocks may have the same %s.",
						b.header(blk.Labels), prev, b.name, b.labelWords()),
					Subject: blk.DefRange.Ptr(),
				})
				continue
			}
			seen[key] = blk.DefRange
		}
		vals, more := b.body.decode(blk.Body, b, blk.Labels)
		diags = append(diags, more...)
		for j, l := range b.labels {
			vals[l] = cty.StringVal(blk.Labels[j])
		}
		elems = append(elems, cty.ObjectVal(vals))
	}

	switch {
	case b.list && len(elems) == 0:
		return cty.EmptyTupleVal, diags
	case b.list:
		return cty.TupleVal(elems), diags
	case len(elems) == 0:
		return cty.NullVal(cty.EmptyObject), diags
	}
	return elems[0], diags
}

// checkLabels refuses, in a body parsed from HCL's native syntax, the
// mistakes with labels that HCL would report in its own terms: an argument
// named as a label of owner, the block whose body it is (with labels its
// labels), and a block of a labelled type with too few or too many labels.
// It returns body without them, so that each is reported once.
func (s *bodySpec) checkLabels(body hcl.Body, owner *blockSpec, labels []string) (hcl.Body, hcl.Diagnostics) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return body, nil
	}
	var diags hcl.Diagnostics
	attrs := sb.Attributes
	if owner != nil {
		for _, l := range owner.labels {
			a, ok := sb.Attributes[l]
			if !ok {
				continue
			}
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError,
				Summary:  "Label written as an argument",
				Detail: fmt.Sprintf("The %s of %s is its label; remove the %s argument.",
					l, owner.header(labels), l),
				Subject: a.SrcRange.Ptr(),
			})
			attrs = maps.Clone(attrs)
			delete(attrs, l)
		}
	}
	var blocks hclsyntax.Blocks
	for _, blk := range sb.Blocks {
		if d := s.block(blk.Type).checkCount(blk); d != nil {
			diags = append(diags, d)
			continue
		}
		blocks = append(blocks, blk)
	}
	if len(diags) == 0 {
		return body, nil
	}
	trimmed := *sb
	trimmed.Attributes, trimmed.Blocks = attrs, blocks
	return &trimmed, diags
}

// checkCount returns the diagnostic of a block of b's type with too few or
// too many labels, or nil. It leaves blocks without labels to HCL, and
// says so when b is nil, a block of a type the schema lacks.
func (b *blockSpec) checkCount(blk *hclsyntax.Block) *hcl.Diagnostic {
	if b == nil || len(b.labels) == 0 || len(blk.Labels) == len(b.labels) {
		return nil
	}
	d := &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Context:  blk.DefRange().Ptr(),
	}
	if len(blk.Labels) > len(b.labels) {
		d.Summary = fmt.Sprintf("Extraneous label for %s block", b.name)
		d.Detail = fmt.Sprintf("%s; write %s { ... }.", b.takes(), b.header(blk.Labels[:len(b.labels)]))
		d.Subject = blk.LabelRanges[len(b.labels)].Ptr()
		return d
	}
	d.Subject = blk.DefRange().Ptr()
	// The labels an argument of the body gives (the form of a config
	// written for a schema without them), or placeholders.
	vals := append([]string(nil), blk.Labels...)
	var args []string
	for _, l := range b.labels[len(blk.Labels):] {
		v := strings.ToUpper(l)
		if a, ok := blk.Body.Attributes[l]; ok {
			args = append(args, l)
			if val, diags := a.Expr.Value(nil); !diags.HasErrors() && val.Type() == cty.String && val.IsKnown() && !val.IsNull() {
				v = val.AsString()
			}
		}
		vals = append(vals, v)
	}
	if len(args) > 0 {
		as, noun := "a label, not as an argument", "argument"
		if len(b.labels) > 1 {
			as = "labels, not as arguments"
		}
		if len(args) > 1 {
			noun = "arguments"
		}
		d.Summary = "Label written as an argument"
		d.Detail = fmt.Sprintf("%s blocks take the %s as %s; write %s { ... } without the %s %s.",
			b.name, b.labelWords(), as, b.header(vals), strings.Join(args, " and "), noun)
		return d
	}
	d.Summary = fmt.Sprintf("Missing %s for %s block", b.labels[len(blk.Labels)], b.name)
	d.Detail = fmt.Sprintf("%s; write %s { ... }.", b.takes(), b.header(vals))
	return d
}

// takes says what labels blocks of b's type take: "upstream blocks take
// one label, the name".
func (b *blockSpec) takes() string {
	if len(b.labels) == 1 {
		return fmt.Sprintf("%s blocks take one label, the %s", b.name, b.labels[0])
	}
	return fmt.Sprintf("%s blocks take %d labels, the %s", b.name, len(b.labels), b.labelWords())
}

// labelWords joins b's label names: "name", "kind and name".
func (b *blockSpec) labelWords() string {
	n := len(b.labels)
	if n == 1 {
		return b.labels[0]
	}
	return strings.Join(b.labels[:n-1], ", ") + " and " + b.labels[n-1]
}

// header writes a block header of b's type with the given labels:
// upstream "wallet".
func (b *blockSpec) header(labels []string) string {
	var sb strings.Builder
	sb.WriteString(b.name)
	for _, l := range labels {
		fmt.Fprintf(&sb, " %q", l)
	}
	return sb.String()
}
