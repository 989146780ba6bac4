//go:build !linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MeasureBare fails with errors.ErrUnsupported: runsc runs on Linux only.
func MeasureBare(ctx context.Context, opts Options) (BareResults, error) {
	return BareResults{}, fmt.Errorf("measuring bare runsc: %w", errors.ErrUnsupported)
}

// CheckBare fails with errors.ErrUnsupported: runsc runs on Linux only.
func CheckBare(opts Options) error {
	return fmt.Errorf("checking bare runsc: %w", errors.ErrUnsupported)
}

// MeasureSnapshot fails with errors.ErrUnsupported: runsc runs on Linux
// only.
func MeasureSnapshot(ctx context.Context, opts Options) (SnapshotResults, error) {
	return SnapshotResults{}, fmt.Errorf("measuring snapshots: %w", errors.ErrUnsupported)
}

// MeasureBareSnapshot fails with errors.ErrUnsupported: runsc runs on
// Linux only.
func MeasureBareSnapshot(ctx context.Context, opts Options) ([]SizeSamples, error) {
	return nil, fmt.Errorf("measuring bare runsc snapshots: %w", errors.ErrUnsupported)
}

// MeasureBareIdle fails with errors.ErrUnsupported: runsc runs on Linux
// only.
func MeasureBareIdle(ctx context.Context, opts Options, count, conc int, settle time.Duration) (BareIdle, error) {
	return BareIdle{}, fmt.Errorf("measuring bare idle sandboxes: %w", errors.ErrUnsupported)
}

// MeasureBareWall fails with errors.ErrUnsupported: runsc runs on Linux
// only.
func MeasureBareWall(ctx context.Context, opts Options, size, rounds int) ([]time.Duration, error) {
	return nil, fmt.Errorf("measuring bare runsc: %w", errors.ErrUnsupported)
}
