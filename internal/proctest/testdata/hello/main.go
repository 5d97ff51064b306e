// Command hello greets its arguments; proctest's tests build it.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println("hello", strings.Join(os.Args[1:], " "))
}
