package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenvhq/aenv/internal/client"
)

// authCheckTimeout bounds the request that checks a key.
const authCheckTimeout = 30 * time.Second

func newAuthCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "auth",
		Short: "Store a server URL and API key for the other commands",
		Long: `Check a server URL and API key against the server and store them in
~/.config/aenv/credentials (or $XDG_CONFIG_HOME/aenv/credentials; mode
0600), where every other command finds them.

Without --url or --key, auth asks for them on the terminal (the key is not
echoed). With no terminal, the key is read from the first line of stdin:

  echo "$KEY" | aenv auth --url https://aenv.example.com

The stored key is only ever sent to the stored URL; --url, AENV_API_URL
and E2B_API_URL naming another server do not pick it up.`,
		Example: `  aenv auth
  aenv auth --url http://10.0.0.5:8000 --key e2b_0123abcd`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := cmd.InOrStdin()
			fd, tty := terminalFd(in)
			lines := bufio.NewReader(in)
			errOut := cmd.ErrOrStderr()

			serverURL := g.url
			if serverURL == "" {
				def := firstNonEmpty(os.Getenv("AENV_API_URL"), os.Getenv("E2B_API_URL"))
				if def == "" {
					if creds, err := loadCredentials(); err == nil && creds != nil {
						def = creds.URL
					}
				}
				def = firstNonEmpty(def, defaultURL)
				serverURL = def
				if tty {
					fmt.Fprintf(errOut, "Server URL [%s]: ", def)
					line, err := readLine(lines)
					if err != nil {
						return fmt.Errorf("reading the server URL: %w", err)
					}
					serverURL = firstNonEmpty(line, def)
				}
			}
			serverURL = strings.TrimRight(serverURL, "/")
			if err := checkURL(serverURL); err != nil {
				return err
			}

			key := g.key
			if key == "" {
				if tty {
					fmt.Fprint(errOut, "API key (not shown): ")
					b, err := term.ReadPassword(fd)
					fmt.Fprintln(errOut)
					if err != nil {
						return fmt.Errorf("reading the API key: %w", err)
					}
					key = strings.TrimSpace(string(b))
				} else {
					line, err := readLine(lines)
					if err != nil {
						return fmt.Errorf("reading the API key from stdin: %w", err)
					}
					key = line
				}
			}
			if key == "" {
				return fmt.Errorf("no API key given: pass --key, type it on a terminal, or pipe it on stdin")
			}

			ctx, cancel := context.WithTimeout(cmd.Context(), authCheckTimeout)
			defer cancel()
			if err := client.New(serverURL, key).CheckKey(ctx); err != nil {
				if client.IsStatus(err, http.StatusUnauthorized) {
					return fmt.Errorf("checking the API key: %s rejected it: wrong key for this server", serverURL)
				}
				return err
			}
			path, err := saveCredentials(credentials{URL: serverURL, Key: key})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Saved the key for %s in %s\n", serverURL, path)
			return nil
		},
	}
}

// readLine reads one line, without its line ending; EOF after nothing is
// an empty line.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil && err != io.EOF {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

// checkURL accepts http(s)://host[:port][/path].
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("invalid server URL %q: want http://HOST:PORT or https://HOST", s)
	}
	return nil
}

// terminalFd returns r's file descriptor when r is a terminal.
func terminalFd(r io.Reader) (int, bool) {
	f, ok := r.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return -1, false
	}
	return int(f.Fd()), true
}
