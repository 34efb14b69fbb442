package sdk

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// Type is a config attribute's type.
type Type string

// Scalar attribute types. Compose them with ListOf and MapOf.
const (
	TypeString Type = "string"
	TypeNumber Type = "number"
	// TypeInt is a whole number; decode it into an int or an int64.
	TypeInt  Type = "int"
	TypeBool Type = "bool"
	// TypeDuration is a string that time.ParseDuration accepts, such as
	// "250ms"; decode it into a Duration.
	TypeDuration Type = "duration"
)

// Shape is how a Type holds its values.
type Shape int

// Shapes of a Type.
const (
	// ShapeScalar is one value of a scalar type.
	ShapeScalar Shape = iota
	// ShapeList is list(T): a JSON array of T.
	ShapeList
	// ShapeMap is map(T): a JSON object from string to T.
	ShapeMap
)

// ParseType parses the type grammar of config attributes, the one parser
// the SDK and the host share: a scalar type (string, number, int, bool,
// duration), or list(T) or map(T) of a scalar type T. It returns the shape
// and the scalar type.
func ParseType(t Type) (Shape, Type, error) {
	shape, inner := ShapeScalar, t
	for _, c := range []struct {
		prefix string
		shape  Shape
	}{{"list(", ShapeList}, {"map(", ShapeMap}} {
		if rest, ok := strings.CutPrefix(string(t), c.prefix); ok {
			rest, ok = strings.CutSuffix(rest, ")")
			if !ok {
				return 0, "", fmt.Errorf("unknown type %q", t)
			}
			shape, inner = c.shape, Type(rest)
			break
		}
	}
	switch inner {
	case TypeString, TypeNumber, TypeInt, TypeBool, TypeDuration:
		return shape, inner, nil
	}
	return 0, "", fmt.Errorf("unknown type %q", t)
}

// ListOf returns the type of a list of t, a scalar type.
func ListOf(t Type) Type { return "list(" + t + ")" }

// MapOf returns the type of a map from string to t, a scalar type.
func MapOf(t Type) Type { return "map(" + t + ")" }

// Schema declares a plugin's config block.
type Schema struct {
	Attrs  []Attr
	Blocks []Block
}

// Attr declares one config attribute.
type Attr struct {
	// Name is the attribute name, snake_case.
	Name string
	Type Type
	// Required attributes have no default.
	Required bool
	// Default is used when the operator omits the attribute; it must be
	// JSON-encodable and match Type. Nil means no default (null).
	Default     any
	Description string
}

