//go:build !linux

package cli

import "github.com/spf13/cobra"

// hostCommands are, off Linux, the host's commands saying that they run
// on Linux only: the CLI here drives a cluster elsewhere.
func hostCommands() []*cobra.Command {
	return []*cobra.Command{
		linuxOnly(&cobra.Command{Use: "server", Short: "Run the aenv server (API, proxy and a local node)"}),
		linuxOnly(&cobra.Command{Use: "state", Short: "Back up and restore the server's live state (etcd)"}),
		linuxOnly(&cobra.Command{Use: "etcd", Short: "Run an etcd member for an external state cluster"}),
		linuxOnly(&cobra.Command{Use: "image-server", Short: "Serve this node's block images", Hidden: true}),
	}
}

// nodeAgent is, off Linux, an `aenv node` that says it runs on Linux only
// (its drain subcommand, a client's, works everywhere).
func nodeAgent(cmd *cobra.Command) { linuxOnly(cmd) }

// templateBuilders are, off Linux, the builds of root filesystems saying
// that they run on Linux only.
func templateBuilders() []*cobra.Command {
	return []*cobra.Command{
		linuxOnly(&cobra.Command{Use: "build-base DIR", Short: "Build the base template's root filesystem into DIR"}),
		linuxOnly(&cobra.Command{Use: "build-code-interpreter DIR", Short: "Build the code-interpreter template's root filesystem into DIR"}),
	}
}
