package cli

import "github.com/spf13/cobra"

// hostCommands are the commands that run aenv's own processes on this
// host (the server, the image server, the live state's etcd and its
// backups): Linux only, as what they run is.
func hostCommands() []*cobra.Command {
	return []*cobra.Command{newServerCmd(), newStateCmd(), newEtcdCmd(), newImageServerCmd()}
}
