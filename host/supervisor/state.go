package supervisor

// State is a plugin's supervisor state.
//
//	starting ──► ready ──► draining ──► stopped
//	   ▲  │        │
//	   │  ▼        ▼ (exited, unhealthy)
//	   backoff ◄───┘
//	   │
//	   ▼ (more than max_restarts within window)
//	 failed ── (operator restart or changed config) ──► starting
type State string

// States, as shown in /readyz, /v1/plugins and plughost_plugin_state.
const (
	StateStarting State = "starting"
	StateReady    State = "ready"
	StateDraining State = "draining"
	StateStopped  State = "stopped"
	StateBackoff  State = "backoff"
	StateFailed   State = "failed"
)

// States lists every state, for metrics.
var States = []State{StateStarting, StateReady, StateDraining, StateStopped, StateBackoff, StateFailed}
