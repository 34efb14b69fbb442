package sdk

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/internal/lograte"
	"github.com/plughost/plughost/sdk/wire"
)

// parentPollInterval is how often a plugin checks that its host is alive.
const parentPollInterval = 250 * time.Millisecond

// Serve runs p as a plugin of the host that started this process. It
// returns an error at once if p is not a valid definition; otherwise it
// serves until the host closes the connection or goes away, and then the
// process exits. Call it from main:
//
//	if err := sdk.Serve(def); err != nil {
//		fmt.Fprintln(os.Stderr, err)
//		os.Exit(1)
//	}
func Serve(p Plugin) error {
	if err := p.validate(); err != nil {
		return err
	}
	logger, limit := newLogger(p.Name)
	defer limit.Close()
	if inherited.err != nil {
		// The host's requests would have no way in.
		return fmt.Errorf("plughost plugin: %w", inherited.err)
	}
	go watchParent(logger, os.Getppid())
	go ignoreTerm(logger)
	plugin.Serve(serveConfig(p, logger, inherited.conns))
	return nil
}

// newLogger returns the plugin's logger, named name, and the limiter of
// its records, nil when the host passed no log rate. The host parses JSON
// records on stderr and re-logs them under the plugin's name, keeping
// their level and fields; it limits them to the plugin's log_rate and
// log_burst, which it passes in the environment, and the limiter drops
// the records over them here, before they are formatted, so that they
// cost the host nothing. Its reports of what it dropped go to stderr
// through a logger of their own, which it does not limit.
func newLogger(name string) (hclog.Logger, *lograte.Limiter) {
	opts := hclog.LoggerOptions{
		Name:       name,
		Level:      hclog.Trace,
		Output:     os.Stderr, // the process's stderr, before go-plugin takes os.Stderr over
		JSONFormat: true,
	}
	report := opts
	rate, _ := strconv.Atoi(os.Getenv(wire.LogRateEnv))
	burst, _ := strconv.Atoi(os.Getenv(wire.LogBurstEnv))
	limit := lograte.New(lograte.Options{Rate: rate, Burst: burst, Report: hclog.New(&report)})
	if limit != nil {
		opts.Exclude = limit.Exclude
	}
	return hclog.New(&opts), limit
}

func init() {
	wire.ServeInProcess = func(def any, logger hclog.Logger, data []*wire.Conn) (*plugin.ServeConfig, error) {
		p, ok := def.(Plugin)
		if !ok {
			return nil, fmt.Errorf("want sdk.Plugin, got %T", def)
		}
		if err := p.validate(); err != nil {
			return nil, err
		}
		return serveConfig(p, logger, data), nil
	}
}

// serveConfig is the go-plugin configuration for p, shared by Serve and
// the in-process test kit; the server it makes serves data, the
// data-plane connections.
func serveConfig(p Plugin, logger hclog.Logger, data []*wire.Conn) *plugin.ServeConfig {
	return &plugin.ServeConfig{
		HandshakeConfig: wire.Handshake,
		VersionedPlugins: wire.PluginSets(func(b *plugin.GRPCBroker) pluginv1.PluginServer {
			s := newServer(p, logger, b)
			s.serveData(data)
			return s
		}),
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts,
				grpc.MaxRecvMsgSize(wire.MaxMessageBytes),
				grpc.MaxSendMsgSize(wire.MaxMessageBytes))...)
		},
		Logger: logger,
	}
}

// ignoreTerm keeps SIGTERM from ending the plugin, as go-plugin does for
// SIGINT. The host owns its plugins' lifecycle: when it stops, it drains
// each one and kills it at the drain deadline, and a plugin whose host is
// gone exits by itself (watchParent). But a SIGTERM is often sent to the
// host's whole process group or cgroup at once: by systemd's default
// KillMode, by timeout(1), by container runtimes. A plugin that died of it
// would cut its in-flight requests before the host's drain could finish
// them.
func ignoreTerm(logger hclog.Logger) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	for range sigs {
		logger.Info("ignoring SIGTERM: the host drains and stops its plugins; this process exits when the host stops it or is gone")
	}
}

// watchParent exits the process once its parent is gone, so that no plugin
// outlives its host even when the host is killed with SIGKILL. The host
// also asks the kernel for a death signal where it can; this covers the
// rest (other platforms, and a host thread that exits before the host).
func watchParent(logger hclog.Logger, ppid int) {
	if ppid <= 1 {
		return
	}
	t := time.NewTicker(parentPollInterval)
	defer t.Stop()
	for range t.C {
		if os.Getppid() != ppid {
			logger.Error("host process is gone; exiting", "host_pid", ppid)
			fmt.Fprintln(os.Stderr, "plughost plugin: host process is gone; exiting")
			os.Exit(3)
		}
	}
}
