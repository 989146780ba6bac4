//go:build !linux

package bench

import (
	"context"
	"errors"
	"fmt"
)

// MeasureBare fails with errors.ErrUnsupported: runsc runs on Linux only.
func MeasureBare(ctx context.Context, opts Options) (BareResults, error) {
	return BareResults{}, fmt.Errorf("measuring bare runsc: %w", errors.ErrUnsupported)
}

// CheckBare fails with errors.ErrUnsupported: runsc runs on Linux only.
func CheckBare(opts Options) error {
	return fmt.Errorf("checking bare runsc: %w", errors.ErrUnsupported)
}
