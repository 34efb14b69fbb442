package config

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
)

// ErrInvalidSchema is wrapped by every error CheckSchema returns.
var ErrInvalidSchema = errors.New("invalid config schema")

// maxSchemaDepth bounds block nesting in a declared schema; real schemas
// are shallow, and the bound keeps a broken plugin from exhausting the stack.
const maxSchemaDepth = 16

// CheckSchema reports whether schema, as a plugin declared it in Describe,
// is usable. The error wraps ErrInvalidSchema and names the first problem:
// an empty, invalid or duplicate name (attributes and blocks share one
// namespace), an unknown type or nesting, a default_json that does not
// decode as the attribute's type, a required attribute with a default, or
// a block label whose name is invalid, repeated, or also the name of an
// attribute or block of the block's body. A nil schema is valid and
// accepts only an empty body.
func CheckSchema(schema *pluginv1.Schema) error {
	if _, err := compile(schema, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSchema, err)
	}
	return nil
}

// DecodePluginConfig decodes body, a plugin's config block (Plugin.Config),
// against the schema the plugin declared, and returns the JSON object that
// ConfigureRequest.config_json carries.
//
// The object has one key per declared attribute and block:
//   - attributes are JSON strings, numbers, booleans, arrays (list(T)) or
//     objects (map(T)); a "duration" stays the string the operator wrote,
//     checked with time.ParseDuration but with its sign left to the plugin;
//   - an absent attribute takes its default_json, or is null when it has
//     none;
//   - a NESTING_SINGLE block is an object, or null when absent;
//   - a NESTING_LIST block is an array of objects in the order of the
//     file, [] when absent;
//   - a block's labels are strings in its object, each under its label's
//     name: upstream "wallet" { url = "http://w" } with labels ["name"]
//     is {"name":"wallet","url":"http://w"}.
//
// Unknown attributes or blocks, values of the wrong type, invalid durations,
// missing required attributes or blocks, a block with too few or too many
// labels, a label also written as an argument in the block's body, and two
// blocks of a list with the same labels are diagnostics whose subjects lie
// in the operator's file. An unusable schema (see CheckSchema) is a single
// diagnostic blaming the plugin. The JSON is nil whenever the diagnostics
// hold errors.
func DecodePluginConfig(body hcl.Body, schema *pluginv1.Schema) ([]byte, hcl.Diagnostics) {
	if body == nil {
		body = hcl.EmptyBody()
	}
	spec, err := compile(schema, 0)
	if err != nil {
		d := &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Invalid plugin config schema",
			Detail:   fmt.Sprintf("The plugin declared a config schema the host cannot use: %s.", err),
		}
		if r := body.MissingItemRange(); r.Filename != "" {
			d.Subject = r.Ptr()
		}
		return nil, hcl.Diagnostics{d}
	}

	vals, diags := spec.decode(body, nil, nil)
	slices.SortStableFunc(diags, compareDiagnostics)
	if diags.HasErrors() {
		return nil, diags
	}
	val := cty.ObjectVal(vals)
	out, err := ctyjson.Marshal(val, val.Type())
	if err != nil {
		// Unreachable with constant expressions, but a body from elsewhere
		// could hold unknown values.
		d := &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "Cannot encode plugin config",
			Detail:   fmt.Sprintf("%s.", err),
		}
		if r := body.MissingItemRange(); r.Filename != "" {
			d.Subject = r.Ptr()
		}
		return nil, append(diags, d)
	}
	return out, diags
}

// bodySpec is a schema compiled for decoding one body: hcldec decodes the
// attributes, and decode the blocks, which may carry labels.
type bodySpec struct {
	attrs hcldec.ObjectSpec
	// schema names every attribute (none required: attrs checks that) and
	// block, so that HCL refuses, with a suggestion, the names it lacks.
	schema *hcl.BodySchema
	blocks []*blockSpec
}

// blockSpec is a block of a bodySpec.
type blockSpec struct {
	name     string
	labels   []string
	list     bool
	required bool
	body     *bodySpec
}

// compile checks a declared schema and compiles it for decode.
func compile(s *pluginv1.Schema, depth int) (*bodySpec, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("blocks nest more than %d deep", maxSchemaDepth)
	}
	spec := &bodySpec{attrs: hcldec.ObjectSpec{}, schema: &hcl.BodySchema{}}
	taken := map[string]bool{}
	for _, a := range s.GetAttributes() {
		name := a.GetName()
		if err := checkName(name, taken); err != nil {
			return nil, fmt.Errorf("attribute %q: %w", name, err)
		}
		as, err := attrSpec(a)
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", name, err)
		}
		spec.attrs[name] = as
		spec.schema.Attributes = append(spec.schema.Attributes, hcl.AttributeSchema{Name: name})
	}
	for _, b := range s.GetBlocks() {
		name := b.GetName()
		if err := checkName(name, taken); err != nil {
			return nil, fmt.Errorf("block %q: %w", name, err)
		}
		nested, err := compile(b.GetBody(), depth+1)
		if err != nil {
			return nil, fmt.Errorf("block %q: %w", name, err)
		}
		bs := &blockSpec{name: name, labels: b.GetLabels(), required: b.GetRequired(), body: nested}
		switch b.GetNesting() {
		case pluginv1.Block_NESTING_SINGLE:
		case pluginv1.Block_NESTING_LIST:
			bs.list = true
		default:
			return nil, fmt.Errorf("block %q: unknown nesting %s", name, b.GetNesting())
		}
		if err := checkLabels(bs); err != nil {
			return nil, fmt.Errorf("block %q: %w", name, err)
		}
		spec.blocks = append(spec.blocks, bs)
		spec.schema.Blocks = append(spec.schema.Blocks, hcl.BlockHeaderSchema{Type: name, LabelNames: bs.labels})
	}
	return spec, nil
}

