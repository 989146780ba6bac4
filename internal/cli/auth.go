package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
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

Without --url or --key-file, auth asks for them on the terminal (the key
is not echoed). With no terminal, the key is read from the first line of
stdin (never from the command line, where every user of the host could
read it):

  echo "$KEY" | aenv auth --url https://aenv.example.com

A server beyond loopback serves HTTPS, by default with a certificate of its
cluster's own CA: give that CA with --ca-file ('aenv cluster ca' on the
server prints it) and it is stored with the URL and checked on every
request.

The stored key and CA only ever go with the stored URL; --url, AENV_API_URL
and E2B_API_URL naming another server do not pick them up.`,
		Example: `  aenv auth
  aenv auth --url https://10.0.0.5:8000 --ca-file aenv-ca.crt --key-file key.txt`,
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

			var key string
			if g.keyFile != "" {
				var err error
				if key, err = readSecretFile("--key-file", g.keyFile); err != nil {
					return err
				}
			} else if tty {
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
			if key == "" {
				return fmt.Errorf("no API key given: pass --key-file, type it on a terminal, or pipe it on stdin")
			}
			var ca []byte
			if g.caFile != "" {
				var err error
				if ca, err = os.ReadFile(g.caFile); err != nil {
					return fmt.Errorf("reading the CA (--ca-file): %w", err)
				}
			}
			c, err := target{url: serverURL, key: key, ca: ca}.client()
			if err != nil {
				return err
			}

			ctx, cancel := context.WithTimeout(cmd.Context(), authCheckTimeout)
			defer cancel()
			if err := c.CheckKey(ctx); err != nil {
				if client.IsStatus(err, http.StatusUnauthorized) {
					return fmt.Errorf("checking the API key: %s rejected it: wrong key for this server", serverURL)
				}
				if errors.As(err, new(*tls.CertificateVerificationError)) && ca == nil {
					return fmt.Errorf("%w (a server of aenv's own CA: give --ca-file, which 'aenv cluster ca' on the server prints)", err)
				}
				return err
			}
			path, err := saveCredentials(credentials{URL: serverURL, Key: key, CA: string(ca)})
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
