// Package catalog finds, verifies and launches plugin binaries. It owns the
// go-plugin client configuration (the handshake, AutoMTLS, the environment
// allowlist, log capture and the start timeout) and makes each process's
// data plane, which it hands over as a dataplane.Transport. It does not
// decide when a plugin runs; that is the supervisor's job.
package catalog

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/plughost/plughost/host/dataplane"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
	"github.com/plughost/plughost/sdk/wire"
)

// DefaultEnv lists the host environment variables a plugin inherits. All
// others are withheld so that secrets in the host's environment do not leak
// into third-party code.
var DefaultEnv = []string{"PATH", "HOME", "TMPDIR", "TZ", "LANG", "LC_ALL", "GODEBUG", "GOMAXPROCS", "GOMEMLIMIT", "GOTRACEBACK"}

// ErrChecksum is returned when a binary does not match its sha256 pin.
var ErrChecksum = errors.New("checksum mismatch")

// Options configure Launch.
type Options struct {
	// Logger receives the plugin's log records, stdout and stderr.
	Logger hclog.Logger
	// StartTimeout bounds the handshake and Describe; default 10s.
	StartTimeout time.Duration
	// Env names the host environment variables passed on; default
	// DefaultEnv.
	Env []string
	// ExtraEnv holds variables set in the plugin's environment on top of
	// those Env passes on, replacing a passed-on variable of the same name:
	// the operator's env block of this plugin. Variables the handshake
	// needs are set after them and win; the config refuses their names.
	ExtraEnv map[string]string
	// Host is served to the plugin over the go-plugin broker; nil serves
	// nothing (for Describe-only launches).
	Host pluginv1.HostServer
	// SocketDir, when not "", is the directory where the plugin makes its
	// go-plugin Unix socket (SocketDir.Path). The broker's connections
	// share that socket, so the host makes none of its own. When "", the
	// plugin's socket is made in its TMPDIR, and one a SIGKILLed host left
	// there is never removed.
	SocketDir string
	// Check marks a launch that only checks the plugin and is killed
	// after (validate, a reload's checks, plugin info, the first step of
	// a single-instance replacement): the end of its process is no news,
	// and go-plugin's "plugin process exited" is logged at debug as
	// "checked plugin process exited". An exit with an error stays an
	// error.
	Check bool
	// LogLimit limits the plugin's relayed log records; its zero value
	// limits none. A limit is also passed to the plugin process in its
	// environment (wire.LogRateEnv, wire.LogBurstEnv).
	LogLimit LogLimit
	// Dir is the plugin process's working directory, the config file's,
	// so that relative paths in its config block resolve as the host's
	// own do; "" leaves the host's.
	Dir string
}

// Instance is one running plugin process. Call Kill when done.
type Instance struct {
	client   *plugin.Client
	rpc      *wire.Client
	pid      int
	manifest *pluginv1.DescribeResponse
	hostID   uint32
	stdio    []*lineLogger
	data     dataplane.Transport
	cmd      *exec.Cmd
	words    *lastWords
	limit    *logLimiter
}

// maxDataPlaneConns caps the data-plane connections per plugin process.
const maxDataPlaneConns = 16

// dataPlaneConns is how many data-plane connections a plugin gets: one per
// CPU the host uses, so that requests on different CPUs seldom wait for
// the same socket.
func dataPlaneConns() int { return min(runtime.GOMAXPROCS(0), maxDataPlaneConns) }

// Verify checks that path is an executable regular file and, when want is
// not empty, that its sha256 is want (lowercase hex).
func Verify(path, want string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("plugin binary %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("plugin binary %s is not executable", path)
	}
	if want == "" {
		return nil
	}
	got, err := FileSHA256(path)
	if err != nil {
		return err
	}
	if got != strings.ToLower(want) {
		return fmt.Errorf("%w: %s has sha256 %s, config pins %s", ErrChecksum, path, got, want)
	}
	return nil
}

