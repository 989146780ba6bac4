package bench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's counters. It is a kernel ABI
// constant (USER_HZ, 100 on every architecture Linux ships), not the
// kernel's tick rate, so no sysconf call is needed to read it.
const userHZ = 100

// procStat is where the host's CPU time is read.
const procStat = "/proc/stat"

// hostCPUSeconds is the CPU time all of the host's CPUs have spent busy
// (anything but idle and iowait) since boot, read from procStat (a
// /proc/stat). A burst of creates queues on
// CPU, so the CPU one costs is read around a series of them, host-wide:
// the server, its sandboxes, runsc and the kernel's share alike.
func hostCPUSeconds(procStat string) (float64, error) {
	f, err := os.Open(procStat)
	if err != nil {
		return 0, fmt.Errorf("reading host CPU time: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[0] != "cpu" {
			continue
		}
		var busy uint64
		for i, v := range fields[1:] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("reading host CPU time: %s: %w", procStat, err)
			}
			// idle and iowait are the 4th and 5th; guest time is
			// already counted in user, so the 9th and later are not
			// added again.
			if i != 3 && i != 4 && i < 8 {
				busy += n
			}
		}
		return float64(busy) / userHZ, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading host CPU time: %w", err)
	}
	return 0, errors.New("reading host CPU time: no cpu line in " + procStat)
}

// cpuMeter measures host CPU-seconds over a span of work; a host without
// /proc/stat measures nothing (0) rather than failing the benchmark.
type cpuMeter struct {
	start float64
	ok    bool
}

func startCPU() cpuMeter {
	s, err := hostCPUSeconds(procStat)
	return cpuMeter{start: s, ok: err == nil}
}

// per returns the CPU-seconds since the meter started, divided by n.
func (m cpuMeter) per(n int) float64 {
	end, err := hostCPUSeconds(procStat)
	if !m.ok || err != nil || n <= 0 {
		return 0
	}
	return (end - m.start) / float64(n)
}

// sample appends the CPU-seconds since the meter started to samples, or
// leaves them as they are when nothing could be read.
func (m cpuMeter) sample(samples []float64) []float64 {
	if v := m.per(1); m.ok && v >= 0 {
		return append(samples, v)
	}
	return samples
}

// medianOf is the nearest-rank median of samples (the lower middle one
// of an even count), 0 for none; it does not reorder them.
func medianOf[T cmp.Ordered](samples []T) T {
	var zero T
	if len(samples) == 0 {
		return zero
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return sorted[(len(sorted)-1)/2]
}

// idleCPUWindow is the longest span the host's busy CPU is read over
// while sandboxes sit idle: long enough to take in their periodic
// wake-ups (envd's, the sentry's timers, the server's 5 s stats).
const idleCPUWindow = 10 * time.Second

// cpuWindow is the span busyCores reads over: idleCPUWindow, or settle
// when that is shorter (a test's).
func cpuWindow(settle time.Duration) time.Duration { return min(settle, idleCPUWindow) }

// busyCores is how many of the host's CPUs were busy, on average, over
// the next window (0 when /proc/stat cannot be read, or ctx ends first).
func busyCores(ctx context.Context, window time.Duration) float64 {
	m := startCPU()
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(window):
	}
	return m.per(1) / time.Since(start).Seconds()
}

// quietCores is the host's busy CPU, in cores, under which it is quiet
// enough for a bare baseline: an idle server with a full warm pool uses a
// few hundredths of a core, a pool refilling (one boot at a time) most of
// one.
const quietCores = 0.3

// quietWait bounds the wait for a quiet host: a pool of a hundred refills
// in well under it here.
const quietWait = 3 * time.Minute

// awaitQuiet waits, at most within, until busy (busyCores) reads the host
// under quietCores over a second, before what (say, "the bare runs"). A
// bare baseline follows the aenv half of a suite, whose bursts and batches
// leave the server refilling its warm pool; a baseline that shares the
// CPUs with those boots reads slower than bare runsc is (here bare `runsc
// run` at c=1 read 163-177 ms right after the create suite's bursts, 100
// ms with no pool), and a reading of the host's CPU counts those boots. It
// reports on w (when not nil) what it waited for, and returns the last
// reading.
func awaitQuiet(ctx context.Context, w io.Writer, within time.Duration, busy func(context.Context, time.Duration) float64, what string) float64 {
	start := time.Now()
	for {
		cores := busy(ctx, time.Second)
		waited := time.Since(start)
		switch {
		case cores < quietCores:
			if w != nil && waited > 2*time.Second {
				fmt.Fprintf(w, "waited %v for the host to go quiet (the server's warm pool refilling) before %s\n", waited.Round(time.Second), what)
			}
			return cores
		case ctx.Err() != nil:
			return cores
		case waited >= within:
			if w != nil {
				fmt.Fprintf(w, "the host stayed busy (%.2f cores) for %v; %s went ahead beside that\n", cores, waited.Round(time.Second), what)
			}
			return cores
		}
	}
}
