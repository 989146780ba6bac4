package server

import (
	"log/slog"
	"time"

	"github.com/aenvhq/aenv/internal/api"
)

// buildFilesSweepEvery is how often uploads no build used are looked for.
const buildFilesSweepEvery = time.Hour

// sweepBuildFiles sweeps the API's uploaded build files at once (what a
// stopped server left) and then hourly, until the returned stop is
// called, which waits for it.
func sweepBuildFiles(a *api.Handler, log *slog.Logger) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(buildFilesSweepEvery)
		defer t.Stop()
		for {
			if n, err := a.SweepBuildFiles(time.Now()); err != nil {
				log.Warn("sweeping uploaded build files", "err", err)
			} else if n > 0 {
				log.Info("removed uploaded build files no build used", "count", n)
			}
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}
