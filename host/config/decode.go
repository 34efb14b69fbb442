package config

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/plughost/plughost/sdk/route"
)

// Defaults of the host configuration; the field comments on Config repeat
// them for readers of the API.
const (
	defaultListen         = "127.0.0.1:8080"
	defaultDataDir        = "./data"
	defaultPluginDir      = "./bin/plugins"
	defaultDrainDeadline  = 5 * time.Second
	defaultAdminListen    = "127.0.0.1:9090"
	defaultMaxBodyBytes   = 1 << 20
	maxBodyBytesLimit     = route.MaxBodyCeiling
	defaultReadTimeout    = 5 * time.Second
	defaultWriteTimeout   = 5 * time.Second
	defaultIdleTimeout    = 60 * time.Second
	defaultRequestTimeout = 5 * time.Second
	defaultBodyTimeout    = 10 * time.Second
	defaultStartTimeout   = 10 * time.Second
	defaultInitialBackoff = 100 * time.Millisecond
	defaultMaxBackoff     = 5 * time.Second
	defaultMaxRestarts    = 5
	defaultWindow         = time.Minute
	defaultStableAfter    = 10 * time.Second
	defaultHealthInterval = 2 * time.Second
	defaultHealthTimeout  = time.Second
	defaultHealthFailures = 3
	defaultMaxInflight    = 512
	// defaultLogRate and defaultLogBurst keep a flooding plugin's share
	// of the host log well under 1 MB/s: 200 records of at most 4 KiB
	// each a second.
	defaultLogRate  = 200
	defaultLogBurst = 1000
)

// reservedMounts are ingress paths the host serves itself.
var reservedMounts = []string{"/healthz", "/readyz"}

var pluginNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)

// The *Body types mirror the file for gohcl. Attributes stay *hcl.Attribute
// so that every check can point at the value it rejects.
type fileBody struct {
	Listen        *hcl.Attribute `hcl:"listen,optional"`
	DataDir       *hcl.Attribute `hcl:"data_dir,optional"`
	PluginDir     *hcl.Attribute `hcl:"plugin_dir,optional"`
	DrainDeadline *hcl.Attribute `hcl:"drain_deadline,optional"`
	Admin         *adminBody     `hcl:"admin,block"`
	Limits        *limitsBody    `hcl:"limits,block"`
	Restart       *restartBody   `hcl:"restart,block"`
	Health        *healthBody    `hcl:"health,block"`
	Debug         *debugBody     `hcl:"debug,block"`
	Plugins       []*pluginBody  `hcl:"plugin,block"`
}

type debugBody struct {
	Faults *hcl.Attribute `hcl:"faults,optional"`
}

type adminBody struct {
	Listen    *hcl.Attribute `hcl:"listen,optional"`
	TokenFile *hcl.Attribute `hcl:"token_file,optional"`
	Hosts     *hcl.Attribute `hcl:"hosts,optional"`
}

type limitsBody struct {
	MaxBodyBytes   *hcl.Attribute `hcl:"max_body_bytes,optional"`
	ReadTimeout    *hcl.Attribute `hcl:"read_timeout,optional"`
	WriteTimeout   *hcl.Attribute `hcl:"write_timeout,optional"`
	IdleTimeout    *hcl.Attribute `hcl:"idle_timeout,optional"`
	RequestTimeout *hcl.Attribute `hcl:"request_timeout,optional"`
	StartTimeout   *hcl.Attribute `hcl:"start_timeout,optional"`
	BodyTimeout    *hcl.Attribute `hcl:"body_timeout,optional"`
	// Connections and streams: decoded by connLimits.
	MaxConns           *hcl.Attribute `hcl:"max_conns,optional"`
	MaxConnsPerIP      *hcl.Attribute `hcl:"max_conns_per_ip,optional"`
	MaxStreamsPerIP    *hcl.Attribute `hcl:"max_streams_per_ip,optional"`
	StreamWriteTimeout *hcl.Attribute `hcl:"stream_write_timeout,optional"`
	StreamMaxLifetime  *hcl.Attribute `hcl:"stream_max_lifetime,optional"`
	StreamBuffer       *hcl.Attribute `hcl:"stream_buffer,optional"`
}

