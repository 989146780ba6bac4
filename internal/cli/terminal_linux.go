package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// onResize calls f whenever the terminal's size changes, until stop.
func onResize(f func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				f()
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// hangupContext is ctx, also cancelled when the terminal hangs up, so that
// an interactive session still cleans up after itself.
func hangupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(ctx, syscall.SIGHUP)
}
