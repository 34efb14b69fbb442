package config

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/hcl/v2"
)

// Config is a parsed, validated host configuration. Durations and sizes are
// always set: omitted attributes hold their defaults.
type Config struct {
	// File is the config file's path as given to Load or Parse.
	File string
	// Dir is the absolute directory holding File. Relative paths in the
	// file resolve against it, the plugins' own included: each plugin
	// process runs in it.
	Dir string
	// Listen is the ingress address, host:port. Default "127.0.0.1:8080".
	// An empty host listens on every interface.
	Listen string
	// DataDir is the absolute directory under which each plugin gets
	// DataDir/NAME. Default "./data", relative to the config file.
	DataDir string
	// PluginDir is the absolute directory that relative plugin paths resolve
	// against. Default "./bin/plugins", relative to the config file.
	PluginDir string
	// DrainDeadline bounds how long plugins may drain at shutdown. Default 5s.
	DrainDeadline time.Duration
	// Admin configures the admin listener.
	Admin Admin
	// Limits bounds ingress requests and plugin start-up.
	Limits Limits
	// Restart is the policy for restarting crashed plugins.
	Restart Restart
	// Health configures the periodic plugin health checks.
	Health Health
	// Debug holds switches for rehearsing failures; all off by default.
	Debug Debug
	// Plugins are the plugin blocks, in file order.
	Plugins []PluginBlock
	// Files holds the parsed source, by file name, for WriteDiagnostics.
	Files map[string]*hcl.File
}

// Admin configures the listener that serves /metrics and the admin API.
type Admin struct {
	// Listen is the admin address, host:port. Default "127.0.0.1:9090".
	// Listening beyond loopback without a TokenFile exposes the admin API to
	// anyone who can reach the port.
	Listen string
	// TokenFile is the absolute path of a file holding the bearer token the
	// admin API requires, or "" (the default) for no token. The host
	// refuses a file its group or other users can read or write. Config
	// resolves the path; it does not read the file.
	TokenFile string
	// TokenFileRange is the range of the token_file attribute's value,
	// for diagnostics about the file; zero when TokenFile is "".
	TokenFileRange hcl.Range
	// Hosts are the host names, besides IP addresses, localhost and
	// Listen's host, that the admin listener answers in a request's
	// Host header; others get 421, against DNS rebinding. Default none.
	// Name here the names operators and scrapers reach it by.
	Hosts []string
}

// Limits bounds ingress requests and plugin start-up.
type Limits struct {
	// MaxBodyBytes caps a request body, at most 32 MiB
	// (route.MaxBodyCeiling). Default 1048576 (1 MiB). It applies to the
	// routes of plugins whose block sets no PluginBlock.MaxBodyBytes and
	// that declare no limit of their own (sdk.MaxBody).
	MaxBodyBytes int64
	// ReadTimeout bounds reading a whole request. Default 5s.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response. Default 5s.
	WriteTimeout time.Duration
	// IdleTimeout bounds an idle keep-alive connection. Default 60s.
	IdleTimeout time.Duration
	// RequestTimeout is the deadline of non-streaming routes that do not set
	// their own. Default 5s.
	RequestTimeout time.Duration
	// StartTimeout bounds a plugin's handshake, Describe and Configure.
	// Default 10s.
	StartTimeout time.Duration
	// BodyTimeout bounds the arrival of a request body, counted from
	// when the ingress starts reading it; a body still arriving then gets
	// 408. Default 10s.
	BodyTimeout time.Duration

	// MaxConns caps the ingress listener's open connections; one more is
	// answered 503 and closed. Default 10000. The host lowers it at start
	// when the file descriptor limit leaves too little room for it.
	MaxConns int
	// MaxConnsPerIP caps one client's open ingress connections, a client
	// being an IPv4 address or an IPv6 /64; 0 means no cap. Default a
	// quarter of MaxConns, rounded up (DefaultMaxConnsPerIP): 2500 at the
	// default MaxConns. Behind a proxy or NAT every client shares one
	// address, and so one quarter.
	MaxConnsPerIP int
	// MaxConnsPerIPDefault reports that the file does not set
	// max_conns_per_ip, so that MaxConnsPerIP is its default; the host
	// keeps it a quarter of MaxConns when it lowers MaxConns at start.
	MaxConnsPerIPDefault bool
	// MaxStreamsPerIP caps one client's concurrent streams (requests to
	// streaming routes), across plugins, a client keyed as for
	// MaxConnsPerIP; 0 (the default) means no cap.
	MaxStreamsPerIP int
	// StreamWriteTimeout is how long a stream's client may accept no bytes
	// before the host cuts the stream. Default 30s.
	StreamWriteTimeout time.Duration
	// StreamMaxLifetime ends a stream about this long after it began
	// (within ±10%, so that clients do not all reconnect at once); 0 means
	// no limit. Default 30m.
	StreamMaxLifetime time.Duration
	// StreamBuffer is the response credit a stream's plugin gets, in bytes:
	// what the host buffers for a stream whose client reads slowly.
	// Default 65536 (64 KiB).
	StreamBuffer int64
}

