package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/hashicorp/hcl/v2"

	"github.com/plughost/plughost/host/config"
)

// checkTokenFile refuses an admin token file that other users could read
// or change, as ssh refuses such a private key: the token is the admin
// API's only guard. It also refuses one that does not exist or is not a
// regular file, so that validate catches what run would. It does not read
// the token.
func checkTokenFile(cfg *config.Config) hcl.Diagnostics {
	path := cfg.Admin.TokenFile
	if path == "" {
		return nil
	}
	at := cfg.Admin.TokenFileRange
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return hcl.Diagnostics{diagErr(at, "Unreadable admin token file", err.Error())}
	case !fi.Mode().IsRegular():
		return hcl.Diagnostics{diagErr(at, "Unreadable admin token file", fmt.Sprintf("%s is not a regular file", path))}
	case runtime.GOOS == "windows":
		// Permission bits do not describe who can read a file there.
		return nil
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return hcl.Diagnostics{diagErr(at, "Admin token file open to other users",
			fmt.Sprintf("%s has mode %04o: its group or other users can read or change the admin token. "+
				"Make it readable only by the user the host runs as: chmod 600 %s", path, perm, path))}
	}
	return nil
}
