package sdk

import (
	"encoding/json"
	"fmt"
	"regexp"
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
	TypeBool   Type = "bool"
	// TypeDuration is a string that time.ParseDuration accepts, such as
	// "250ms"; decode it into a Duration.
	TypeDuration Type = "duration"
)

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
		if !validType(a.Type) {
			return nil, fmt.Errorf("attribute %q: unknown type %q", a.Name, a.Type)
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
		n := pluginv1.Block_NESTING_SINGLE
		if b.List {
			n = pluginv1.Block_NESTING_LIST
		}
		out.Blocks = append(out.Blocks, &pluginv1.Block{Name: b.Name, Nesting: n, Required: b.Required, Body: body, Description: b.Description})
	}
	return out, nil
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
	switch t {
	case TypeString:
		if _, ok := v.(string); ok {
			return nil
		}
	case TypeNumber:
		if _, ok := v.(float64); ok {
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
	default:
		if inner, ok := strings.CutPrefix(string(t), "list("); ok {
			list, ok := v.([]any)
			if !ok {
				break
			}
			for _, e := range list {
				if err := checkValue(Type(strings.TrimSuffix(inner, ")")), e); err != nil {
					return err
				}
			}
			return nil
		}
		if inner, ok := strings.CutPrefix(string(t), "map("); ok {
			m, ok := v.(map[string]any)
			if !ok {
				break
			}
			for _, e := range m {
				if err := checkValue(Type(strings.TrimSuffix(inner, ")")), e); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return fmt.Errorf("does not match type %s", t)
}

func validType(t Type) bool {
	switch t {
	case TypeString, TypeNumber, TypeBool, TypeDuration:
		return true
	}
	for _, pre := range []string{"list(", "map("} {
		if inner, ok := strings.CutPrefix(string(t), pre); ok {
			inner, ok = strings.CutSuffix(inner, ")")
			return ok && validType(Type(inner)) && !strings.Contains(inner, "(")
		}
	}
	return false
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
	if p.GCPercent < 0 {
		return fmt.Errorf("plugin %q: GCPercent %d is negative; zero means the default", p.Name, p.GCPercent)
	}
	if p.ExtraProcs < 0 || p.ExtraProcs > maxExtraProcs {
		return fmt.Errorf("plugin %q: ExtraProcs %d is not between 0 and %d", p.Name, p.ExtraProcs, maxExtraProcs)
	}
	if err := p.Routes.err(); err != nil {
		return fmt.Errorf("plugin %q: %w", p.Name, err)
	}
	if _, err := p.Config.toProto(); err != nil {
		return fmt.Errorf("plugin %q config schema: %w", p.Name, err)
	}
	return nil
}
