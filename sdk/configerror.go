package sdk

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ConfigError is a refusal of a plugin's config, the one type for it on
// both sides of the contract. A Configure hook returns one (or wraps one)
// to blame an attribute or a block: the host points its diagnostic at it
// in the operator's file. The host's supervisor, `plughost validate` and
// the plugintest kit return one, wrapped, when the plugin refused its
// config; find it with errors.As. A config that breaks the plugin's
// declared schema is refused by the host before Configure runs, with
// config diagnostics instead.
//
// Naming an Attribute also says that the config is at fault: the host
// shows the plugin failed and does not restart it, since the same config
// would be refused again, until the operator reloads a changed block or
// restarts the plugin. Return a plain error instead (a store that cannot
// open on a full disk) for a failure that may pass: the host retries
// that with backoff for as long as it lasts.
type ConfigError struct {
	// Attribute is the path from the config block to what is wrong, in
	// the grammar ParseConfigPath reads, or empty for the config block as
	// a whole:
	//
	//	port                      an attribute
	//	tls.cert                  an attribute of a single block
	//	upstream[0].url           of the first block of a list
	//	upstream["wallet"].url    of the labelled block upstream "wallet"
	//	upstream["wallet"]        the block itself
	//
	// Quote labels as fmt's %q does: fmt.Sprintf("upstream[%q].url", name).
	// The host points at the attribute's value, or at the block's header
	// when the path ends at a block or at an attribute the operator left
	// to its default.
	Attribute string
	// Message says what is wrong and what would be right, as a lowercase
	// fragment: "must be from 1 to 1024, got 0".
	Message string
}

// Error returns the attribute and the message: "port: must be positive".
func (e *ConfigError) Error() string {
	if e.Attribute == "" {
		return e.message()
	}
	return e.Attribute + ": " + e.message()
}

// message is Message, never empty: an empty refusal would read as none.
func (e *ConfigError) message() string {
	if e.Message == "" {
		return "config refused"
	}
	return e.Message
}

// PathStep is one step of a config path: an attribute or a block, and for
// a block that repeats, which one.
type PathStep struct {
	// Name is the attribute's or the block's name.
	Name string
	// Labels pick a labelled block by its labels, in order; nil otherwise.
	Labels []string
	// Index picks a block of a list by its position, from 0, when Indexed.
	Index   int
	Indexed bool
}

// ParseConfigPath parses a config path, ConfigError.Attribute, into its
// steps: names joined by dots, each optionally followed by a position in
// brackets ([0]) or by one or more labels, each a Go string literal in
// brackets (["wallet"]). It is the one parser of the grammar the SDK and
// the host share. An empty path has no steps.
func ParseConfigPath(path string) ([]PathStep, error) {
	if path == "" {
		return nil, nil
	}
	var steps []PathStep
	rest := path
	for {
		n := strings.IndexFunc(rest, func(r rune) bool {
			return !(r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		})
		if n < 0 {
			n = len(rest)
		}
		if n == 0 {
			return nil, fmt.Errorf("config path %q: want a name at %q", path, rest)
		}
		st := PathStep{Name: rest[:n]}
		rest = rest[n:]
		for strings.HasPrefix(rest, "[") {
			var err error
			if st, rest, err = parseSelector(st, rest[1:]); err != nil {
				return nil, fmt.Errorf("config path %q: %w", path, err)
			}
		}
		steps = append(steps, st)
		if rest == "" {
			return steps, nil
		}
		if rest[0] != '.' {
			return nil, fmt.Errorf("config path %q: want '.' or '[' at %q", path, rest)
		}
		rest = rest[1:]
	}
}

// parseSelector parses what follows a '[' in a config path, up to and
// including its ']': a position or a quoted label.
func parseSelector(st PathStep, rest string) (PathStep, string, error) {
	if strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return st, "", fmt.Errorf("bad label at %q", rest)
		}
		if st.Indexed {
			return st, "", errors.New("a block is picked by position or by labels, not both")
		}
		l, _ := strconv.Unquote(q) // QuotedPrefix checked it
		st.Labels = append(st.Labels, l)
		rest = rest[len(q):]
	} else {
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(rest)
		}
		i, err := strconv.Atoi(rest[:end])
		if err != nil {
			return st, "", fmt.Errorf("want a position or a quoted label at %q", rest)
		}
		if st.Indexed || st.Labels != nil {
			return st, "", errors.New("a block is picked by one position or by labels")
		}
		st.Index, st.Indexed = i, true
		rest = rest[end:]
	}
	if !strings.HasPrefix(rest, "]") {
		return st, "", fmt.Errorf("want ']' at %q", rest)
	}
	return st, rest[1:], nil
}