// FileSHA256 returns the lowercase hex sha256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash plugin binary: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash plugin binary: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Launch starts the plugin binary at path, completes the go-plugin
// handshake and calls Describe. The checksum, when pinned, is checked by
// go-plugin against the file it executes. On error nothing is left running.
func Launch(ctx context.Context, path, sha string, opts Options) (*Instance, error) {
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 10 * time.Second
	}
	if opts.Env == nil {
		opts.Env = DefaultEnv
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if err := Verify(path, sha); err != nil {
		return nil, err
	}
	// go-plugin's handshake does not watch ctx, and client.Kill waits for
	// the handshake to finish; killing the process is what ends it. Once
	// the plugin is up, ctx no longer governs the process.
	var up atomic.Bool
	startCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	cmd := exec.CommandContext(startCtx, path)
	cmd.Cancel = func() error {
		if up.Load() {
			return os.ErrProcessDone
		}
		return cmd.Process.Kill()
	}
	cmd.Env = pluginEnv(opts.Env, opts.ExtraEnv)
	cmd.Dir = opts.Dir
	cmd.SysProcAttr = sysProcAttr()
	// Every request travels over the data plane, so without one there is
	// no plugin to run.
	data, dataFiles, err := socketPairs(dataPlaneConns())
	if err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	cmd.ExtraFiles = dataFiles
	cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%d", wire.DataPlaneEnv, len(dataFiles)))
	if opts.SocketDir != "" {
		cmd.Env = append(cmd.Env, plugin.EnvUnixSocketDir+"="+opts.SocketDir)
	}
	if opts.LogLimit.Rate > 0 {
		// The SDK drops its logger's records over the same limit before
		// they cross, which spares the host parsing them; the host's own
		// limiter below still holds a plugin that does not.
		cmd.Env = append(cmd.Env,
			fmt.Sprintf("%s=%d", wire.LogRateEnv, opts.LogLimit.Rate),
			fmt.Sprintf("%s=%d", wire.LogBurstEnv, max(opts.LogLimit.Burst, 1)))
	}
	words, tail := &lastWords{}, &stderrTail{}
	limit := newLogLimiter(opts.LogLimit, opts.Logger, time.Now)
	stdout := newLineLogger(opts.Logger, "stdout", limit)
	stderr := newLineLogger(opts.Logger, "stderr", limit)
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSets(nil),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		// The Host service shares the plugin's own connection rather than
		// a socket the host would make in its temporary directory, so
		// every socket of a plugin is in the plugin's SocketDir.
		GRPCBrokerMultiplex: true,
		SkipHostEnv:         true,
		StartTimeout:        opts.StartTimeout,
		Logger:              goPluginLogger{Logger: opts.Logger, words: words, limit: limit, check: opts.Check},
		SyncStdout:          stdout,
		SyncStderr:          stderr,
		Stderr:              tail,
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(wire.MaxMessageBytes))},
	}
	if sha != "" {
		sum, err := hex.DecodeString(sha)
		if err != nil {
			closeAll(data, dataFiles)
			return nil, fmt.Errorf("sha256 pin: %w", err)
		}
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: sum, Hash: sha256.New()}
	}
	client := plugin.NewClient(cfg)
	inst := &Instance{client: client, stdio: []*lineLogger{stdout, stderr}, data: dataplane.New(data), cmd: cmd, words: words, limit: limit}
	ok := false
	defer func() {
		if !ok {
			inst.Kill()
		}
	}()

	proto, err := client.Client()
	// The process has its copies of the plugin's ends, or never will.
	closeAll(nil, dataFiles)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("plugin start cancelled: %w", ctx.Err())
	}
	if err != nil {
		// Once the process is gone, go-plugin has read all its stderr.
		inst.Kill()
		ok = true
		err = handshakeError(err)
		if out := tail.String(); out != "" {
			err = fmt.Errorf("%w; it printed to stderr: %q", err, out)
		}
		return nil, err
	}
	tail.stop()
	raw, err := proto.Dispense(wire.PluginKey)
	if err != nil {
		return nil, fmt.Errorf("dispense plugin: %w", err)
	}
	inst.rpc = raw.(*wire.Client)
	if rc := client.ReattachConfig(); rc != nil {
		inst.pid = rc.Pid
	}

	dctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	// The host decodes labelled blocks (config.DecodePluginConfig).
	m, err := inst.rpc.Describe(dctx, &pluginv1.DescribeRequest{BlockLabels: true})
	if err != nil {
		return nil, inst.exitError("start", fmt.Errorf("describe: %w", err))
	}
	inst.manifest = m

	if opts.Host != nil {
		inst.hostID = inst.rpc.Broker.NextId()
		go inst.rpc.Broker.AcceptAndServe(inst.hostID, func(o []grpc.ServerOption) *grpc.Server {
			s := grpc.NewServer(o...)
			pluginv1.RegisterHostServer(s, opts.Host)
			return s
		})
	}
	up.Store(true)
	ok = true
	return inst, nil
}

