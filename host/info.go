package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/ingress"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk/wire"
)

const pluginUsage = `usage:
  plughost plugin info [-json] PATH
`

// pluginCommand dispatches the "plugin" subcommands; args follow "plugin".
func pluginCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, pluginUsage)
		return errReported
	}
	switch args[0] {
	case "info":
		return pluginInfo(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, pluginUsage)
		return nil
	}
	fmt.Fprintf(stderr, "unknown command \"plugin %s\"\n%s", args[0], pluginUsage)
	return errReported
}

// pluginInfo implements "plughost plugin info [-json] PATH": it launches the
// plugin binary at PATH (relative to the working directory, not to any
// plugin_dir) only as far as Describe, kills it, and prints its manifest.
//
// The binary is hashed first and launched with that hash as its pin, so the
// sha256 printed is that of the binary that described itself. A binary that
// is missing, is not a plughost plugin, speaks another plugin protocol or
// declares a config schema the host cannot use is an error, and nothing is
// printed on stdout.
//
// The text output keeps the order in which the plugin declares its routes,
// attributes and blocks; nested blocks are indented under their parent. A
// route's TIMEOUT is "default" when the host's request_timeout applies and
// "none" for a streaming route without one; its BODY is "none" where the
// host takes no body, the route's own limit in bytes where it declares
// one (sdk.MaxBody), and "yes" otherwise.
//
// With -json it prints one JSON object instead, with these keys in this
// order (every key always present; lists are [] when empty):
//
//	{
//	  "name": "hello",                  // the plugin's kind
//	  "version": "0.1.0",               // the plugin's own version
//	  "sdk_version": "0.1.0",           // the plughost SDK it was built with
//	  "protocol": 2,                    // plugin protocol negotiated in the handshake
//	  "sha256": "3f1c…",                // lowercase hex sha256 of the binary, for pinning
//	  "single_instance": false,         // sdk.Plugin.SingleInstance: replaced by draining first
//	  "routes": [{
//	    "method": "GET",                // an HTTP method, or "*" for any
//	    "pattern": "/sleep",            // relative to the mount
//	    "streaming": false,
//	    "no_body": true,                // the host takes no body (BODY none): a GET or HEAD
//	                                    // route, or one declared with sdk.NoBody; it answers one 413
//	    "max_body_bytes": 0,            // the route's own body limit (sdk.MaxBody); 0: its plugin's
//	    "timeout_ms": 600000            // 0: the host's request_timeout, or none if streaming
//	  }],
//	  "config": {                       // the schema of the plugin's config block
//	    "attributes": [{
//	      "name": "greeting",
//	      "type": "string",             // string, number, int, bool, duration, list(T), map(T)
//	      "required": false,
//	      "default": "hello",           // a JSON value; null when there is none
//	      "description": "what GET / answers"
//	    }],
//	    "blocks": [{
//	      "name": "upstream",
//	      "nesting": "single",          // "single" (at most once) or "list"
//	      "required": false,
//	      "description": "",
//	      "config": {"attributes": [], "blocks": []}  // the block's body, same shape
//	    }]
//	  }
//	}
func pluginInfo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plughost plugin info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the manifest as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), pluginUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return errReported
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "want one PATH, got %d arguments\n%s", fs.NArg(), pluginUsage)
		return errReported
	}
	path := fs.Arg(0)

	in, err := inspect(ctx, path)
	if err != nil {
		return fmt.Errorf("plugin info %s: %w", path, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(in)
	}
	return in.writeText(stdout)
}