type restartBody struct {
	InitialBackoff *hcl.Attribute `hcl:"initial_backoff,optional"`
	MaxBackoff     *hcl.Attribute `hcl:"max_backoff,optional"`
	MaxRestarts    *hcl.Attribute `hcl:"max_restarts,optional"`
	Window         *hcl.Attribute `hcl:"window,optional"`
	StableAfter    *hcl.Attribute `hcl:"stable_after,optional"`
}

type healthBody struct {
	Interval *hcl.Attribute `hcl:"interval,optional"`
	Timeout  *hcl.Attribute `hcl:"timeout,optional"`
	Failures *hcl.Attribute `hcl:"failures,optional"`
}

type pluginBody struct {
	Name        string         `hcl:"name,label"`
	NameRange   hcl.Range      `hcl:"name,label_range"`
	DeclRange   hcl.Range      `hcl:",def_range"`
	Path        *hcl.Attribute `hcl:"path,optional"`
	SHA256      *hcl.Attribute `hcl:"sha256,optional"`
	Mount       *hcl.Attribute `hcl:"mount,optional"`
	MaxInflight *hcl.Attribute `hcl:"max_inflight,optional"`
	MaxStreams  *hcl.Attribute `hcl:"max_streams,optional"`
	// MaxBodyBytes is max_body_bytes.
	MaxBodyBytes *hcl.Attribute `hcl:"max_body_bytes,optional"`
	LogRate      *hcl.Attribute `hcl:"log_rate,optional"`
	LogBurst     *hcl.Attribute `hcl:"log_burst,optional"`
	Required     *hcl.Attribute `hcl:"required,optional"`
	// UnreadyWhenDegraded is unready_when_degraded.
	UnreadyWhenDegraded *hcl.Attribute `hcl:"unready_when_degraded,optional"`
	Env                 *envBody       `hcl:"env,block"`
	Config              *configBody    `hcl:"config,block"`
}

// envBody is a plugin's env block: attributes only, whose names are not
// known in advance.
type envBody struct {
	Body hcl.Body `hcl:",remain"`
}

type configBody struct {
	Body      hcl.Body  `hcl:",remain"`
	DeclRange hcl.Range `hcl:",def_range"`
}

func parse(src []byte, filename string) (*Config, hcl.Diagnostics) {
	c := &Config{
		File:          filename,
		Listen:        defaultListen,
		DrainDeadline: defaultDrainDeadline,
		Admin:         Admin{Listen: defaultAdminListen},
		Limits: Limits{
			MaxBodyBytes:   defaultMaxBodyBytes,
			ReadTimeout:    defaultReadTimeout,
			WriteTimeout:   defaultWriteTimeout,
			IdleTimeout:    defaultIdleTimeout,
			RequestTimeout: defaultRequestTimeout,
			StartTimeout:   defaultStartTimeout,
			BodyTimeout:    defaultBodyTimeout,
		},
		Restart: Restart{
			InitialBackoff: defaultInitialBackoff,
			MaxBackoff:     defaultMaxBackoff,
			MaxRestarts:    defaultMaxRestarts,
			Window:         defaultWindow,
			StableAfter:    defaultStableAfter,
		},
		Health: Health{
			Interval: defaultHealthInterval,
			Timeout:  defaultHealthTimeout,
			Failures: defaultHealthFailures,
		},
	}

	if diags := checkBounds(src, filename); diags.HasErrors() {
		c.Files = quoteBounds(src, filename, diags[0])
		return c, diags
	}
	p := hclparse.NewParser()
	file, diags := p.ParseHCL(src, filename)
	c.Files = p.Files()
	if file == nil {
		return c, diags
	}
	body := file.Body
	d := &decoder{pluginDirKnown: true}
	if diags.HasErrors() {
		// The parser recovers at the end of the item that broke, so the
		// items around it are whole: decoding them reports their own
		// problems (a plugin's binary, its config block) in the same run
		// as the syntax errors. Decoding the damaged items would only add
		// noise to those.
		var damagedPluginDir bool
		body, damagedPluginDir = intactItems(file.Body, diags, src)
		d.pluginDirKnown = !damagedPluginDir
	}

	var fb fileBody
	diags = append(diags, gohcl.DecodeBody(body, nil, &fb)...)
	suggestKeys(body, diags)
	d.diags = diags

	base, err := filepath.Abs(filepath.Dir(filename))
	if err != nil {
		start := hcl.Pos{Line: 1, Column: 1}
		d.errorf(hcl.Range{Filename: filename, Start: start, End: start},
			"Cannot resolve config directory", "%s.", err)
	}
	d.decode(c, &fb, base)
	return c, d.diags
}

