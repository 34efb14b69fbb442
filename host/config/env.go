package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// envNameRE is what a plugin's env block accepts as a variable name: the
// portable shell name, which every runtime and shell can read back.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnvPrefixes are the prefixes of the variables the host and
// go-plugin set for the handshake (the magic cookie PLUGHOST_PLUGIN, the
// data-plane descriptors, PLUGIN_MIN_PORT, PLUGIN_CLIENT_CERT, ...). A
// plugin block must not set them: the handshake would fail or, worse,
// half work.
var reservedEnvPrefixes = []string{"PLUGHOST_", "PLUGIN_"}

// runtimeEnv are the variables the Go runtime reads, which an env block
// most often sets; a name close to one of them but not equal is probably
// a typo.
var runtimeEnv = []string{"GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GODEBUG", "GOTRACEBACK"}

// env decodes a plugin's env block into variables. Each problem is a
// diagnostic at the attribute it concerns.
func (d *decoder) env(body hcl.Body) map[string]string {
	attrs, diags := body.JustAttributes()
	d.diags = append(d.diags, diags...)
	sorted := make([]*hcl.Attribute, 0, len(attrs))
	for _, a := range attrs {
		sorted = append(sorted, a)
	}
	slices.SortFunc(sorted, func(a, b *hcl.Attribute) int { return a.NameRange.Start.Byte - b.NameRange.Start.Byte })

	var env map[string]string
	for _, a := range sorted {
		if !d.envName(a) {
			continue
		}
		v, vdiags := a.Expr.Value(nil)
		if vdiags.HasErrors() {
			d.diags = append(d.diags, vdiags...)
			continue
		}
		if !v.IsKnown() || v.IsNull() || v.Type() != cty.String {
			d.errorf(a.Expr.Range(), "Invalid environment value",
				"The value of %s must be a string%s", a.Name, quoteHint(v))
			continue
		}
		if env == nil {
			env = make(map[string]string)
		}
		env[a.Name] = v.AsString()
	}
	return env
}

// envName reports whether a's name may be set in a plugin's environment,
// and adds a diagnostic when it may not, or when it looks like a misspelt
// Go runtime variable.
func (d *decoder) envName(a *hcl.Attribute) bool {
	if !envNameRE.MatchString(a.Name) {
		d.errorf(a.NameRange, "Invalid environment variable name",
			"%q is not a valid environment variable name: use letters, digits and \"_\", not starting with a digit.", a.Name)
		return false
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(strings.ToUpper(a.Name), p) {
			d.errorf(a.NameRange, "Reserved environment variable",
				"%s cannot be set: variables starting with %s belong to the plugin handshake, which the host sets up itself.", a.Name, p)
			return false
		}
	}
	if s := suggest(a.Name, runtimeEnv); s != "" && s != a.Name {
		d.diags = append(d.diags, &hcl.Diagnostic{
			Severity: hcl.DiagWarning,
			Summary:  "Unknown Go runtime variable",
			Detail:   fmt.Sprintf("%s is not a variable the Go runtime reads. Did you mean %q? Names are case-sensitive.", a.Name, s),
			Subject:  a.NameRange.Ptr(),
		})
	}
	return true
}

// quoteHint ends the sentence about a value that is not a string, with the
// quoted form of a number or bool: what an operator who wrote GOGC = 800
// meant.
func quoteHint(v cty.Value) string {
	if !v.IsKnown() || v.IsNull() {
		return "."
	}
	switch v.Type() {
	case cty.Number:
		return fmt.Sprintf(`. Did you mean "%s"?`, v.AsBigFloat().Text('f', -1))
	case cty.Bool:
		return fmt.Sprintf(`. Did you mean "%t"?`, v.True())
	}
	return fmt.Sprintf(", got %s.", v.Type().FriendlyName())
}
