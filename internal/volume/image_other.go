//go:build !linux

package volume

import "errors"

var errNoImages = errors.New("volumes with a size need Linux (ext4 images, loop-mounted)")

func makeImage(p string, size int64) error { return errNoImages }

func mountImage(image, dir string) error { return errNoImages }

func unmountImage(dir string) error { return errNoImages }

func mounted(p string) bool { return false }
