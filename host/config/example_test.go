package config_test

import (
	"fmt"
	"os"

	"github.com/plughost/plughost/host/config"
	"github.com/plughost/plughost/proto/pluginv1"
)

func ExampleParse() {
	src := []byte(`
plugin "hello" {
  path  = "hello"
  mount = "/hello/"
}
`)
	c, diags := config.Parse(src, "plughost.hcl")
	if diags.HasErrors() {
		if err := config.WriteDiagnostics(os.Stdout, c.Files, diags); err != nil {
			fmt.Println(err)
		}
		return
	}
	fmt.Println(c.Plugins[0].Mount)
	// Output:
	// plughost.hcl:4:11: Error: Invalid mount
	//
	//   on plughost.hcl line 4, in plugin "hello":
	//    4:   mount = "/hello/"
	//
	// Mount "/hello/" must not end with "/".
}

func ExampleDecodePluginConfig() {
	src := []byte(`
plugin "hello" {
  path = "hello"
  config {
    greeting = "hi"
  }
}
`)
	c, diags := config.Parse(src, "plughost.hcl")
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	// In the host, the schema comes from the plugin's Describe response.
	schema := &pluginv1.Schema{Attributes: []*pluginv1.Attribute{
		{Name: "greeting", Type: "string", Required: true},
		{Name: "timeout", Type: "duration", DefaultJson: `"5s"`},
	}}
	if err := config.CheckSchema(schema); err != nil {
		fmt.Println(err)
		return
	}
	js, diags := config.DecodePluginConfig(c.Plugins[0].Config, schema)
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	fmt.Println(string(js))
	// Output:
	// {"greeting":"hi","timeout":"5s"}
}
