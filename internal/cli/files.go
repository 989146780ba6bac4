package cli

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newUploadCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "upload ID LOCAL REMOTE",
		Short: "Copy a local file into a sandbox",
		Long: `Copy the local file LOCAL ('-' for stdin) to REMOTE in sandbox ID,
streaming it. Missing parent directories are created and an existing
file is replaced; a REMOTE ending in '/' is a directory that receives
LOCAL's name. Relative REMOTE paths start at the user's home. Progress is
shown on a terminal for big files.`,
		Example: `  aenv upload abc123 ./data.csv /home/user/data.csv
  tar cz src | aenv upload abc123 - /tmp/src.tgz`,
		Args: needArgs("ID", "LOCAL", "REMOTE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, local, remote := args[0], args[1], args[2]
			var src io.Reader
			size := int64(-1)
			if local == "-" {
				src = cmd.InOrStdin()
			} else {
				f, err := os.Open(local)
				if err != nil {
					return fmt.Errorf("uploading %s: %w", local, unwrapPath(err))
				}
				defer f.Close()
				fi, err := f.Stat()
				if err != nil {
					return fmt.Errorf("uploading %s: %w", local, unwrapPath(err))
				}
				if fi.IsDir() {
					return fmt.Errorf("uploading %s: it is a directory (upload an archive: tar cz DIR | aenv upload ID - REMOTE)", local)
				}
				if fi.Mode().IsRegular() {
					size = fi.Size()
				}
				src = f
				if strings.HasSuffix(remote, "/") {
					remote += filepath.Base(local)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			prog := startProgress(progressWriter(cmd, size), "Uploading", size)
			err = c.Upload(cmd.Context(), id, remote, &progressReader{r: src, p: prog},
				client.FileOptions{User: user, AccessToken: sb.EnvdAccessToken, Size: max(size, 0)})
			prog.finish(err == nil)
			return err
		},
	}
	cmd.Flags().StringVar(&user, "user", "user", "owner of the file, and whose home relative paths start in")
	return cmd
}

func newDownloadCmd(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "download ID REMOTE LOCAL",
		Short: "Copy a file out of a sandbox",
		Long: `Copy the file REMOTE in sandbox ID to LOCAL ('-' for stdout), streaming
it. An existing LOCAL directory receives REMOTE's name; an existing file
is replaced only once the whole file has arrived. Relative REMOTE paths
start at the user's home. Progress is shown on a terminal for big files.`,
		Example: `  aenv download abc123 /home/user/out.json ./out.json
  aenv download abc123 /var/log/app.log - | tail`,
		Args: needArgs("ID", "REMOTE", "LOCAL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, remote, local := args[0], args[1], args[2]
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			body, size, err := c.Download(cmd.Context(), id, remote, client.FileOptions{User: user, AccessToken: sb.EnvdAccessToken})
			if err != nil {
				return err
			}
			defer body.Close()
			prog := startProgress(progressWriter(cmd, size), "Downloading", size)
			src := &progressReader{r: body, p: prog}
			if local == "-" {
				_, err = io.Copy(cmd.OutOrStdout(), src)
				prog.finish(err == nil)
				if err != nil {
					return fmt.Errorf("downloading %s from %s: %w", remote, id, err)
				}
				return nil
			}
			if fi, err := os.Stat(local); err == nil && fi.IsDir() {
				local = filepath.Join(local, path.Base(remote))
			}
			err = writeFileAtomic(local, src)
			prog.finish(err == nil)
			if err != nil {
				return fmt.Errorf("downloading %s from %s: %w", remote, id, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&user, "user", "user", "read the file as this user, whose home relative paths start in")
	return cmd
}

// writeFileAtomic writes src to a temporary file beside target and renames
// it into place, so that target is never half written.
func writeFileAtomic(target string, src io.Reader) error {
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".aenv-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", target, unwrapPath(err))
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", target, err)
	}
	if err := os.Rename(f.Name(), target); err != nil {
		return fmt.Errorf("writing %s: %w", target, unwrapPath(err))
	}
	return nil
}

// progressWriter is where a transfer of size bytes reports progress:
// stderr when it is a terminal and the transfer is big or of unknown size.
func progressWriter(cmd *cobra.Command, size int64) io.Writer {
	w := cmd.ErrOrStderr()
	if !isTerminal(w) || (size >= 0 && size < progressThreshold) {
		return nil
	}
	return w
}

// unwrapPath drops the operation and path of a *PathError, which the
// message around it already names.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		return le.Err
	}
	return err
}