// decoder accumulates diagnostics while it fills a Config.
type decoder struct {
	diags hcl.Diagnostics
	// pluginDirKnown is false when plugin_dir is in the file but could
	// not be decoded: relative plugin paths then resolve to nothing.
	pluginDirKnown bool
}

// intactItems returns the top-level attributes and blocks of body that no
// error in diags touches, and whether src may hold a plugin_dir among the
// damaged ones (then where relative plugin paths lead is unknown).
func intactItems(body hcl.Body, diags hcl.Diagnostics, src []byte) (hcl.Body, bool) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return emptyBody(hcl.Range{}), true
	}
	// By line: an error can sit just past the item it broke
	// (`plugin_dir = "/p" "/q"`).
	damaged := func(r hcl.Range) bool {
		for _, d := range diags {
			if d.Severity == hcl.DiagError && d.Subject != nil &&
				d.Subject.Start.Line <= r.End.Line && r.Start.Line <= d.Subject.End.Line {
				return true
			}
		}
		return false
	}
	out := &hclsyntax.Body{Attributes: hclsyntax.Attributes{}, SrcRange: sb.SrcRange, EndRange: sb.EndRange}
	for name, a := range sb.Attributes {
		if !damaged(a.SrcRange) {
			out.Attributes[name] = a
		}
	}
	for _, b := range sb.Blocks {
		if !damaged(b.Range()) {
			out.Blocks = append(out.Blocks, b)
		}
	}
	_, intactDir := out.Attributes["plugin_dir"]
	return out, !intactDir && bytes.Contains(src, []byte("plugin_dir"))
}

func (d *decoder) errorf(subject hcl.Range, summary, format string, args ...any) {
	d.diags = append(d.diags, &hcl.Diagnostic{
		Severity: hcl.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(format, args...),
		Subject:  subject.Ptr(),
	})
}

func (d *decoder) decode(c *Config, fb *fileBody, base string) {
	c.Dir = base
	if fb.Admin == nil {
		fb.Admin = &adminBody{}
	}
	if fb.Limits == nil {
		fb.Limits = &limitsBody{}
	}
	if fb.Restart == nil {
		fb.Restart = &restartBody{}
	}
	if fb.Health == nil {
		fb.Health = &healthBody{}
	}
	if fb.Debug != nil {
		decodeAttr(d, fb.Debug.Faults, &c.Debug.Faults)
	}

	d.listen(fb.Listen, &c.Listen)
	c.DataDir = resolve(base, defaultDataDir)
	d.dir(fb.DataDir, base, &c.DataDir)
	c.PluginDir = resolve(base, defaultPluginDir)
	if !d.dir(fb.PluginDir, base, &c.PluginDir) && fb.PluginDir != nil {
		d.pluginDirKnown = false
	}
	d.duration(fb.DrainDeadline, &c.DrainDeadline)

	d.listen(fb.Admin.Listen, &c.Admin.Listen)
	if _, port, _ := net.SplitHostPort(c.Listen); c.Admin.Listen == c.Listen && port != "0" &&
		(fb.Listen != nil || fb.Admin.Listen != nil) {
		at := fb.Listen
		if fb.Admin.Listen != nil {
			at = fb.Admin.Listen
		}
		d.errorf(at.Expr.Range(), "Conflicting listen addresses",
			"The admin listener and the ingress listener cannot share the address %q.", c.Listen)
	}
	var token string
	if decodeAttr(d, fb.Admin.TokenFile, &token) && token != "" {
		c.Admin.TokenFile = resolve(base, token)
		c.Admin.TokenFileRange = fb.Admin.TokenFile.Expr.Range()
	}
	d.adminHosts(fb.Admin.Hosts, &c.Admin.Hosts)

	l := fb.Limits
	d.maxBody(l.MaxBodyBytes, &c.Limits.MaxBodyBytes)
	d.duration(l.ReadTimeout, &c.Limits.ReadTimeout)
	d.duration(l.WriteTimeout, &c.Limits.WriteTimeout)
	d.duration(l.IdleTimeout, &c.Limits.IdleTimeout)
	d.duration(l.RequestTimeout, &c.Limits.RequestTimeout)
	d.duration(l.StartTimeout, &c.Limits.StartTimeout)
	d.duration(l.BodyTimeout, &c.Limits.BodyTimeout)
	d.connLimits(&c.Limits, l)

	r := fb.Restart
	// A pair is compared only when each side is valid or defaulted.
	okInitial := d.duration(r.InitialBackoff, &c.Restart.InitialBackoff) || r.InitialBackoff == nil
	okMax := d.duration(r.MaxBackoff, &c.Restart.MaxBackoff) || r.MaxBackoff == nil
	if okInitial && okMax && c.Restart.MaxBackoff < c.Restart.InitialBackoff {
		at := r.MaxBackoff
		if at == nil {
			at = r.InitialBackoff
		}
		d.errorf(at.Expr.Range(), "Invalid restart backoff",
			"max_backoff (%s) must be at least initial_backoff (%s).",
			c.Restart.MaxBackoff, c.Restart.InitialBackoff)
	}
	decodeInt(d, r.MaxRestarts, &c.Restart.MaxRestarts, 0)
	d.duration(r.Window, &c.Restart.Window)
	d.duration(r.StableAfter, &c.Restart.StableAfter)

	h := fb.Health
	okInterval := d.duration(h.Interval, &c.Health.Interval) || h.Interval == nil
	okTimeout := d.duration(h.Timeout, &c.Health.Timeout) || h.Timeout == nil
	if okInterval && okTimeout && c.Health.Timeout > c.Health.Interval {
		at := h.Timeout
		if at == nil {
			at = h.Interval
		}
		d.errorf(at.Expr.Range(), "Invalid health timeout",
			"timeout (%s) must not exceed interval (%s).", c.Health.Timeout, c.Health.Interval)
	}
	decodeInt(d, h.Failures, &c.Health.Failures, 1)

	d.plugins(c, fb.Plugins)
}

