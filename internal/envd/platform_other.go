//go:build !linux

package envd

import (
	"context"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
)

// envd runs only inside Linux sandboxes. These stand-ins let the module
// build and vet elsewhere; New fails on them.

type reaper struct{}

func startReaper(context.Context, bool, *slog.Logger) (*reaper, error) {
	return nil, errNotImplemented
}

func (*reaper) signal(int, syscall.Signal, bool) error { return errNotImplemented }

func (*Server) spawn(spawnSpec) (*child, error) { return nil, errNotImplemented }

func resizePty(*os.File, ptySize) error { return errNotImplemented }

func fileOwner(fs.FileInfo) (uid, gid, mode uint32, ok bool) { return 0, 0, 0, false }

func readMetadata(string) map[string]string { return nil }

func writeMetadata(string, map[string]string) error { return errNotImplemented }

func networkMount(string) string { return "" }

func (*Server) collectMetrics(context.Context) (metrics, error) {
	return metrics{}, errNotImplemented
}