// Restart is the policy for restarting crashed plugins.
type Restart struct {
	// InitialBackoff is the first delay before a restart; the delay doubles,
	// with jitter, up to MaxBackoff. Default 100ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the restart delay; it is at least InitialBackoff.
	// Default 5s.
	MaxBackoff time.Duration
	// MaxRestarts is how many restarts Window allows; one more marks the
	// plugin failed. Zero fails a plugin on its first crash. Default 5.
	MaxRestarts int
	// Window is the sliding window MaxRestarts counts over. Default 1m.
	Window time.Duration
	// StableAfter is how long a plugin must stay ready for its backoff to
	// reset. Default 10s.
	StableAfter time.Duration
}

// Health configures the periodic plugin health checks.
type Health struct {
	// Interval is the time between checks. Default 2s.
	Interval time.Duration
	// Timeout bounds one check; it is at most Interval. Default 1s.
	Timeout time.Duration
	// Failures is how many consecutive failed checks restart the plugin.
	// Default 3.
	Failures int
}

// Debug holds switches for rehearsing failures.
type Debug struct {
	// Faults lets the admin API set faults at plugins' named fault points
	// (POST /v1/plugins/NAME/faults). Default false. A reload applies it;
	// turning it off clears the faults set. Never enable it where
	// untrusted parties can reach the admin listener: a fault can stall or
	// fail a plugin at will.
	Faults bool
}

// PluginBlock is one plugin block: an instance of a plugin binary.
type PluginBlock struct {
	// Name is the block label, unique in the file, matching [a-z][a-z0-9_-]*.
	Name string
	// Path is the absolute path of the plugin binary.
	Path string
	// SHA256 is the lowercase hex SHA-256 the binary must have, or "" for no
	// pin.
	SHA256 string
	// Mount is the ingress path prefix the plugin's routes live under.
	// Default "/NAME". Mounts are unique and never nest inside one another,
	// nor inside /healthz or /readyz.
	Mount string
	// MaxInflight caps the plugin's concurrent requests. Default 512.
	// Requests to streaming routes do not count against it.
	MaxInflight int
	// MaxStreams caps the plugin's concurrent requests to streaming routes.
	// Default 1024.
	MaxStreams int
	// MaxBodyBytes is the plugin's request body limit, from 1 to 32 MiB
	// (route.MaxBodyCeiling), or 0, the default, when the block sets
	// none: then Limits.MaxBodyBytes applies, and follows it when a
	// reload changes it. Set, it is the limit of the plugin's routes that
	// declare none, and caps those that declare their own (sdk.MaxBody):
	// the operator has the last word. Unset, such a route keeps its own.
	MaxBodyBytes int64
	// LogRate is the records a second of the plugin's output (stdout and
	// stderr lines, its logger's records) the host relays into its log,
	// refilling a bucket of LogBurst; records beyond it are dropped and
	// counted. A record longer than 4 KiB counts once per 4 KiB started.
	// Default 200; 0 turns the limit off.
	LogRate int
	// LogBurst is how many records the host relays at once before
	// LogRate holds it back. Default 1000.
	LogBurst int
	// Required marks a plugin the host cannot do without. Default true.
	Required bool
	// UnreadyWhenDegraded makes the aggregate /readyz answer 503 while
	// this plugin, if required, reports itself degraded, so that a load
	// balancer takes traffic away from a host whose plugin cannot do all
	// its work. Default false: a degraded plugin still serves, and
	// /readyz counts it as ready. GET /readyz/NAME answers 503 for a
	// degraded plugin either way.
	UnreadyWhenDegraded bool
	// DataDir is the plugin's own directory, Config.DataDir/Name.
	DataDir string
	// Env holds the variables of the plugin's env block, set in the
	// plugin's environment only, on top of the host variables it inherits
	// (catalog.DefaultEnv); nil when the block is absent or empty. Names
	// are valid environment variable names outside the handshake's
	// PLUGHOST_ and PLUGIN_ prefixes. Meant for runtime settings such as
	// GOGC or GOMEMLIMIT; a secret set here is visible to that plugin.
	Env map[string]string
	// Config is the body of the plugin's config block, for
	// DecodePluginConfig. When the block is absent it is an empty body whose
	// missing-item range is DeclRange, so that "missing required argument"
	// diagnostics still point at the plugin block.
	Config hcl.Body
	// DeclRange is the range of the plugin block's header.
	DeclRange hcl.Range
	// PathRange is the range of the path attribute's value.
	PathRange hcl.Range
	// SHA256Range is the range of the sha256 attribute's value, or DeclRange
	// when the attribute is absent.
	SHA256Range hcl.Range
	// ConfigRange is the range of the config block's header, or DeclRange
	// when the block is absent.
	ConfigRange hcl.Range
}

