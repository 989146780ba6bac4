package gvisor

import "fmt"

// FastPath says whether runsc's systrap platform may use its fast path:
// stub threads that spin on a shared page waiting for the sentry, and
// sentry threads that spin waiting for stubs, instead of sleeping on a
// futex. On a host with cores to spare that cuts each syscall's round trip;
// on a small host the spinning threads take the cores that other sandboxes
// need, so a burst of creates (each a few thousand syscalls of its boot,
// envd and first command) queues behind spinning. Measured on a 2-core
// host: 50 creates at once with a first command and a pool of 1, p50
// 3.4 s with the fast path off against 4.2 s with it on; host CPU per
// create and command 312 ms against 446 ms.
type FastPath string

// The fast path settings.
const (
	// FastPathAuto turns the fast path off on hosts with fewer than
	// FastPathMinCPUs CPUs and leaves runsc's own choice elsewhere.
	FastPathAuto FastPath = "auto"
	// FastPathOn leaves runsc's own choice (it may still turn the fast
	// path off when it sees few CPUs).
	FastPathOn FastPath = "on"
	// FastPathOff always turns it off.
	FastPathOff FastPath = "off"
)

// FastPathMinCPUs is the least CPUs on which FastPathAuto leaves the fast
// path to runsc: with fewer, spinning threads of a handful of sandboxes
// already hold every core.
const FastPathMinCPUs = 5

// ParseFastPath reads a --systrap-fast-path value; empty is FastPathAuto.
func ParseFastPath(s string) (FastPath, error) {
	switch FastPath(s) {
	case "", FastPathAuto:
		return FastPathAuto, nil
	case FastPathOn, FastPathOff:
		return FastPath(s), nil
	}
	return "", fmt.Errorf("systrap fast path %q: want auto, on or off", s)
}

// Disabled says whether the fast path is turned off on a host of cpus
// CPUs.
func (f FastPath) Disabled(cpus int) bool {
	switch f {
	case FastPathOff:
		return true
	case FastPathOn:
		return false
	}
	return cpus < FastPathMinCPUs
}

// Flags are runsc's global flags for the setting on platform with cpus
// CPUs: none but on systrap, whose flag the other platforms refuse.
func (f FastPath) Flags(platform string, cpus int) []string {
	if (platform == "" || platform == "systrap") && f.Disabled(cpus) {
		return []string{"--systrap-disable-fast-path"}
	}
	return nil
}
