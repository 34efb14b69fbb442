//go:build unix

package sdk

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/plughost/plughost/sdk/wire"
)

// takeChildEnv marks the test binary started by TestTakeDataPlane.
const takeChildEnv = "PLUGHOST_TEST_TAKE_CHILD"

func init() { testChild = takeChild }

// takeReport is what takeChild reports of the takeover that package
// initialisation did in its process.
type takeReport struct {
	Conns   int    `json:"conns"`
	Err     string `json:"err"`
	EnvLeft bool   `json:"env_left"`
	// Inherits says, of descriptors 3 and 4, whether a child process
	// would inherit them: open and not close-on-exec. (A number the SDK
	// closed may be reused, close-on-exec, by what it opened since.)
	Inherits map[int]bool `json:"inherits"`
}

// takeChild prints the report when this process is the child
// TestTakeDataPlane started, and reports whether it is.
func takeChild() bool {
	if os.Getenv(takeChildEnv) == "" {
		return false
	}
	r := takeReport{Conns: len(inherited.conns), Inherits: map[int]bool{}}
	if inherited.err != nil {
		r.Err = inherited.err.Error()
	}
	_, r.EnvLeft = os.LookupEnv(wire.DataPlaneEnv)
	for fd := wire.DataPlaneFirstFD; fd < wire.DataPlaneFirstFD+2; fd++ {
		flags, err := fcntl(fd, syscall.F_GETFD)
		r.Inherits[fd] = err == nil && flags&syscall.FD_CLOEXEC == 0
	}
	b, _ := json.Marshal(r)
	fmt.Printf("REPORT %s\n", b)
	return true
}

func fcntl(fd, cmd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// TestTakeDataPlane starts this test binary with descriptors 3 and 4 and
// the host's variable, as the host starts a plugin, and checks what the
// SDK's initialisation did with them.
func TestTakeDataPlane(t *testing.T) {
	socket := func() *os.File {
		c, f, err := wire.SocketPair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return f
	}
	file, err := os.Create(t.TempDir() + "/not-a-socket")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		files []*os.File
		env   string
		want  takeReport
	}{
		{
			name:  "two sockets",
			files: []*os.File{socket(), socket()},
			env:   "2",
			want:  takeReport{Conns: 2, Inherits: map[int]bool{3: false, 4: false}},
		},
		{
			name:  "a file among them",
			files: []*os.File{socket(), file},
			env:   "2",
			want: takeReport{Err: "descriptor 4 of the 2 in " + wire.DataPlaneEnv + " is not a stream socket",
				// The socket is closed; the file is not the SDK's to touch.
				Inherits: map[int]bool{3: false, 4: true}},
		},
		{
			name:  "malformed variable",
			files: []*os.File{socket()},
			env:   "two",
			// With no count, the SDK touches no descriptor.
			want: takeReport{Err: "malformed " + wire.DataPlaneEnv + `="two"`, Inherits: map[int]bool{3: true, 4: false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0])
			cmd.Env = append(os.Environ(), takeChildEnv+"=1", wire.DataPlaneEnv+"="+tt.env)
			cmd.ExtraFiles = tt.files
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			_, line, ok := strings.Cut(string(out), "REPORT ")
			line, _, _ = strings.Cut(line, "\n")
			var got takeReport
			if !ok || json.Unmarshal([]byte(line), &got) != nil {
				t.Fatalf("child printed no report:\n%s", out)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("takeover with %s=%s = %+v, want %+v", wire.DataPlaneEnv, tt.env, got, tt.want)
			}
		})
	}
}
