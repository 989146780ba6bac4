// Package cli implements the aenv command line: one file per command
// group, each parsing flags and calling one thing. Only cmd/aenv imports it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

// exitError carries a command's exit status up to main (e.g. `aenv exec`
// exits with the remote command's code).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// globals are the flags every client command shares.
type globals struct {
	url string
	key string
}

// Run executes the CLI with args and returns the process exit code.
func Run(ctx context.Context, args []string) (int, error) {
	g := &globals{}
	root := &cobra.Command{
		Use:   "aenv",
		Short: "Isolated agent environments: sandboxes you create in milliseconds",
		Long: `aenv runs isolated sandboxes for AI agents on your own machines.

Start a server with 'aenv server', then create sandboxes and run commands in
them with this CLI or with the unmodified E2B SDKs (set E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY to the server's URL and key).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.url, "url", "", "server URL (env AENV_API_URL or E2B_API_URL; default http://localhost:8000)")
	root.PersistentFlags().StringVar(&g.key, "key", "", "API key (env AENV_API_KEY or E2B_API_KEY; default: read from the local server's data dir)")
	root.AddCommand(
		newServerCmd(),
		newCreateCmd(g),
		newExecCmd(g),
		newListCmd(g),
		newRemoveCmd(g),
		newBenchCmd(),
		newTemplateCmd(),
		newVersionCmd(),
	)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, nil
	}
	if err != nil {
		return 1, err
	}
	return 0, nil
}

// client builds an API client from flags, environment and, failing those,
// the local server's key file.
func (g *globals) client() (*client.Client, error) {
	url := firstNonEmpty(g.url, os.Getenv("AENV_API_URL"), os.Getenv("E2B_API_URL"), "http://localhost:8000")
	key := firstNonEmpty(g.key, os.Getenv("AENV_API_KEY"), os.Getenv("E2B_API_KEY"))
	if key == "" {
		b, err := os.ReadFile(defaultDataDir + "/secrets/api-key")
		if err != nil {
			return nil, errors.New("no API key: pass --key, set AENV_API_KEY, or run on the server host as root")
		}
		key = string(trimSpace(b))
	}
	return client.New(url, key), nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
