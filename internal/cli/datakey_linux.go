package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/sealed"
)

func newStateRotateDataKeyCmd() *cobra.Command {
	var dataDir, runDir, keyFile string
	var endpoints []string
	cmd := &cobra.Command{
		Use:   "rotate-data-key",
		Short: "Seal the cluster's secrets at rest with a new data key",
		Long: `Make a new data key, put it first in the data key file (the old keys stay
after it, so that what they sealed still opens: snapshots taken before),
and rewrite every sandbox and volume record in etcd, and the cluster CA's
key, sealed with it. Servers
and node agents reading that file pick the new key up when they first meet
a value sealed with it; copy the file to the other hosts of the cluster
(servers and node agents that read it) right away, as they cannot read the
rewritten records until they have it. Remove an old key from the file only
once no snapshot from before the rotation is left.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if os.Getenv(membership.DataKeyEnv) != "" {
				return fmt.Errorf("rotating the data key: the keys come from $%s here; rotate them where they are kept, or use a key file (--data-key-file)", membership.DataKeyEnv)
			}
			if keyFile == "" {
				keyFile = membership.DataKeyPath(dataDir)
			}
			b, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("rotating the data key: %w", err)
			}
			old, err := sealed.ParseKeys(string(b))
			if err != nil {
				return fmt.Errorf("rotating the data key %s: %w", keyFile, err)
			}
			oldRing, err := sealed.NewKeyring(old, nil)
			if err != nil {
				return err
			}
			st, done, err := openServerState(ctx, dataDir, runDir, endpoints)
			if err != nil {
				return fmt.Errorf("rotating the data key: %w", err)
			}
			defer done()
			if err := membership.CheckDataKey(ctx, st, oldRing, false); err != nil {
				return fmt.Errorf("rotating the data key %s: %w", keyFile, err)
			}
			next := sealed.NewKey()
			ring, err := sealed.NewKeyring(append([]sealed.Key{next}, old...), nil)
			if err != nil {
				return err
			}
			// The file first: a process on this host meeting the new key
			// reads it from there, and a failure below leaves both keys
			// in it (running the command again finishes the job).
			if err := writeKeyFile(keyFile, ring.Text()); err != nil {
				return fmt.Errorf("rotating the data key: %w", err)
			}
			n, err := cluster.ResealState(ctx, st, ring)
			if err != nil {
				return fmt.Errorf("rotating the data key (the new key %s is in %s; run the command again): %w", next.ID, keyFile, err)
			}
			out := cmd.OutOrStdout()
			ca := ""
			if n.CA > 0 {
				ca = " and the cluster CA's key"
			}
			fmt.Fprintf(out, "data key rotated: new key %s sealed %d sandbox records, %d volumes%s\n", next.ID, n.Sandboxes, n.Volumes, ca)
			fmt.Fprintf(out, "%s holds it first, then the older keys %s (still needed for snapshots sealed before)\n",
				keyFile, strings.Join(ring.IDs()[1:], ", "))
			fmt.Fprintf(out, "copy %s to the cluster's other servers and node agents that read it\n", keyFile)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory")
	cmd.Flags().StringVar(&runDir, "run-dir", "/run/aenv", "the server's run directory (where its etcd socket is)")
	cmd.Flags().StringVar(&keyFile, "data-key-file", "", "the data key file (default: <data-dir>/secrets/data-key)")
	cmd.Flags().StringSliceVar(&endpoints, "etcd-endpoints", nil, "the cluster's external etcd instead of the server's")
	return cmd
}

// writeKeyFile replaces path with text in one step, readable by its owner
// only.
func writeKeyFile(path, text string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".data-key-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