// pluginVersion finds the plugin's protocol version in go-plugin's
// handshake error.
var pluginVersion = regexp.MustCompile(`Plugin version: (\d+)`)

// handshakeError makes go-plugin's handshake failures say what an operator
// needs to know.
func handshakeError(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "incompatible API version"):
		// go-plugin reports "Plugin version: N, Client versions: [M]".
		theirs := "another"
		if m := pluginVersion.FindStringSubmatch(msg); m != nil {
			theirs = m[1]
		}
		return fmt.Errorf("plugin protocol mismatch: the plugin speaks plughost plugin protocol %s, this host speaks protocol %d; rebuild the plugin with an SDK of this host's release: %w",
			theirs, wire.ProtocolVersion, err)
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		return fmt.Errorf("%w: %w", ErrChecksum, err)
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		return fmt.Errorf("plugin did not complete the handshake in time (is it a plughost plugin?): %w", err)
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		// go-plugin appends multi-line diagnostics; the first line says
		// what the binary printed instead of a handshake.
		first, _, _ := strings.Cut(msg, "\n")
		if strings.HasSuffix(first, ": ") {
			first += "(nothing)"
		}
		return fmt.Errorf("not a plughost plugin: it exited or printed no go-plugin handshake (build it with sdk.Serve): %s", first)
	case strings.Contains(msg, "plugin exited before we could connect"):
		return fmt.Errorf("plugin exited during the handshake (is it a plughost plugin built with sdk.Serve?): %w", err)
	}
	return fmt.Errorf("plugin handshake: %w", err)
}

// Manifest returns what the plugin declared in Describe.
func (i *Instance) Manifest() *pluginv1.DescribeResponse { return i.manifest }

// RPC returns the plugin's gRPC client.
func (i *Instance) RPC() pluginv1.PluginClient { return i.rpc }

// Pid returns the plugin's process id.
func (i *Instance) Pid() int { return i.pid }

// Exited is closed when the plugin process exits.
func (i *Instance) Exited() <-chan struct{} { return i.rpc.Exited.Done() }

// exitGrace is how long a call that failed is given to see the process
// exit, when its exit is the likelier reason: its connection breaks a
// moment before its exit is seen.
const exitGrace = time.Second

// exitError returns an *ExitError wrapping err when the process has
// exited or exits within exitGrace, and err otherwise.
func (i *Instance) exitError(during string, err error) error {
	t := time.NewTimer(exitGrace)
	defer t.Stop()
	select {
	case <-i.Exited():
	case <-t.C:
		return err
	}
	return &ExitError{During: during, Status: exitStatus(i.cmd), Last: i.words.String(), Err: err}
}

// ExitError returns an *ExitError for a process that has exited (Exited
// is closed), saying how it ended and what it last logged at error level.
func (i *Instance) ExitError(during string) error {
	return &ExitError{During: during, Status: exitStatus(i.cmd), Last: i.words.String(), Err: errors.New("plugin process exited")}
}

// Configure sends the decoded config. A plugin's refusal wraps an
// *sdk.ConfigError: "plugin rejected config: ATTRIBUTE: MESSAGE". A
// plugin that found its stored data corrupt returns an error that wraps
// sdk.ErrStorageCorrupt and reads as the plugin's message. When the
// process exits instead of answering, the error is an *ExitError.
func (i *Instance) Configure(ctx context.Context, instance string, configJSON []byte, dataDir string, limits *pluginv1.Limits) error {
	resp, err := i.rpc.Configure(ctx, &pluginv1.ConfigureRequest{
		ConfigJson:   configJSON,
		DataDir:      dataDir,
		Limits:       limits,
		HostBrokerId: i.hostID,
		Instance:     instance,
	})
	if err != nil {
		return i.exitError("start", fmt.Errorf("configure: %w", err))
	}
	if resp.GetStorageCorrupt() {
		return &corruptError{msg: resp.GetError()}
	}
	if resp.GetError() != "" {
		return fmt.Errorf("plugin rejected config: %w", &sdk.ConfigError{Attribute: resp.GetAttribute(), Message: resp.GetError()})
	}
	return nil
}