// Load reads and parses the config file at path. A file that cannot be read
// is reported as a diagnostic, like any other problem.
//
// Load always returns a non-nil Config whose Files can print the
// diagnostics; see Parse for what its other fields hold when the
// diagnostics hold errors.
func Load(path string) (*Config, hcl.Diagnostics) {
	src, err := readFile(path)
	if err != nil {
		start := hcl.Pos{Line: 1, Column: 1}
		return &Config{File: path, Files: map[string]*hcl.File{}}, hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Cannot read config file",
			Detail:   err.Error() + ".",
			Subject:  &hcl.Range{Filename: path, Start: start, End: start},
		}}
	}
	return Parse(src, path)
}

// readFile reads the file at path, or its first maxFileBytes+1 bytes
// when it is larger, which is enough for Parse to refuse it.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxFileBytes+1))
}

// Parse parses src as the config file named filename. The name appears in
// diagnostics, and relative paths in the file resolve against its directory
// (against the working directory when filename is relative).
//
// Parse always returns a non-nil Config whose Files can print the
// diagnostics. When the diagnostics hold errors, the host settings are
// not to be used, but Plugins still holds every plugin block the parser
// could read whole, for checks that do not need the rest (validate's):
// its Path is "" when the path attribute is missing or broken, or is
// relative to a plugin_dir that is broken. The diagnostics are sorted by
// position.
func Parse(src []byte, filename string) (*Config, hcl.Diagnostics) {
	c, diags := parse(src, filename)
	SortDiagnostics(diags)
	return c, diags
}

// SortDiagnostics sorts diags by file and position, those without a
// subject first, keeping the order of diagnostics at one position.
func SortDiagnostics(diags hcl.Diagnostics) {
	slices.SortStableFunc(diags, compareDiagnostics)
}

// compareDiagnostics orders diagnostics by file and position, those without
// a subject first.
func compareDiagnostics(a, b *hcl.Diagnostic) int {
	switch {
	case a.Subject == nil && b.Subject == nil:
		return 0
	case a.Subject == nil:
		return -1
	case b.Subject == nil:
		return 1
	}
	return cmp.Or(
		cmp.Compare(a.Subject.Filename, b.Subject.Filename),
		cmp.Compare(a.Subject.Start.Byte, b.Subject.Start.Byte),
	)
}

// Position returns where r starts as "file:line:col", the form editors
// and grep find, which WriteDiagnostics puts before each diagnostic.
func Position(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// WriteDiagnostics prints diags in HCL's text format, with source snippets
// taken from files (usually Config.Files). Each diagnostic that has a subject
// is preceded by "file:line:col: " so that editors and grep can find it.
func WriteDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics) error {
	tw := hcl.NewDiagnosticTextWriter(w, files, 0, false)
	for _, d := range diags {
		if d == nil {
			return errors.New("write diagnostics: nil diagnostic")
		}
		if d.Subject != nil {
			if _, err := fmt.Fprintf(w, "%s: ", Position(*d.Subject)); err != nil {
				return fmt.Errorf("write diagnostics: %w", err)
			}
		}
		if err := tw.WriteDiagnostic(d); err != nil {
			return fmt.Errorf("write diagnostics: %w", err)
		}
	}
	return nil
}
