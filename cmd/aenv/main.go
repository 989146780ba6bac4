// Command aenv is the aenv CLI and, as `aenv server`, the aenv server.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aenvhq/aenv/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code, err := cli.Run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "aenv:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
