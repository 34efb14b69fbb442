package ingress

// Exported for tests of functions no test can reach through the
// ingress's own interfaces: a host has no second address in a loopback
// IPv6 /64, and a stream's lifetime is random.
var (
	ClientKey = clientKey
	Jittered  = jittered
)
