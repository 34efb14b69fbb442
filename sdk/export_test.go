package sdk

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"

	pluginv1 "github.com/plughost/plughost/proto/pluginv1"
)

// ConfigureForExample stands in for the host in this package's examples:
// it hands p the config block configJSON through the SDK's Configure call,
// as the host would after checking the block against p.Config, and returns
// the error the host would show the operator.
func ConfigureForExample(p Plugin, configJSON string) error {
	s := newServer(p, hclog.NewNullLogger(), nil)
	resp, err := s.Configure(context.Background(), &pluginv1.ConfigureRequest{
		ConfigJson: []byte(configJSON),
		Instance:   p.Name,
	})
	switch {
	case err != nil:
		return err
	case resp.GetError() == "":
		return nil
	case resp.GetAttribute() != "":
		return &ConfigError{Attribute: resp.GetAttribute(), Message: resp.GetError()}
	default:
		return errors.New(resp.GetError())
	}
}
