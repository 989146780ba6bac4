package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/aenvhq/aenv/internal/runtime"
)

// Defaults of the server's build bounds (--build-memory, --build-cpus,
// --build-disk, --build-timeout, --max-builds).
const (
	DefaultMemoryMB  = 2048
	DefaultCPUCount  = 2
	DefaultDiskBytes = 20 << 30
	DefaultTimeout   = 30 * time.Minute
	DefaultMaxBuilds = 2
)

// Limits bound what one build may take of its host. Zero fields set no
// bound.
type Limits struct {
	// MemoryMB, CPUCount and PidsLimit bound each RUN and COPY step as a
	// sandbox's resources bound it (runtime.StepSpec). A step killed for
	// its memory fails the build with ErrOutOfMemory.
	MemoryMB, CPUCount, PidsLimit int
	// DiskBytes bounds the tree the build writes, FROM included: it is
	// built on a file system of that size of its own, made under DiskDir
	// and removed after the build, and copied into the template store
	// only once complete. Past it writes fail with ENOSPC and the build
	// with ErrDiskFull. 0 builds in the store directly, unbounded.
	DiskBytes int64
	// DiskDir is where build disks are made (the image file and its mount
	// point, one directory per build); it must not be a tmpfs, whose
	// sparse files take memory.
	DiskDir string
	// Timeout bounds a build from the moment it runs (a wait for Slots
	// does not count): past it the step running is killed and the build
	// fails with ErrTimeout.
	Timeout time.Duration
	// MaxImageBytes bounds a FROM image as image.PullOptions.MaxBytes.
	MaxImageBytes int64
}

// Errors that say which bound ended a build; the build's error wraps them
// with the bound ("killed: out of memory (2048 MiB)").
var (
	// ErrOutOfMemory is a step its memory bound killed.
	ErrOutOfMemory = runtime.ErrOutOfMemory
	// ErrDiskFull is a build that filled its build disk.
	ErrDiskFull = errors.New("no space left on the build disk")
	// ErrTimeout is a build that ran past its time limit.
	ErrTimeout = errors.New("timed out")
)

// Slots bounds how many builds run at once on a node: the others wait
// their turn, in the order they came. It is safe for concurrent use; a
// nil *Slots has room for every build.
type Slots struct {
	n   int
	sem *semaphore.Weighted

	mu      sync.Mutex
	waiting int
}

// NewSlots lets n builds run at once (at least one).
func NewSlots(n int) *Slots {
	n = max(n, 1)
	return &Slots{n: n, sem: semaphore.NewWeighted(int64(n))}
}

// Acquire waits for a slot, saying so on log when it must wait, and
// returns the function that frees it. It fails only when ctx ends first.
func (s *Slots) Acquire(ctx context.Context, log io.Writer) (release func(), err error) {
	if s == nil {
		return func() {}, nil
	}
	free := func() { s.sem.Release(1) }
	// TryAcquire fails while others wait, so that none is overtaken.
	if s.sem.TryAcquire(1) {
		return free, nil
	}
	s.mu.Lock()
	ahead := s.n + s.waiting
	s.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
	}()
	fmt.Fprintf(log, "queued: %d builds ahead (this node runs %d at once)\n", ahead, s.n)
	start := time.Now()
	if err := s.sem.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("waiting for a build slot: %w", err)
	}
	fmt.Fprintf(log, "starting after %s in the queue\n", shortDuration(time.Since(start)))
	return free, nil
}

// shortDuration writes d as a person would: 30m, 1h30m, 8s.
func shortDuration(d time.Duration) string {
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// diskString writes a disk's size for people: 20 GiB, 64 MiB.
func diskString(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