// inspect hashes the binary at path, launches it pinned to that hash as far
// as Describe, and returns its manifest.
func inspect(ctx context.Context, path string) (info, error) {
	// exec looks a bare name such as "hello" up in $PATH; made absolute,
	// it names the file in the working directory that was checked.
	path, err := filepath.Abs(path)
	if err != nil {
		return info{}, err
	}
	if err := catalog.Verify(path, ""); err != nil {
		return info{}, err
	}
	sum, err := catalog.FileSHA256(path)
	if err != nil {
		return info{}, err
	}
	// The plugin makes its socket in a directory of this run's own,
	// removed when it ends.
	sockets, _, err := catalog.OpenSocketDir("", "")
	if err != nil {
		return info{}, err
	}
	defer sockets.Close()
	inst, err := catalog.Launch(ctx, path, sum, catalog.Options{SocketDir: sockets.Path(), Check: true})
	if err != nil {
		return info{}, err
	}
	m := inst.Manifest()
	inst.Kill()
	if err := config.CheckSchema(m.GetConfigSchema()); err != nil {
		return info{}, fmt.Errorf("plugin %s %s declares a config schema the host cannot use: %w", m.GetName(), m.GetVersion(), err)
	}
	// The handshake offers only wire.ProtocolVersion, so a plugin that
	// completed it speaks that version.
	return newInfo(m, wire.ProtocolVersion, sum), nil
}

// info is a plugin's manifest as plughost plugin info prints it. Its JSON
// encoding is the -json output documented on pluginInfo; change it only by
// adding keys.
type info struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	SDKVersion string `json:"sdk_version"`
	Protocol   int    `json:"protocol"`
	SHA256     string `json:"sha256"`
	// SingleInstance is sdk.Plugin.SingleInstance: the host drains the
	// running process before it starts a replacement.
	SingleInstance bool        `json:"single_instance"`
	Routes         []infoRoute `json:"routes"`
	Config         infoSchema  `json:"config"`
}

type infoRoute struct {
	Method    string `json:"method"`
	Pattern   string `json:"pattern"`
	Streaming bool   `json:"streaming"`
	// NoBody says the host takes no body for the route
	// (ingress.TakesBody): the text view's BODY none.
	NoBody    bool  `json:"no_body"`
	MaxBody   int64 `json:"max_body_bytes"`
	TimeoutMS int64 `json:"timeout_ms"`
}

type infoSchema struct {
	Attributes []infoAttr  `json:"attributes"`
	Blocks     []infoBlock `json:"blocks"`
}

type infoAttr struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Required bool   `json:"required"`
	// Default is nil, encoded as null, when the attribute has none.
	Default     json.RawMessage `json:"default"`
	Description string          `json:"description"`
}

type infoBlock struct {
	Name    string `json:"name"`
	Nesting string `json:"nesting"`
	// Labels are the names of the block's labels, [] for none.
	Labels      []string   `json:"labels"`
	Required    bool       `json:"required"`
	Description string     `json:"description"`
	Config      infoSchema `json:"config"`
}

// newInfo converts a manifest whose schema passed config.CheckSchema, so
// every default_json is valid JSON.
func newInfo(m *pluginv1.DescribeResponse, protocol int, sha string) info {
	in := info{
		Name:           m.GetName(),
		Version:        m.GetVersion(),
		SDKVersion:     m.GetSdkVersion(),
		Protocol:       protocol,
		SHA256:         sha,
		SingleInstance: m.GetSingleInstance(),
		Routes:         []infoRoute{},
		Config:         newInfoSchema(m.GetConfigSchema()),
	}
	for _, r := range m.GetRoutes() {
		method := r.GetMethod()
		if method == "" {
			method = "*"
		}
		in.Routes = append(in.Routes, infoRoute{
			Method:    method,
			Pattern:   r.GetPattern(),
			Streaming: r.GetStreaming(),
			NoBody:    !ingress.TakesBody(method, r.GetNoBody()),
			MaxBody:   r.GetMaxBodyBytes(),
			TimeoutMS: r.GetTimeoutMs(),
		})
	}
	return in
}

