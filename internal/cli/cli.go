// Package cli implements the aenv command line: one file per command
// group, each parsing flags and calling one thing. Only cmd/aenv imports it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

// defaultURL is the server a client talks to when nothing names one.
const defaultURL = "http://localhost:8000"

// exitError carries a command's exit status up to main (e.g. `aenv exec`
// exits with the remote command's code). Whatever there was to say has
// been said by the time it is returned.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake in the command line, as opposed to a failure
// while running it: it names the command and its usage line.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e *usageError) Error() string {
	return fmt.Sprintf("%s: %v (usage: %s; see '%s --help')",
		strings.TrimPrefix(e.cmd.CommandPath(), "aenv "), e.err, e.cmd.UseLine(), e.cmd.CommandPath())
}

func (e *usageError) Unwrap() error { return e.err }

// globals are the flags every client command shares.
type globals struct {
	url string
	// keyFile is --key-file; localKeyFile is read when it is empty.
	keyFile string
	// localKeyFile replaces the local server's key file (tests).
	localKeyFile string
	// caFile is --ca-file: the CA the server's certificate is signed by.
	caFile string
}

// Options are the process's streams, replaceable for tests.
type Options struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Run executes the CLI with args on the process's standard streams and
// returns the process exit code. A non-nil error is meant for the user as
// one line, prefixed with "aenv: ".
func Run(ctx context.Context, args []string) (int, error) {
	return RunWith(ctx, args, Options{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr})
}

// RunWith is Run with the given streams. Commands that need a terminal
// (an interactive shell, hidden key input, progress) find one only when
// the streams are *os.File terminals.
func RunWith(ctx context.Context, args []string, o Options) (int, error) {
	root := newRootCmd()
	root.SetIn(o.Stdin)
	root.SetOut(o.Stdout)
	root.SetErr(o.Stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, nil
	}
	var ce *codeError
	if errors.As(err, &ce) {
		return ce.code, oneLine(err)
	}
	if err != nil {
		if m := cobraUnknown.FindStringSubmatch(err.Error()); m != nil {
			err = unknownCommand(root, m[1])
		}
		if client.IsStatus(err, http.StatusUnauthorized) {
			err = fmt.Errorf("%w; check --key-file, AENV_API_KEY or run 'aenv auth'", err)
		}
		return 1, oneLine(err)
	}
	return 0, nil
}

// cobraUnknown matches cobra's own (multi-line) unknown command error.
var cobraUnknown = regexp.MustCompile(`^unknown command "([^"]*)" for "aenv"`)

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "aenv",
		Short: "Isolated agent environments: sandboxes you create in milliseconds",
		Long: `aenv runs isolated sandboxes for AI agents on your own machines.

Start a server with 'aenv server', then create sandboxes and run commands in
them with this CLI or with the unmodified E2B SDKs (set E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY to the server's URL and key).

The server and key come from, in order: --url/--key-file, AENV_API_URL and
AENV_API_KEY, E2B_API_URL and E2B_API_KEY, the file 'aenv auth' writes
(~/.config/aenv/credentials; its key only goes to its own URL), the local
server's key file (` + localKeyFile + `), and ` + defaultURL + `.`,
		SilenceUsage:       true,
		SilenceErrors:      true,
		DisableSuggestions: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", "", "server URL (env AENV_API_URL or E2B_API_URL; default: from 'aenv auth', else "+defaultURL+")")
	pf.StringVar(&g.keyFile, "key-file", "", "file holding the API key (default: env AENV_API_KEY or E2B_API_KEY, else from 'aenv auth', else the local server's key file)")
	secretFlag(pf, "key")
	pf.StringVar(&g.caFile, "ca-file", "", "CA certificate (PEM) the server's TLS certificate is signed by, such as a cluster's own ('aenv cluster ca'; env AENV_CA_FILE; default: from 'aenv auth', else the system's roots)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error { return refuseSecretFlags(cmd) }
	root.AddCommand(
		newAuthCmd(g),
		newCreateCmd(g),
		newStartCmd(g),
		newConnectCmd(g),
		newExecCmd(g),
		newUploadCmd(g),
		newDownloadCmd(g),
		newListCmd(g),
		newRemoveCmd(g),
		newTimeoutCmd(g),
		newPauseCmd(g),
		newResumeCmd(g),
		newForkCmd(g),
		newSnapshotCmd(g),
		newMetricsCmd(g),
		newLogsCmd(g),
		newVolumeCmd(g),
		newBenchCmd(),
		newTemplateCmd(g),
		newTeamsCmd(g),
		newPullCmd(g),
		newBuildCmd(g),
		newNodesCmd(g),
		newMigrateCmd(g),
		newKeysCmd(g),
		newClusterCmd(g),
		newNodeCmd(g),
		newVersionCmd(),
	)
	root.AddCommand(hostCommands()...)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{cmd: c, err: err} })
	wrapArgs(root)
	return root
}