// checkLabels checks the names of a block's labels: valid, distinct, and
// none the name of an attribute or block of its body, which would give its
// JSON object one key twice.
func checkLabels(b *blockSpec) error {
	taken := map[string]bool{}
	for _, l := range b.labels {
		if err := checkName(l, taken); err != nil {
			return fmt.Errorf("label %q: %w", l, err)
		}
		if b.body.attrs[l] != nil || b.body.block(l) != nil {
			return fmt.Errorf("label %q: also the name of an attribute or block of the block's body", l)
		}
	}
	return nil
}

// block returns the spec of the block called name, or nil.
func (s *bodySpec) block(name string) *blockSpec {
	for _, b := range s.blocks {
		if b.name == name {
			return b
		}
	}
	return nil
}

// checkName checks a name and records it in taken.
func checkName(name string, taken map[string]bool) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case !hclsyntax.ValidIdentifier(name):
		return errors.New("name is not a valid HCL identifier")
	case taken[name]:
		return errors.New("duplicate name")
	}
	taken[name] = true
	return nil
}

// attrSpec builds the spec of one attribute: its type, its default and,
// for durations and ints, a check of the operator's value.
func attrSpec(a *pluginv1.Attribute) (hcldec.Spec, error) {
	ty, scalar, err := parseType(a.GetType())
	if err != nil {
		return nil, err
	}
	as := &hcldec.AttrSpec{Name: a.GetName(), Type: ty, Required: a.GetRequired()}
	var spec hcldec.Spec = as
	check := valueCheck(scalar)

	if dj := a.GetDefaultJson(); dj != "" {
		if a.GetRequired() {
			return nil, errors.New("required attribute has a default")
		}
		v, err := ctyjson.Unmarshal([]byte(dj), ty)
		if err != nil {
			return nil, fmt.Errorf("default_json %q: %w", dj, err)
		}
		if check != nil {
			if err := check.fn(v); err != nil {
				return nil, fmt.Errorf("default_json %q: %w", dj, err)
			}
		}
		spec = &hcldec.DefaultSpec{Primary: as, Default: &hcldec.LiteralSpec{Value: v}}
	}

	if check != nil {
		name := a.GetName()
		spec = &hcldec.ValidateSpec{
			Wrapped: spec,
			// The subject defaults to the attribute's expression.
			Func: func(v cty.Value) hcl.Diagnostics {
				if err := check.fn(v); err != nil {
					return hcl.Diagnostics{{
						Severity: hcl.DiagError,
						Summary:  check.summary,
						Detail:   fmt.Sprintf("%s must be %s; %s.", name, check.want, err),
					}}
				}
				return nil
			},
		}
	}
	return spec, nil
}

// parseType parses a schema type string with the SDK's grammar and returns
// its cty type and its scalar type.
func parseType(s string) (cty.Type, sdk.Type, error) {
	shape, scalar, err := sdk.ParseType(sdk.Type(s))
	if err != nil {
		return cty.NilType, "", err
	}
	var ty cty.Type
	switch scalar {
	case sdk.TypeString, sdk.TypeDuration:
		ty = cty.String
	case sdk.TypeNumber, sdk.TypeInt:
		ty = cty.Number
	case sdk.TypeBool:
		ty = cty.Bool
	default:
		return cty.NilType, "", fmt.Errorf("unknown type %q", s)
	}
	switch shape {
	case sdk.ShapeList:
		ty = cty.List(ty)
	case sdk.ShapeMap:
		ty = cty.Map(ty)
	}
	return ty, scalar, nil
}

// check is a check of values beyond their cty type.
type check struct {
	fn      func(cty.Value) error
	summary string // of the diagnostic
	want    string // what the value must be, after "NAME must be "
}

// valueCheck returns the check of a scalar type's values, or nil.
func valueCheck(scalar sdk.Type) *check {
	switch scalar {
	case sdk.TypeDuration:
		return &check{fn: checkDurations, summary: "Invalid duration", want: `a duration such as "500ms", "5s" or "1m"`}
	case sdk.TypeInt:
		return &check{fn: checkWhole, summary: "Invalid whole number", want: "a whole number"}
	}
	return nil
}

// checkWhole checks that v, a number or a collection of numbers, holds
// only whole numbers. Null values pass: absence is the schema's business.
func checkWhole(v cty.Value) error {
	if v.IsNull() || !v.IsKnown() {
		return nil
	}
	if v.Type() == cty.Number {
		if !v.AsBigFloat().IsInt() {
			return fmt.Errorf("got %s", v.AsBigFloat().Text('g', -1))
		}
		return nil
	}
	if !v.CanIterateElements() {
		return fmt.Errorf("%s is not a number", v.Type().FriendlyName())
	}
	for it := v.ElementIterator(); it.Next(); {
		_, ev := it.Element()
		if err := checkWhole(ev); err != nil {
			return err
		}
	}
	return nil
}

// checkDurations checks that v, a string or a collection of strings, holds
// only durations. Null values pass: absence is the schema's business.
func checkDurations(v cty.Value) error {
	if v.IsNull() || !v.IsKnown() {
		return nil
	}
	if v.Type() == cty.String {
		if _, err := time.ParseDuration(v.AsString()); err != nil {
			return err
		}
		return nil
	}
	if !v.CanIterateElements() {
		return fmt.Errorf("%s is not a string", v.Type().FriendlyName())
	}
	for it := v.ElementIterator(); it.Next(); {
		_, ev := it.Element()
		if err := checkDurations(ev); err != nil {
			return err
		}
	}
	return nil
}
