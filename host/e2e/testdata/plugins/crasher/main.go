// Command crasher is not a plugin: it exits at once, as a wrong path or a
// broken build would. The supervisor must back off and give up on it.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "crasher: exiting at once")
	os.Exit(2)
}