// wrapArgs makes every command's argument check report a usageError.
func wrapArgs(c *cobra.Command) {
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return &usageError{cmd: cmd, err: err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		wrapArgs(sub)
	}
}

// unknownCommand says, on one line, that cmd has no subcommand name, and
// which ones were probably meant.
func unknownCommand(cmd *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q", name)
	if cmd.HasParent() {
		msg = fmt.Sprintf("%s: unknown command %q", strings.TrimPrefix(cmd.CommandPath(), "aenv "), name)
	}
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %s?", strings.Join(s, " or "))
	}
	return fmt.Errorf("%s (see '%s --help')", msg, cmd.CommandPath())
}

// groupRun is the RunE of a command that only groups others: help without
// arguments, a clear error for an unknown subcommand.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	return unknownCommand(cmd, args[0])
}

// oneLine keeps an error to one line: whatever a server or library put in
// it, the user sees `aenv: <what failed>: <why>`.
func oneLine(err error) error {
	msg := err.Error()
	if !strings.ContainsAny(msg, "\r\n") {
		return err
	}
	var parts []string
	for _, l := range strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return errors.New(strings.Join(parts, "; "))
}

// client builds an API client for the server resolveServer finds.
func (g *globals) client() (*client.Client, error) {
	srv, err := g.resolveServer()
	if err != nil {
		return nil, err
	}
	return srv.client()
}

// target is the server a client command goes to, and with what.
type target struct {
	url, key string
	// ca is the PEM CA its certificate is signed by (nil: the system's
	// roots).
	ca []byte
}

func (s target) client() (*client.Client, error) {
	c, err := client.NewWithCA(s.url, s.key, s.ca)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.url, err)
	}
	return c, nil
}

// resolveServer picks the server URL and key from, in order: flags,
// AENV_API_*, E2B_API_*, the credentials file (whose key and CA only go
// with its own URL), the local server's key file and the default URL.
func (g *globals) resolveServer() (target, error) {
	var srv target
	srv.url = firstNonEmpty(g.url, os.Getenv("AENV_API_URL"), os.Getenv("E2B_API_URL"))
	if g.keyFile != "" {
		key, err := readSecretFile("--key-file", g.keyFile)
		if err != nil {
			return target{}, err
		}
		srv.key = key
	}
	srv.key = firstNonEmpty(srv.key, os.Getenv("AENV_API_KEY"), os.Getenv("E2B_API_KEY"))
	if caFile := firstNonEmpty(g.caFile, os.Getenv("AENV_CA_FILE")); caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return target{}, fmt.Errorf("reading the CA (--ca-file): %w", err)
		}
		srv.ca = b
	}
	creds, err := loadCredentials()
	if err != nil {
		return target{}, err
	}
	if creds != nil {
		if srv.url == "" {
			srv.url = creds.URL
		}
		if sameURL(srv.url, creds.URL) {
			srv.key = firstNonEmpty(srv.key, creds.Key)
			if srv.ca == nil && creds.CA != "" {
				srv.ca = []byte(creds.CA)
			}
		}
	}
	srv.url = firstNonEmpty(srv.url, defaultURL)
	if srv.key == "" {
		b, err := os.ReadFile(firstNonEmpty(g.localKeyFile, localKeyFile))
		if err != nil {
			return target{}, fmt.Errorf("no API key for %s: run 'aenv auth', pass --key-file or set AENV_API_KEY", srv.url)
		}
		srv.key = strings.TrimSpace(string(b))
	}
	return srv, nil
}

// readSecretFile reads the one-line secret in path, which flag named.
func readSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", flag, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("reading %s: %s is empty", flag, path)
	}
	return s, nil
}

// localKeyFile is where a server on this host keeps its key.
const localKeyFile = defaultDataDir + "/secrets/api-key"

// defaultDataDir is a server's data directory unless told otherwise.
const defaultDataDir = "/var/lib/aenv"

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
