//go:build !linux

package template

import (
	"errors"
	"os"
)

var errUnsupported = errors.New("staging templates needs Linux")

func lockDir(dir string) (*os.File, error) { return nil, errUnsupported }

func syncFS(f *os.File) error { return errUnsupported }

func swapDir(src, dst string) (bool, error) { return false, errUnsupported }
