package envd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cpuWindow is how long the first call (with no earlier sample) measures.
const cpuWindow = 100 * time.Millisecond

func (c *cpuSampler) usedPct(ctx context.Context) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	busy, all, err := readCPUStat()
	if err != nil {
		return 0, err
	}
	if c.sampledAt.IsZero() || time.Since(c.sampledAt) > time.Minute {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(cpuWindow):
		}
		c.busy, c.all = busy, all
		if busy, all, err = readCPUStat(); err != nil {
			return 0, err
		}
	}
	prevBusy, prevAll := c.busy, c.all
	c.busy, c.all, c.sampledAt = busy, all, time.Now()
	if busy < prevBusy || all <= prevAll {
		return 0, nil // no time passed, or the counters were reset
	}
	return float64(busy-prevBusy) / float64(all-prevAll) * 100, nil
}

// readCPUStat returns busy and total jiffies from the "cpu" line.
func readCPUStat() (busy, all uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("reading cpu usage: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("reading cpu usage: unexpected /proc/stat line %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			continue
		}
		all += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, all, nil
}

func (s *Server) collectMetrics(ctx context.Context) (metrics, error) {
	m := metrics{CPUCount: runtime.NumCPU()}
	pct, err := s.cpu.usedPct(ctx)
	if err != nil {
		return m, err
	}
	m.CPUUsedPct = float64(int(pct*100)) / 100
	mem, err := readMeminfo()
	if err != nil {
		return m, err
	}
	m.MemTotal = mem["MemTotal"]
	avail, ok := mem["MemAvailable"]
	if !ok {
		avail = mem["MemFree"] + mem["Buffers"] + mem["Cached"]
	}
	if avail <= m.MemTotal {
		m.MemUsed = m.MemTotal - avail
	}
	m.MemCache = mem["Cached"] + mem["Buffers"]
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return m, fmt.Errorf("reading disk usage: %w", err)
	}
	bs := uint64(st.Bsize)
	m.DiskTotal = st.Blocks * bs
	m.DiskUsed = (st.Blocks - st.Bfree) * bs
	return m, nil
}

// readMeminfo returns /proc/meminfo in bytes.
func readMeminfo() (map[string]uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return nil, fmt.Errorf("reading memory usage: %w", err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			continue
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v <<= 10
		}
		out[k] = v
	}
	return out, sc.Err()
}
