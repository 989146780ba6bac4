//go:build !linux

package build

import (
	"context"
	"errors"
)

// Build disks are loop-mounted ext4 images.
var errNoDisks = errors.New("build disks need Linux")

type disk struct{ size int64 }

func newDisk(context.Context, string, int64) (*disk, error) { return nil, errNoDisks }

func (d *disk) root() string    { return "" }
func (d *disk) scratch() string { return "" }
func (d *disk) full() bool      { return false }
func (d *disk) remove() error   { return nil }

// RemoveDisks removes the build disks a process that died mid-build left
// in dir (Limits.DiskDir).
func RemoveDisks(string) error { return nil }
