package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/plughost/plughost/host/catalog"
	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/host/supervisor"
	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
	"github.com/plughost/plughost/sdk"
)

// diagError carries config diagnostics up to where they are printed.
type diagError struct{ diags hcl.Diagnostics }

func (e *diagError) Error() string { return e.diags.Error() }

func diagErr(subject hcl.Range, summary, detail string) *hcl.Diagnostic {
	return &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: subject.Ptr()}
}

// printDiags writes diagnostics with file:line:col and source snippets.
func printDiags(w io.Writer, cfg *config.Config, diags hcl.Diagnostics) {
	files := map[string]*hcl.File{}
	if cfg != nil {
		files = cfg.Files
	}
	if err := config.WriteDiagnostics(w, files, diags); err != nil {
		fmt.Fprintln(w, diags.Error())
	}
}

// checkBinaries verifies that every plugin binary exists, is executable
// and matches its sha256 pin. It returns the plugins that pass; a plugin
// whose Path is "" (its path is broken, see config.Parse) is neither
// checked nor returned.
func checkBinaries(cfg *config.Config) (hcl.Diagnostics, []config.PluginBlock) {
	var diags hcl.Diagnostics
	var usable []config.PluginBlock
	for _, p := range cfg.Plugins {
		if p.Path == "" {
			continue
		}
		if err := catalog.Verify(p.Path, p.SHA256); err != nil {
			if errors.Is(err, catalog.ErrChecksum) {
				diags = append(diags, diagErr(p.SHA256Range, "Plugin checksum mismatch", err.Error()+"; refusing to start it"))
				continue
			}
			diags = append(diags, diagErr(p.PathRange, "Unusable plugin binary", fmt.Sprintf("plugin %q: %v", p.Name, err)))
			continue
		}
		usable = append(usable, p)
	}
	return diags, usable
}

// describeMode says how far describeAll takes each plugin.
type describeMode struct {
	// strict makes a plugin that does not start an error, not a warning.
	strict bool
	// configure also hands each plugin whose block decodes its config,
	// with a data directory of its own that is removed afterwards, so
	// that a refusal by its Configure hook is a diagnostic too
	// (validate's).
	configure bool
}

// describeAll launches each plugin only as far as Describe (or Configure,
// see describeMode), in parallel, and checks its config block against its
// declared schema. The plugins make their go-plugin sockets in socketDir
// (see catalog.Options.SocketDir).
func describeAll(ctx context.Context, logger hclog.Logger, cfg *config.Config, plugins []config.PluginBlock, mode describeMode, socketDir string) hcl.Diagnostics {
	diags := make([]hcl.Diagnostics, len(plugins))
	var wg sync.WaitGroup
	for i, p := range plugins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			diags[i] = describe(ctx, logger, cfg, p, mode, socketDir)
		}()
	}
	wg.Wait()
	var out hcl.Diagnostics
	for _, d := range diags {
		out = append(out, d...)
	}
	return out
}

// describe is describeAll for one plugin.
func describe(ctx context.Context, logger hclog.Logger, cfg *config.Config, p config.PluginBlock, mode describeMode, socketDir string) hcl.Diagnostics {
	var dataDir string
	if mode.configure {
		dir, err := os.MkdirTemp("", "plughost-validate-")
		if err != nil {
			return hcl.Diagnostics{diagErr(p.ConfigRange, "Plugin config not checked", fmt.Sprintf("plugin %q: %v", p.Name, err))}
		}
		// Deferred first, so removed once Kill has waited for the process.
		defer os.RemoveAll(dir)
		dataDir = dir
	}
	inst, err := catalog.Launch(ctx, p.Path, p.SHA256, catalog.Options{
		Logger:       logger.Named(p.Name).With("plugin", p.Name),
		StartTimeout: cfg.Limits.StartTimeout,
		ExtraEnv:     p.Env,
		Dir:          cfg.Dir,
		SocketDir:    socketDir,
		LogLimit:     catalog.LogLimit{Rate: p.LogRate, Burst: p.LogBurst},
		Check:        true,
	})
	if err != nil {
		sev := hcl.DiagWarning
		if mode.strict {
			sev = hcl.DiagError
		}
		return hcl.Diagnostics{{Severity: sev, Summary: "Plugin did not start",
			Detail: fmt.Sprintf("plugin %q: %v", p.Name, err), Subject: p.PathRange.Ptr()}}
	}
	defer inst.Kill()
	js, diags := checkPluginConfig(p, inst.Manifest())
	if diags.HasErrors() || !mode.configure {
		return diags
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.Limits.StartTimeout)
	defer cancel()
	limits := &pluginv1.Limits{MaxBodyBytes: cfg.Limits.MaxBodyBytes, RequestTimeoutMs: cfg.Limits.RequestTimeout.Milliseconds()}
	if p.MaxBodyBytes > 0 {
		limits.MaxBodyBytes = p.MaxBodyBytes
	}
	if err := inst.Configure(cctx, p.Name, js, dataDir, limits); err != nil {
		diags = append(diags, configErrDiag(p, err)...)
	}
	return diags
}