// mounted is a mount already taken, by a plugin or (owner "") by the host.
type mounted struct {
	mount string
	owner string
	rng   hcl.Range
}

func (d *decoder) plugins(c *Config, blocks []*pluginBody) {
	names := make(map[string]hcl.Range)
	var taken []mounted
	for _, m := range reservedMounts {
		taken = append(taken, mounted{mount: m})
	}

	for _, pb := range blocks {
		p := PluginBlock{
			Name:        pb.Name,
			MaxInflight: defaultMaxInflight,
			MaxStreams:  defaultMaxStreams,
			LogRate:     defaultLogRate,
			LogBurst:    defaultLogBurst,
			Required:    true,
			DataDir:     filepath.Join(c.DataDir, pb.Name),
			DeclRange:   pb.DeclRange,
			PathRange:   pb.DeclRange,
			SHA256Range: pb.DeclRange,
			ConfigRange: pb.DeclRange,
			Config:      emptyBody(pb.DeclRange),
		}

		nameOK := pluginNameRE.MatchString(p.Name)
		if !nameOK {
			d.errorf(pb.NameRange, "Invalid plugin name",
				"%q is not a valid plugin name: use a lowercase letter followed by lowercase letters, digits, \"_\" or \"-\".",
				p.Name)
		} else if prev, dup := names[p.Name]; dup {
			d.errorf(pb.NameRange, "Duplicate plugin name",
				"A plugin named %q was already declared at %s.", p.Name, prev)
		} else {
			names[p.Name] = pb.DeclRange
		}

		var bin string
		if pb.Path == nil {
			// gohcl treats pointer fields as optional, so require path here.
			d.errorf(pb.DeclRange, "Missing required argument",
				"The argument \"path\" is required, but no definition was found.")
		} else if decodeAttr(d, pb.Path, &bin) {
			p.PathRange = pb.Path.Expr.Range()
			switch {
			case bin == "":
				d.errorf(p.PathRange, "Invalid plugin path", "The path of plugin %q must not be empty.", p.Name)
			case filepath.IsAbs(bin) || d.pluginDirKnown:
				p.Path = resolve(c.PluginDir, bin)
			}
		}

		var sum string
		if decodeAttr(d, pb.SHA256, &sum) {
			p.SHA256Range = pb.SHA256.Expr.Range()
			if _, err := hex.DecodeString(sum); sum != "" && (len(sum) != 64 || err != nil) {
				d.errorf(p.SHA256Range, "Invalid sha256",
					"sha256 must be 64 hexadecimal digits, or empty for no pin; got %q.", sum)
			} else {
				p.SHA256 = strings.ToLower(sum)
			}
		}

		mountOK := nameOK
		mountRange := pb.DeclRange
		p.Mount = "/" + p.Name
		if pb.Mount != nil {
			mountRange = pb.Mount.Expr.Range()
			mountOK = decodeAttr(d, pb.Mount, &p.Mount)
			if mountOK {
				if problem := checkMount(p.Mount); problem != "" {
					d.errorf(mountRange, "Invalid mount", "Mount %q %s.", p.Mount, problem)
					mountOK = false
				}
			}
		}
		if mountOK {
			if d.overlaps(taken, p.Mount, mountRange) {
				mountOK = false
			}
		}
		if mountOK {
			taken = append(taken, mounted{mount: p.Mount, owner: p.Name, rng: mountRange})
		}

		decodeInt(d, pb.MaxInflight, &p.MaxInflight, 1)
		decodeInt(d, pb.MaxStreams, &p.MaxStreams, 1)
		d.maxBody(pb.MaxBodyBytes, &p.MaxBodyBytes)
		decodeInt(d, pb.LogRate, &p.LogRate, 0)
		decodeInt(d, pb.LogBurst, &p.LogBurst, 1)
		decodeAttr(d, pb.Required, &p.Required)
		decodeAttr(d, pb.UnreadyWhenDegraded, &p.UnreadyWhenDegraded)

		if pb.Env != nil {
			p.Env = d.env(pb.Env.Body)
		}
		if pb.Config != nil {
			p.Config = pb.Config.Body
			p.ConfigRange = pb.Config.DeclRange
		}
		c.Plugins = append(c.Plugins, p)
	}
}

