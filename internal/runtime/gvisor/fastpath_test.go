package gvisor

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFastPathSettings: auto turns systrap's fast path off below
// FastPathMinCPUs only; on and off are what they say; other platforms get
// no systrap flag; a bad value is refused naming the choices.
func TestFastPathSettings(t *testing.T) {
	const flag = "--systrap-disable-fast-path"
	for _, c := range []struct {
		fp       FastPath
		platform string
		cpus     int
		want     []string
	}{
		{FastPathAuto, "systrap", 2, []string{flag}},
		{FastPathAuto, "", FastPathMinCPUs - 1, []string{flag}},
		{FastPathAuto, "systrap", FastPathMinCPUs, nil},
		{FastPathAuto, "systrap", 64, nil},
		{FastPathOn, "systrap", 2, nil},
		{FastPathOff, "systrap", 64, []string{flag}},
		{FastPathOff, "kvm", 2, nil},
		{FastPathAuto, "ptrace", 2, nil},
	} {
		if got := c.fp.Flags(c.platform, c.cpus); !slices.Equal(got, c.want) {
			t.Errorf("%s on %q with %d CPUs: %v, want %v", c.fp, c.platform, c.cpus, got, c.want)
		}
	}
	for in, want := range map[string]FastPath{"": FastPathAuto, "auto": FastPathAuto, "on": FastPathOn, "off": FastPathOff} {
		if got, err := ParseFastPath(in); err != nil || got != want {
			t.Errorf("ParseFastPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseFastPath("yes"); err == nil || !strings.Contains(err.Error(), "auto, on or off") {
		t.Errorf("ParseFastPath(yes): %v, want an error naming the choices", err)
	}
}

// TestFastPathReachesTheSandbox: the setting is on the command line of the
// sandbox's runsc process (the contract with runsc), off when asked and
// absent when on.
func TestFastPathReachesTheSandbox(t *testing.T) {
	for _, fp := range []FastPath{FastPathOff, FastPathOn} {
		f := setupWith(t, fp)
		ctx := context.Background()
		id := fmt.Sprintf("gvfast%s", fp)
		spec, slot := f.spec(t, id)
		if err := f.driver.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		waitHealth(t, slot.HostAddr)
		pid, err := readPid(filepath.Join(f.driver.sandboxDir(id), "pid"))
		if err != nil {
			t.Fatal(err)
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			t.Fatal(err)
		}
		args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		// runsc hands its whole configuration on to the sandbox process,
		// each flag with its value.
		disabled := slices.ContainsFunc(args, func(a []byte) bool {
			return string(a) == "--systrap-disable-fast-path" || string(a) == "--systrap-disable-fast-path=true"
		})
		if disabled != (fp == FastPathOff) {
			t.Errorf("fast path %s: the sandbox process's arguments %q", fp, args)
		}
		if err := f.driver.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := f.driver.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
