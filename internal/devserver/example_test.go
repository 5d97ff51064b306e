package devserver_test

import (
	"fmt"
	"os"
	"os/exec"

	"github.com/idemgate/idemgate/internal/devserver"
)

// A child started with StartChild is killed by the kernel if this process
// dies first; otherwise it is an ordinary child to wait for.
func ExampleStartChild() {
	cmd := exec.Command("echo", "hello from a child")
	cmd.Stdout = os.Stdout
	if err := devserver.StartChild(cmd); err != nil {
		fmt.Println(err)
		return
	}
	if err := cmd.Wait(); err != nil {
		fmt.Println(err)
	}
	// Output: hello from a child
}
