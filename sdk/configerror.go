package sdk

// ConfigError is a refusal of a plugin's config, the one type for it on
// both sides of the contract. A Configure hook returns one (or wraps one)
// to blame an attribute: the host points its diagnostic at the attribute's
// value in the operator's file. The host's supervisor, `plughost
// validate` and the plugintest kit return one, wrapped, when the plugin
// refused its config; find it with errors.As. A config that breaks the
// plugin's declared schema is refused by the host before Configure runs,
// with config diagnostics instead.
type ConfigError struct {
	// Attribute names the attribute to blame, or is empty for the block as
	// a whole.
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