// Block declares a nested config block.
type Block struct {
	Name string
	// Labels name the block's labels, snake_case, in order. Each block in
	// the operator's file then carries exactly that many quoted labels
	// after its name, and the plugin gets each label as a string in the
	// block's JSON object under the label's name: with Labels {"name"},
	//
	//	upstream "wallet" { url = "http://..." }
	//
	// arrives as {"name":"wallet","url":"http://..."}. A label's name must
	// not also name an attribute or block of Schema. The host refuses two
	// blocks of a List with the same labels, so a plugin can key its
	// blocks by them. Nil for a block without labels.
	Labels []string
	// List allows the block any number of times; the plugin gets a JSON
	// array. Otherwise it may appear at most once.
	List        bool
	Required    bool
	Schema      Schema
	Description string
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func (s Schema) toProto() (*pluginv1.Schema, error) {
	out := &pluginv1.Schema{}
	seen := map[string]bool{}
	for _, a := range s.Attrs {
		if !nameRE.MatchString(a.Name) {
			return nil, fmt.Errorf("attribute name %q: want snake_case", a.Name)
		}
		if seen[a.Name] {
			return nil, fmt.Errorf("attribute %q declared twice", a.Name)
		}
		seen[a.Name] = true
		if _, _, err := ParseType(a.Type); err != nil {
			return nil, fmt.Errorf("attribute %q: %w", a.Name, err)
		}
		pa := &pluginv1.Attribute{Name: a.Name, Type: string(a.Type), Required: a.Required, Description: a.Description}
		if a.Default != nil {
			if a.Required {
				return nil, fmt.Errorf("attribute %q: required attributes take no default", a.Name)
			}
			b, err := json.Marshal(a.Default)
			if err != nil {
				return nil, fmt.Errorf("attribute %q: encode default: %w", a.Name, err)
			}
			if err := checkDefault(a.Type, b); err != nil {
				return nil, fmt.Errorf("attribute %q: default %s: %w", a.Name, b, err)
			}
			pa.DefaultJson = string(b)
		}
		out.Attributes = append(out.Attributes, pa)
	}
	for _, b := range s.Blocks {
		if !nameRE.MatchString(b.Name) {
			return nil, fmt.Errorf("block name %q: want snake_case", b.Name)
		}
		if seen[b.Name] {
			return nil, fmt.Errorf("name %q declared twice", b.Name)
		}
		seen[b.Name] = true
		body, err := b.Schema.toProto()
		if err != nil {
			return nil, fmt.Errorf("block %q: %w", b.Name, err)
		}
		if err := b.checkLabels(); err != nil {
			return nil, fmt.Errorf("block %q: %w", b.Name, err)
		}
		n := pluginv1.Block_NESTING_SINGLE
		if b.List {
			n = pluginv1.Block_NESTING_LIST
		}
		out.Blocks = append(out.Blocks, &pluginv1.Block{Name: b.Name, Nesting: n, Required: b.Required, Body: body,
			Description: b.Description, Labels: b.Labels})
	}
	return out, nil
}

// checkLabels checks the names of b's labels: snake_case, distinct, and
// none also the name of an attribute or block of its body, which would
// give its JSON object one key twice.
func (b Block) checkLabels() error {
	for i, l := range b.Labels {
		if !nameRE.MatchString(l) {
			return fmt.Errorf("label name %q: want snake_case", l)
		}
		if slices.Contains(b.Labels[:i], l) {
			return fmt.Errorf("label %q declared twice", l)
		}
		if slices.ContainsFunc(b.Schema.Attrs, func(a Attr) bool { return a.Name == l }) ||
			slices.ContainsFunc(b.Schema.Blocks, func(c Block) bool { return c.Name == l }) {
			return fmt.Errorf("label %q is also declared in the block's body", l)
		}
	}
	return nil
}

// hasLabels reports whether s declares a labelled block at any depth, and
// so needs a host that decodes labels.
func (s Schema) hasLabels() bool {
	return slices.ContainsFunc(s.Blocks, func(b Block) bool { return len(b.Labels) > 0 || b.Schema.hasLabels() })
}

// checkDefault reports whether the JSON encoding of a default fits t, so
// that a mistyped default fails when the plugin starts, not when the host
// decodes an operator's config.
func checkDefault(t Type, b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return checkValue(t, v)
}

func checkValue(t Type, v any) error {
	shape, scalar, err := ParseType(t)
	if err != nil {
		return err
	}
	switch shape {
	case ShapeList:
		if list, ok := v.([]any); ok {
			for _, e := range list {
				if err := checkScalar(scalar, e); err != nil {
					return err
				}
			}
			return nil
		}
	case ShapeMap:
		if m, ok := v.(map[string]any); ok {
			for _, e := range m {
				if err := checkScalar(scalar, e); err != nil {
					return err
				}
			}
			return nil
		}
	default:
		return checkScalar(scalar, v)
	}
	return fmt.Errorf("does not match type %s", t)
}

// checkScalar checks a decoded JSON value against a scalar type.
func checkScalar(t Type, v any) error {
	switch t {
	case TypeString:
		if _, ok := v.(string); ok {
			return nil
		}
	case TypeNumber:
		if _, ok := v.(float64); ok {
			return nil
		}
	case TypeInt:
		if f, ok := v.(float64); ok {
			if f != math.Trunc(f) {
				return fmt.Errorf("%v is not a whole number", f)
			}
			return nil
		}
	case TypeBool:
		if _, ok := v.(bool); ok {
			return nil
		}
	case TypeDuration:
		if s, ok := v.(string); ok {
			if _, err := time.ParseDuration(s); err != nil {
				return err
			}
			return nil
		}
	}
	return fmt.Errorf("does not match type %s", t)
}

func (p *Plugin) validate() error {
	if !regexp.MustCompile(`^[a-z][a-z0-9_-]*$`).MatchString(p.Name) {
		return fmt.Errorf("plugin name %q: want lowercase letters, digits, '-' or '_'", p.Name)
	}
	if p.Version == "" {
		return fmt.Errorf("plugin %q: version is empty", p.Name)
	}
	if p.Routes == nil {
		return fmt.Errorf("plugin %q: no routes", p.Name)
	}
	if err := p.Routes.err(); err != nil {
		return fmt.Errorf("plugin %q: %w", p.Name, err)
	}
	if _, err := p.Config.toProto(); err != nil {
		return fmt.Errorf("plugin %q config schema: %w", p.Name, err)
	}
	return nil
}