// overlaps reports, as a diagnostic at rng, whether mount clashes with one
// already taken.
func (d *decoder) overlaps(taken []mounted, mount string, rng hcl.Range) bool {
	for _, t := range taken {
		nested := strings.HasPrefix(mount, t.mount+"/") || strings.HasPrefix(t.mount, mount+"/")
		switch {
		case t.owner == "" && (mount == t.mount || nested):
			d.errorf(rng, "Reserved mount",
				"Mount %q collides with %q, which the host serves itself.", mount, t.mount)
		case mount == t.mount:
			d.errorf(rng, "Duplicate mount",
				"Plugin %q already mounts %q at %s.", t.owner, mount, t.rng)
		case nested:
			d.errorf(rng, "Overlapping mounts",
				"Mount %q nests with mount %q of plugin %q at %s; mounts must not nest.",
				mount, t.mount, t.owner, t.rng)
		default:
			continue
		}
		return true
	}
	return false
}

// checkMount returns what is wrong with mount, or "" when it is usable as a
// path prefix in a net/http ServeMux pattern.
func checkMount(mount string) string {
	switch {
	case !strings.HasPrefix(mount, "/"):
		return `must start with "/"`
	case strings.HasSuffix(mount, "/"):
		return `must not end with "/"`
	case strings.ContainsAny(mount, "?#{}%"):
		return `must not contain "?", "#", "{", "}" or "%"`
	case strings.ContainsFunc(mount, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "must not contain spaces or control characters"
	case path.Clean(mount) != mount:
		return `must be a clean path, without "//", "." or ".." segments`
	}
	return ""
}

// decodeAttr decodes a's constant value into dst and reports whether a was
// present and decoded.
func decodeAttr[T any](d *decoder, a *hcl.Attribute, dst *T) bool {
	if a == nil {
		return false
	}
	// Evaluate first so that a variable or function call is one diagnostic,
	// not that plus a type error about the unknown result.
	if _, diags := a.Expr.Value(nil); diags.HasErrors() {
		d.diags = append(d.diags, diags...)
		return false
	}
	var v T
	diags := gohcl.DecodeExpression(a.Expr, nil, &v)
	d.diags = append(d.diags, diags...)
	if diags.HasErrors() {
		return false
	}
	*dst = v
	return true
}

func decodeInt[T int | int64](d *decoder, a *hcl.Attribute, dst *T, minimum T) bool {
	var v T
	if !decodeAttr(d, a, &v) {
		return false
	}
	if v < minimum {
		d.errorf(a.Expr.Range(), "Value out of range", "%s must be at least %d, got %d.", a.Name, minimum, v)
		return false
	}
	*dst = v
	return true
}

// maxBody decodes a max_body_bytes: at least 1 and at most the host's
// ceiling, whose value a plugin block cannot raise either.
func (d *decoder) maxBody(a *hcl.Attribute, dst *int64) bool {
	var v int64
	if !decodeInt(d, a, &v, 1) {
		return false
	}
	if v > maxBodyBytesLimit {
		d.errorf(a.Expr.Range(), "Value out of range",
			"max_body_bytes must be at most %d (32 MiB), the host's ceiling: the host holds each body whole before it sends it, got %d.",
			int64(maxBodyBytesLimit), v)
		return false
	}
	*dst = v
	return true
}

// duration decodes a positive duration string.
func (d *decoder) duration(a *hcl.Attribute, dst *time.Duration) bool {
	return d.parseDuration(a, dst, false)
}

// parseDuration decodes a duration string into dst: positive, or zero too
// when orZero is set (for a setting that "0" turns off).
func (d *decoder) parseDuration(a *hcl.Attribute, dst *time.Duration, orZero bool) bool {
	var s string
	if !decodeAttr(d, a, &s) {
		return false
	}
	v, err := time.ParseDuration(s)
	switch {
	case err != nil && orZero:
		d.errorf(a.Expr.Range(), "Invalid duration",
			"%s must be a duration such as \"30s\" or \"1h\", or \"0\" for none; %s.", a.Name, err)
		return false
	case err != nil:
		d.errorf(a.Expr.Range(), "Invalid duration",
			"%s must be a duration such as \"500ms\", \"5s\" or \"1m\"; %s.", a.Name, err)
		return false
	case v < 0 && orZero:
		d.errorf(a.Expr.Range(), "Invalid duration", "%s must not be negative, got %q.", a.Name, s)
		return false
	case v <= 0 && !orZero:
		d.errorf(a.Expr.Range(), "Invalid duration", "%s must be greater than zero, got %q.", a.Name, s)
		return false
	}
	*dst = v
	return true
}

func (d *decoder) listen(a *hcl.Attribute, dst *string) bool {
	var s string
	if !decodeAttr(d, a, &s) {
		return false
	}
	if err := checkListen(s); err != nil {
		d.errorf(a.Expr.Range(), "Invalid listen address",
			"%s must be host:port, such as \"127.0.0.1:8080\" or \":8080\"; %s.", a.Name, err)
		return false
	}
	*dst = s
	return true
}

// adminHosts decodes admin.hosts: host names, without a port, that the
// admin listener answers besides IP addresses and localhost.
func (d *decoder) adminHosts(a *hcl.Attribute, dst *[]string) bool {
	var hosts []string
	if !decodeAttr(d, a, &hosts) {
		return false
	}
	for _, h := range hosts {
		if !isHostName(h) {
			d.errorf(a.Expr.Range(), "Invalid admin host",
				"hosts must list host names without a port, such as \"admin.example.internal\", got %q.", h)
			return false
		}
	}
	*dst = hosts
	return true
}

// isHostName reports whether s is a DNS name: dot-separated labels of
// letters, digits, hyphens and underscores, at most 253 bytes.
func isHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	return nil
}

// dir decodes a non-empty directory and resolves it against base.
func (d *decoder) dir(a *hcl.Attribute, base string, dst *string) bool {
	var s string
	if !decodeAttr(d, a, &s) {
		return false
	}
	if s == "" {
		d.errorf(a.Expr.Range(), "Invalid directory", "%s must not be empty.", a.Name)
		return false
	}
	*dst = resolve(base, s)
	return true
}

func resolve(base, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(base, p)
}

// emptyBody is an empty body whose missing-item range is rng, so that
// diagnostics about absent required items point somewhere useful.
func emptyBody(rng hcl.Range) hcl.Body {
	return &hclsyntax.Body{
		SrcRange: rng,
		EndRange: hcl.Range{Filename: rng.Filename, Start: rng.End, End: rng.End},
	}
}
