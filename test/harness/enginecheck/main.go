// Command enginecheck is the first step of `make test-containers` (see the
// Makefile): it exits 0 when a Docker engine answers, and otherwise prints
// why not and exits 2, so that the target runs no suite without one.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/tidemark/tidemark/test/harness/dockerengine"
)

func main() {
	host, err := dockerengine.Check(context.Background(), dockerengine.FromEnviron())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("Docker engine at %s\n", host)
}
