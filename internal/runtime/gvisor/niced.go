package gvisor

import (
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// backgroundNice is the nice value a prestarted sandbox's runsc commands
// run at: the lowest priority.
const backgroundNice = 19

// niced runs fn on an OS thread of its own at backgroundNice, so that the
// processes fn starts run behind the host's other work: Linux gives a
// forked process the nice value of the thread that forked it, and
// go-runc forks runsc on the calling goroutine's thread (as long as its
// PdeathSignal is unset, which the driver never sets: with it, go-runc
// forks from a thread of its own). A prestarted
// sandbox's boot is the pool's refill, which must not slow the commands
// of sandboxes in use (its sandbox and gofer processes, which runsc
// forks, inherit the value too, but their cgroup holds nothing else:
// within it they are equals, and the cgroup's weight, which Foreground
// raises, decides what they get).
//
// The thread is never unlocked: it ends with the goroutine, and so never
// runs other goroutines at that priority. Were the priority refused, fn
// runs at the caller's. Ending a thread is what Linux sends a parent-death
// signal on (to children forked from that thread, not the process): aenv
// sets none, but a process embedding the driver that does must fork such
// children from a thread it keeps (as testutil.StartTied does).
func niced(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// With PRIO_PROCESS, Linux applies a thread id to that thread
		// alone.
		_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), backgroundNice)
		done <- fn()
	}()
	return <-done
}
