package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

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

// readToken reads the admin token from cfg's token file, without its
// surrounding whitespace; "" when there is no file. It refuses an empty
// token, and one with a line break or another control character inside,
// which no Authorization header could carry, at the token_file
// attribute.
func readToken(cfg *config.Config) (string, hcl.Diagnostics) {
	path := cfg.Admin.TokenFile
	if path == "" {
		return "", nil
	}
	at := cfg.Admin.TokenFileRange
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return "", hcl.Diagnostics{diagErr(at, "Unreadable admin token file", err.Error())}
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", hcl.Diagnostics{diagErr(at, "Empty admin token file",
			fmt.Sprintf("%s holds no token: write one, such as 32 random bytes in base64, on its first line", path))}
	}
	if i := strings.IndexFunc(t, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return "", hcl.Diagnostics{diagErr(at, "Admin token cannot be sent",
			fmt.Sprintf("the token in %s holds a line break or another control character (byte %d), which no Authorization header can carry: keep the token on one line", path, i+1))}
	}
	return t, nil
}
