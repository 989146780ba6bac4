//go:build !linux

package cli

import "context"

// onResize does nothing here: the size set at start stays.
func onResize(func()) (stop func()) { return func() {} }

// hangupContext is ctx: no hangup signal is watched on this platform.
func hangupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithCancel(ctx)
}
