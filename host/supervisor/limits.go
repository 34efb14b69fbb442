package supervisor

import pluginv1 "github.com/plughost/plughost/proto/pluginv1"

// configureLimits returns the limits a plugin of spec gets in Configure:
// the host's, with the plugin's own body limit when it has one.
func configureLimits(spec Spec, host *pluginv1.Limits) *pluginv1.Limits {
	if spec.MaxBodyBytes <= 0 {
		return host
	}
	return &pluginv1.Limits{MaxBodyBytes: spec.MaxBodyBytes, RequestTimeoutMs: host.GetRequestTimeoutMs()}
}