// checkPluginConfig decodes p's config block against the schema m
// declares, returning the JSON Configure takes.
func checkPluginConfig(p config.PluginBlock, m *pluginv1.DescribeResponse) ([]byte, hcl.Diagnostics) {
	if err := config.CheckSchema(m.GetConfigSchema()); err != nil {
		return nil, hcl.Diagnostics{diagErr(p.PathRange, "Plugin declares an unusable config schema",
			fmt.Sprintf("plugin %q (%s %s): %v", p.Name, m.GetName(), m.GetVersion(), err))}
	}
	return config.DecodePluginConfig(p.Config, m.GetConfigSchema())
}

// specFor turns a config block into a supervisor spec.
func specFor(cfg *config.Config, p config.PluginBlock) supervisor.Spec {
	return supervisor.Spec{
		Name:        p.Name,
		Path:        p.Path,
		SHA256:      p.SHA256,
		Mount:       p.Mount,
		MaxInflight: p.MaxInflight,
		MaxStreams:  p.MaxStreams,
		// Part of the fingerprint: a reload that changes it replaces
		// the plugin, which gets it in Configure.
		MaxBodyBytes: p.MaxBodyBytes,
		Required:     p.Required,
		DataDir:      p.DataDir,
		Dir:          cfg.Dir,
		// Part of the fingerprint, so a reload that changes it puts the
		// new spec in place, as for required.
		UnreadyWhenDegraded: p.UnreadyWhenDegraded,
		Env:                 p.Env,
		LogLimit:            catalog.LogLimit{Rate: p.LogRate, Burst: p.LogBurst},
		Decode: func(schema *pluginv1.Schema) ([]byte, error) {
			if err := config.CheckSchema(schema); err != nil {
				return nil, err
			}
			js, diags := config.DecodePluginConfig(p.Config, schema)
			if diags.HasErrors() {
				return nil, &diagError{diags: diags}
			}
			return js, nil
		},
		// The place a Configure refusal names, as a reload's diagnostic
		// shows it (configErrDiag).
		Locate: func(attribute string) string {
			return config.Position(refusalSubject(p, attribute))
		},
		Fingerprint: fingerprint(cfg, p),
	}
}

// fingerprint changes when anything that needs a restart changes: the
// block's settings, its env variables, the config block's source text, or
// the binary itself. It is the hash of the rest, a dash, and the binary's
// sha256 (withBinary).
func fingerprint(cfg *config.Config, p config.PluginBlock) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d\x00%t\x00%s\x00", p.Path, p.SHA256, p.Mount, p.MaxInflight, p.Required, p.DataDir)
	fmt.Fprintf(h, "max_streams\x00%d\x00", p.MaxStreams)
	fmt.Fprintf(h, "max_body_bytes\x00%d\x00", p.MaxBodyBytes)
	fmt.Fprintf(h, "log_rate\x00%d\x00log_burst\x00%d\x00", p.LogRate, p.LogBurst)
	fmt.Fprintf(h, "unready_when_degraded\x00%t\x00", p.UnreadyWhenDegraded)
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		fmt.Fprintf(h, "env\x00%s\x00%s\x00", k, p.Env[k])
	}
	if b, ok := p.Config.(*hclsyntax.Body); ok {
		if f := cfg.Files[b.SrcRange.Filename]; f != nil && b.SrcRange.End.Byte <= len(f.Bytes) {
			h.Write(f.Bytes[b.SrcRange.Start.Byte:b.SrcRange.End.Byte])
		}
	}
	return withBinary(hex.EncodeToString(h.Sum(nil)), p.Path)
}

// withBinary returns fingerprint (or the part of one before the binary's
// sum) with the sum of the binary now at path.
func withBinary(fingerprint, path string) string {
	rest, _, _ := strings.Cut(fingerprint, "-")
	sum, err := catalog.FileSHA256(path)
	if err != nil {
		sum = "unreadable"
	}
	return rest + "-" + sum
}

// configErrDiag turns a plugin's refusal of its config into a diagnostic
// at what its ConfigError names (config.Locate), or at the config block.
func configErrDiag(p config.PluginBlock, err error) hcl.Diagnostics {
	var de *diagError
	if errors.As(err, &de) {
		return de.diags
	}
	var attribute string
	var ce *sdk.ConfigError
	if errors.As(err, &ce) {
		attribute = ce.Attribute
	}
	detail := err.Error()
	if le := (*supervisor.LocatedError)(nil); errors.As(err, &le) {
		detail = le.Err.Error() // the diagnostic shows the place itself
	}
	return hcl.Diagnostics{diagErr(refusalSubject(p, attribute), "Plugin rejected its config", detail)}
}

// refusalSubject returns what a plugin's refusal of its config that names
// attribute (sdk.ConfigError.Attribute) points at in p's block
// (config.Locate), or the config block.
func refusalSubject(p config.PluginBlock, attribute string) hcl.Range {
	if attribute != "" {
		if r, ok := config.Locate(p.Config, attribute); ok {
			return r
		}
	}
	return p.ConfigRange
}