// Transport returns the process's data plane, which carries its requests.
// It fails them with dataplane.ErrUnavailable once the process is gone.
func (i *Instance) Transport() dataplane.Transport { return i.data }

// closeAll closes conns and files.
func closeAll(conns []*wire.Conn, files []*os.File) {
	for _, c := range conns {
		_ = c.Close()
	}
	for _, f := range files {
		_ = f.Close()
	}
}

// Kill ends the plugin: it asks go-plugin to close the connection, which
// makes an SDK plugin exit, and force-kills it if it does not within
// go-plugin's grace period. It blocks until the process is gone.
func (i *Instance) Kill() {
	i.data.Close()
	i.client.Kill()
	for _, l := range i.stdio {
		l.Flush()
	}
	i.limit.close()
}

// ForceKill sends SIGKILL to the plugin process at once and then cleans up
// as Kill does, without waiting for a graceful exit: go-plugin's shutdown
// RPC fails as soon as the process is dead. It blocks until the process
// has been reaped. SIGKILL also ends a process stopped with SIGSTOP. The
// supervisor uses it when a drain deadline has passed and for a process
// that failed its health checks.
func (i *Instance) ForceKill() {
	if i.pid > 0 {
		killNow(i.pid)
	}
	i.Kill()
}

// pluginEnv is a plugin's environment before the handshake variables: the
// host variables names allows, then extra, sorted by name, each replacing
// an allowed variable of the same name.
func pluginEnv(names []string, extra map[string]string) []string {
	var env []string
	for _, n := range names {
		if _, set := extra[n]; set {
			continue
		}
		if v, ok := os.LookupEnv(n); ok {
			env = append(env, n+"="+v)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(extra)) {
		env = append(env, n+"="+extra[n])
	}
	return env
}

// lineLogger turns a plugin's stdout or stderr (after go-plugin took over
// the streams) into log records, one per line, as far as its limiter
// allows.
type lineLogger struct {
	logger hclog.Logger
	stream string
	limit  *logLimiter

	mu  sync.Mutex
	buf []byte
}

func newLineLogger(l hclog.Logger, stream string, limit *logLimiter) *lineLogger {
	return &lineLogger{logger: l, stream: stream, limit: limit}
}

// maxLine bounds a buffered partial line; longer lines are split.
const maxLine = 64 << 10

// Write logs each line that p completes. Once one is dropped by the
// limiter, the other whole lines of p are dropped with it, counted but
// not looked at one by one, so that a flood costs the host little more
// than a search for newlines.
func (w *lineLogger) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.buf = append(w.buf, p...)
			if len(w.buf) >= maxLine {
				w.emit(w.buf)
				w.buf = w.buf[:0]
			}
			break
		}
		line := p[:i]
		if len(w.buf) > 0 {
			w.buf = append(w.buf, line...)
			line = w.buf
		}
		p = p[i+1:]
		dropped := !w.emit(line)
		w.buf = w.buf[:0]
		if dropped {
			if last := bytes.LastIndexByte(p, '\n'); last >= 0 {
				w.limit.drop(bytes.Count(p[:last+1], []byte{'\n'}))
				p = p[last+1:]
			}
		}
	}
	return n, nil
}

// Flush logs a trailing partial line.
func (w *lineLogger) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.emit(w.buf)
		w.buf = nil
	}
}

// emit logs line unless the limiter drops it, and reports whether it was
// not dropped. The check comes first, so that a dropped line costs no
// formatting.
func (w *lineLogger) emit(line []byte) bool {
	if !w.logger.IsInfo() {
		return true
	}
	if !w.limit.allow(len(line)) {
		return false
	}
	w.logger.Info("plugin output", "stream", w.stream, "line", string(line))
	return true
}
