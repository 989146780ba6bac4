package envd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// reaper is the only place envd waits for children. Go's exec.Cmd.Wait and
// a wait4(-1) loop would steal each other's statuses, so envd never uses
// exec.Cmd: processes are forked under the reaper's lock and registered by
// pid before the lock is released, and the reaper hands each status to the
// process that owns it. As PID 1 (all) it also collects orphans re-parented
// to envd, discarding their statuses so no zombie stays behind.
type reaper struct {
	all bool
	log *slog.Logger

	mu    sync.Mutex
	waits map[int]chan syscall.WaitStatus // pids started and not yet reaped
}

func startReaper(ctx context.Context, all bool, log *slog.Logger) (*reaper, error) {
	r := &reaper{all: all, log: log, waits: map[int]chan syscall.WaitStatus{}}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		defer signal.Stop(sigs)
		// SIGCHLDs coalesce and a full channel drops them, but a signal
		// that comes while reap runs waits in the channel for the next
		// round, so none is lost; the ticker is a safety net only. It is
		// slow because every tick wakes the sandbox: an idle sandbox's
		// wake-ups are its host CPU cost.
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			case <-tick.C:
			}
			r.reap()
		}
	}()
	return r, nil
}

// start runs fork (which must fork and return the child's pid) with the
// lock held, so that the child cannot be reaped before it is registered.
// The returned channel receives the child's wait status once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waits[pid] = ch
	return pid, ch, nil
}

// signal sends sig to pid's process group (or pid alone) if the child has
// not been reaped yet. Holding the lock while signalling guarantees the pid
// still names our child, not a recycled one.
func (r *reaper) signal(pid int, sig syscall.Signal, group bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waits[pid]; !ok {
		return errProcessExited
	}
	if group {
		if err := syscall.Kill(-pid, sig); err == nil {
			return nil
		}
	}
	if err := syscall.Kill(pid, sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return errProcessExited
		}
		return err
	}
	return nil
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws syscall.WaitStatus
	if r.all {
		for {
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.deliver(pid, ws)
		}
	}
	for pid := range r.waits {
		for {
			got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if got == pid {
				r.deliver(pid, ws)
			} else if errors.Is(err, syscall.ECHILD) {
				// Someone else reaped it; report it as killed rather than
				// leave the process hanging forever.
				r.log.Warn("child reaped elsewhere", "pid", pid)
				r.deliver(pid, syscall.WaitStatus(syscall.SIGKILL))
			}
			break
		}
	}
}

func (r *reaper) deliver(pid int, ws syscall.WaitStatus) {
	ch, ok := r.waits[pid]
	if !ok {
		return // an orphan we inherited as PID 1
	}
	delete(r.waits, pid)
	ch <- ws
}
