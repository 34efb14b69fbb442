package config

import (
	"slices"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/plughost/plughost/sdk"
)

// Locate returns the range in body, a plugin's config block
// (PluginBlock.Config), of what path names: a path into the block, as
// sdk.ConfigError.Attribute writes it (port, tls.cert, upstream[0].url,
// upstream["wallet"].url). It is an attribute's value (an element's, for
// a path into a list or map the operator wrote), or a block's header.
//
// When the path leads past what the body holds (an attribute the
// operator left to its default, a block picked by a position or labels
// no block has, a list block named without picking one of several) it
// returns the range of the last block found on the way. It reports false
// when it found nothing, not even the first step, or the path does not
// parse; the caller then points at the config block as a whole.
func Locate(body hcl.Body, path string) (hcl.Range, bool) {
	steps, err := sdk.ParseConfigPath(path)
	b, ok := body.(*hclsyntax.Body)
	if err != nil || !ok {
		return hcl.Range{}, false
	}
	var found hcl.Range
	ok = false
	for _, st := range steps {
		if a, isAttr := b.Attributes[st.Name]; isAttr {
			return element(a.Expr, st), true
		}
		blk := pick(b.Blocks, st)
		if blk == nil {
			break
		}
		found, ok = blk.DefRange(), true
		b = blk.Body
	}
	return found, ok
}

// pick returns the block of blocks that st names, or nil.
func pick(blocks hclsyntax.Blocks, st sdk.PathStep) *hclsyntax.Block {
	var of []*hclsyntax.Block
	for _, blk := range blocks {
		if blk.Type == st.Name {
			of = append(of, blk)
		}
	}
	switch {
	case st.Indexed:
		if st.Index < len(of) {
			return of[st.Index]
		}
	case st.Labels != nil:
		for _, blk := range of {
			if slices.Equal(blk.Labels, st.Labels) {
				return blk
			}
		}
	case len(of) == 1:
		return of[0]
	}
	return nil
}

// element returns the range of the element of expr, an attribute's value,
// that st picks: by position in a list, by key in a map (its one label).
// Otherwise, or when expr is not a literal list or map, the range of expr.
func element(expr hclsyntax.Expression, st sdk.PathStep) hcl.Range {
	switch e := expr.(type) {
	case *hclsyntax.TupleConsExpr:
		if st.Indexed && st.Index < len(e.Exprs) {
			return e.Exprs[st.Index].Range()
		}
	case *hclsyntax.ObjectConsExpr:
		if len(st.Labels) != 1 {
			break
		}
		for _, item := range e.Items {
			k, diags := item.KeyExpr.Value(nil)
			if !diags.HasErrors() && k.IsKnown() && !k.IsNull() && k.Type() == cty.String && k.AsString() == st.Labels[0] {
				return item.ValueExpr.Range()
			}
		}
	}
	return expr.Range()
}
