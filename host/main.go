// Command plughost is the host daemon: it loads plugins described in an HCL
// config file, supervises them, routes HTTP ingress to them, exposes
// metrics and an admin API, and drains them on shutdown.
//
//	plughost run [-config FILE]        run the host (FILE defaults to config.hcl)
//	plughost validate [-config FILE]   check a config, launching plugins as far as Configure;
//	                                   prints every diagnostic it finds, sorted (logs only with -log-level)
//	plughost plugin info [-json] PATH  print a plugin binary's manifest
//	plughost version                 print versions
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/hashicorp/go-hclog"

	"github.com/plughost/plughost/sdk/wire"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// errReported means the error was already printed (as diagnostics).
var errReported = errors.New("reported")

func main() {
	setGCPercent()
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(os.Stderr, "plughost:", err)
		}
		os.Exit(1)
	}
}

// defaultGCPercent is the host's GOGC unless the environment sets one.
// Every request allocates short-lived state and little of it survives, so
// the heap stays small and Go's default of 100 collects it often under
// load. Doubling the allowed growth halves how often the collector runs,
// for a little more heap under load; make bench shows the host's CPU per
// request and its RSS.
const defaultGCPercent = 200

// setGCPercent applies defaultGCPercent when GOGC is not set, so that an
// operator's GOGC (or GOGC=off) still wins.
func setGCPercent() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(defaultGCPercent)
	}
}

// defaultConfig is the config file run and validate read without -config.
const defaultConfig = "config.hcl"

const usage = `usage:
  plughost run [-config FILE] [-log-level LEVEL] [-log-json]
  plughost validate [-config FILE] [-log-level LEVEL] [-log-json]
  plughost plugin info [-json] PATH
  plughost version

-config defaults to ` + defaultConfig + ` in the working directory.
Run "plughost run -h" for every flag of a command.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errReported
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("plughost "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", defaultConfig, "path of the HCL config file")
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn or error")
	jsonLogs := fs.Bool("log-json", false, "write logs as JSON lines")
	switch cmd {
	case "version", "-version", "--version":
		fmt.Fprintf(stdout, "plughost %s (plugin protocol %d, %s)\n", version, wire.ProtocolVersion, runtime.Version())
		return nil
	case "plugin":
		return pluginCommand(ctx, args, stdout, stderr)
	case "run", "validate":
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s", cmd, usage)
		return errReported
	}
	// Parse prints its own error; the flags follow it on stderr, or on
	// stdout for -h, which is not an error.
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		out := stderr
		if errors.Is(err, flag.ErrHelp) {
			out = stdout
		}
		fmt.Fprintf(out, "usage of plughost %s:\n", cmd)
		fs.SetOutput(out)
		fs.PrintDefaults()
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errReported
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %v\n%s", fs.Args(), usage)
		return errReported
	}
	lvl := hclog.LevelFromString(*level)
	if lvl == hclog.NoLevel {
		fmt.Fprintf(stderr, "unknown -log-level %q\n", *level)
		return errReported
	}
	// validate's output is its diagnostics: the records of launching
	// each plugin as far as Configure and killing it (go-plugin's "plugin
	// process exited", its warning that a plugin refused at the handshake
	// did not exit gracefully, yamux's errors as a killed plugin's
	// connection closes) would bury them, and every failure is a
	// diagnostic already. An explicit -log-level shows them.
	if cmd == "validate" && !flagSet(fs, "log-level") {
		lvl = hclog.Off
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "plughost",
		Level:      lvl,
		Output:     stderr,
		JSONFormat: *jsonLogs,
	})
	if cmd == "validate" {
		return validate(ctx, logger, *cfgPath, stdout, stderr)
	}
	return serve(ctx, logger, *cfgPath, stderr)
}

// flagSet reports whether the command line set the flag called name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
