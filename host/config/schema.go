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
// decode as the attribute's type, or a required attribute with a default.
// A nil schema is valid and accepts only an empty body.
func CheckSchema(schema *pluginv1.Schema) error {
	if _, err := objectSpec(schema, 0); err != nil {
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
//   - a NESTING_LIST block is an array of objects, [] when absent.
//
// Unknown attributes or blocks, values of the wrong type, invalid durations
// and missing required attributes or blocks are diagnostics whose subjects
// lie in the operator's file. An unusable schema (see CheckSchema) is a
// single diagnostic blaming the plugin. The JSON is nil whenever the
// diagnostics hold errors.
func DecodePluginConfig(body hcl.Body, schema *pluginv1.Schema) ([]byte, hcl.Diagnostics) {
	if body == nil {
		body = hcl.EmptyBody()
	}
	spec, err := objectSpec(schema, 0)
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

	val, diags := hcldec.Decode(body, spec, nil)
	slices.SortStableFunc(diags, compareDiagnostics)
	if diags.HasErrors() {
		return nil, diags
	}
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

// objectSpec builds the hcldec spec of a schema's body.
func objectSpec(s *pluginv1.Schema, depth int) (hcldec.ObjectSpec, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("blocks nest more than %d deep", maxSchemaDepth)
	}
	spec := hcldec.ObjectSpec{}
	for _, a := range s.GetAttributes() {
		name := a.GetName()
		if err := checkName(name, spec); err != nil {
			return nil, fmt.Errorf("attribute %q: %w", name, err)
		}
		as, err := attrSpec(a)
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", name, err)
		}
		spec[name] = as
	}
	for _, b := range s.GetBlocks() {
		name := b.GetName()
		if err := checkName(name, spec); err != nil {
			return nil, fmt.Errorf("block %q: %w", name, err)
		}
		nested, err := objectSpec(b.GetBody(), depth+1)
		if err != nil {
			return nil, fmt.Errorf("block %q: %w", name, err)
		}
		switch b.GetNesting() {
		case pluginv1.Block_NESTING_SINGLE:
			spec[name] = &hcldec.BlockSpec{TypeName: name, Nested: nested, Required: b.GetRequired()}
		case pluginv1.Block_NESTING_LIST:
			minItems := 0
			if b.GetRequired() {
				minItems = 1
			}
			spec[name] = &hcldec.BlockListSpec{TypeName: name, Nested: nested, MinItems: minItems}
		default:
			return nil, fmt.Errorf("block %q: unknown nesting %s", name, b.GetNesting())
		}
	}
	return spec, nil
}

func checkName(name string, taken hcldec.ObjectSpec) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case !hclsyntax.ValidIdentifier(name):
		return errors.New("name is not a valid HCL identifier")
	case taken[name] != nil:
		return errors.New("duplicate name")
	}
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