func newInfoSchema(s *pluginv1.Schema) infoSchema {
	out := infoSchema{Attributes: []infoAttr{}, Blocks: []infoBlock{}}
	for _, a := range s.GetAttributes() {
		ia := infoAttr{Name: a.GetName(), Type: a.GetType(), Required: a.GetRequired(), Description: a.GetDescription()}
		if d := a.GetDefaultJson(); d != "" {
			var b bytes.Buffer
			if json.Compact(&b, []byte(d)) == nil {
				ia.Default = b.Bytes()
			}
		}
		out.Attributes = append(out.Attributes, ia)
	}
	for _, b := range s.GetBlocks() {
		nesting := "single"
		if b.GetNesting() == pluginv1.Block_NESTING_LIST {
			nesting = "list"
		}
		out.Blocks = append(out.Blocks, infoBlock{
			Name:        b.GetName(),
			Nesting:     nesting,
			Labels:      append([]string{}, b.GetLabels()...),
			Required:    b.GetRequired(),
			Description: b.GetDescription(),
			Config:      newInfoSchema(b.GetBody()),
		})
	}
	return out
}

// writeText prints the manifest for people: a header, then the routes and
// the config schema as aligned tables in declared order.
func (in info) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", printable(in.Name))
	fmt.Fprintf(tw, "version:\t%s\n", printable(in.Version))
	fmt.Fprintf(tw, "sdk version:\t%s\n", orDash(printable(in.SDKVersion)))
	fmt.Fprintf(tw, "plugin protocol:\t%d\n", in.Protocol)
	fmt.Fprintf(tw, "sha256:\t%s\n", in.SHA256)
	fmt.Fprintf(tw, "single instance:\t%s\n", yesNo(in.SingleInstance))
	if err := tw.Flush(); err != nil {
		return err
	}

	if len(in.Routes) == 0 {
		fmt.Fprint(w, "\nroutes: none\n")
	} else {
		fmt.Fprint(w, "\nroutes:\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprint(tw, "  METHOD\tPATTERN\tSTREAMING\tBODY\tTIMEOUT\n")
		for _, r := range in.Routes {
			// Mirrors the ingress: a route timeout wins; otherwise ordinary
			// routes get request_timeout and streaming routes no deadline.
			timeout := "default"
			if r.Streaming {
				timeout = "none"
			}
			if r.TimeoutMS != 0 {
				timeout = (time.Duration(r.TimeoutMS) * time.Millisecond).String()
			}
			body := "yes"
			switch {
			case r.NoBody:
				body = "none"
			case r.MaxBody > 0:
				body = strconv.FormatInt(r.MaxBody, 10)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", printable(r.Method), printable(r.Pattern), yesNo(r.Streaming), body, timeout)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	if len(in.Config.Attributes) == 0 && len(in.Config.Blocks) == 0 {
		_, err := fmt.Fprint(w, "\nconfig: none (the config block must be empty or absent)\n")
		return err
	}
	fmt.Fprint(w, "\nconfig:\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  NAME\tTYPE\tREQUIRED\tDEFAULT\tDESCRIPTION\n")
	writeSchemaRows(tw, in.Config, "  ")
	return tw.Flush()
}

// writeSchemaRows writes one row per attribute, then one per block (its
// nesting and the names of its labels) followed by its body indented two
// more spaces.
func writeSchemaRows(tw io.Writer, s infoSchema, indent string) {
	for _, a := range s.Attributes {
		def := "-"
		if a.Default != nil {
			def = string(a.Default)
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\n", indent, printable(a.Name), printable(a.Type),
			yesNo(a.Required), printable(def), orDash(printable(a.Description)))
	}
	for _, b := range s.Blocks {
		kind := b.Nesting
		switch len(b.Labels) {
		case 0:
		case 1:
			kind += "; label " + printable(b.Labels[0])
		default:
			kind += "; labels " + printable(strings.Join(b.Labels, ", "))
		}
		fmt.Fprintf(tw, "%s%s\tblock (%s)\t%s\t-\t%s\n", indent, printable(b.Name), kind,
			yesNo(b.Required), orDash(printable(b.Description)))
		writeSchemaRows(tw, b.Config, indent+"  ")
	}
}

// printable quotes s when it holds control characters, so that text a
// plugin declares cannot break the table or drive the terminal.
func printable(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// orDash keeps a table's last column non-empty, so rows end without
// trailing blanks.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
