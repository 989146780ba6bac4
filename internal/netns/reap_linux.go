package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Reap removes what a Manager configured like cfg left behind after a crash:
// namespace files under RunDir, host-side uplink interfaces and the host
// nftables table. The namespaces, and the router-side interfaces and rules
// in them, go with their files. NewManager reaps by itself; Reap is for
// cleaning a host without starting one. It returns ErrBusy while a Manager
// uses cfg.RunDir.
func Reap(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	lock, err := lockDir(cfg.RunDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	if _, err := reap(ctx, cfg, false); err != nil {
		return err
	}
	// The run directory's self-bind, if a manager of ours made it.
	if _, err := os.Stat(filepath.Join(cfg.RunDir, selfBoundMarker)); err == nil {
		os.Remove(filepath.Join(cfg.RunDir, selfBoundMarker))
		if err := unix.Unmount(cfg.RunDir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmounting run directory %s: %w", cfg.RunDir, err)
		}
	}
	return nil
}

// reap does Reap's work; the caller holds the RunDir lock. Only names this
// package makes are touched, so a mistaken RunDir or Tag cannot remove
// anything else. With keep, the slots that are still whole (both
// namespace files mounted, host interface present) and the host table are
// left in place and returned.
func reap(ctx context.Context, cfg Config, keep bool) (kept []*Slot, _ error) {
	var errs []error
	files, links := 0, 0
	entries, err := os.ReadDir(cfg.RunDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("listing %s: %w", cfg.RunDir, err))
	}
	keepIf := map[string]bool{}
	if keep {
		kept = intactSlots(cfg, entries)
		for _, s := range kept {
			keepIf[s.hostIf] = true
			keepIf[filepath.Base(s.SandboxNSPath)] = true
			keepIf[filepath.Base(s.RouterNSPath)] = true
		}
	}
	for _, e := range entries {
		if _, ok := cfg.slotIndex(strings.TrimSuffix(e.Name(), ".router")); !ok || keepIf[e.Name()] {
			continue
		}
		if err := unbindNS(filepath.Join(cfg.RunDir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		files++
	}
	// With their routers' files gone, the kernel is already deleting these
	// links as it frees the namespaces; a link vanishing under us is fine.
	all, err := linkList()
	if err != nil {
		errs = append(errs, fmt.Errorf("listing interfaces: %w", err))
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sema = make(chan struct{}, deleteParallelism)
	)
	for _, l := range all {
		name := l.Attrs().Name
		if _, ok := cfg.slotIndex(name); !ok || l.Type() != "veth" || keepIf[name] {
			continue
		}
		wg.Add(1)
		sema <- struct{}{}
		go func() {
			defer func() { <-sema; wg.Done() }()
			err := netlink.LinkDel(l)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("deleting interface %s: %w", name, err))
				return
			}
			links++
		}()
	}
	wg.Wait()
	// Kept slots need the host table without a gap; NewManager replaces
	// it atomically.
	if !keep {
		if err := removeHostTable(cfg.Tag); err != nil {
			errs = append(errs, err)
		}
	}
	if files+links > 0 {
		cfg.Logger.InfoContext(ctx, "reaped leftover network slots", "files", files, "interfaces", links)
	}
	if err := errors.Join(errs...); err != nil {
		return kept, fmt.Errorf("reaping network slots: %w", err)
	}
	return kept, nil
}

// intactSlots returns the slots among a run directory's entries whose
// namespace files are both still mounted and whose host interface exists.
func intactSlots(cfg Config, entries []os.DirEntry) []*Slot {
	var out []*Slot
	for _, e := range entries {
		index, ok := cfg.slotIndex(e.Name())
		if !ok || index >= cfg.slotCount() {
			continue
		}
		s := cfg.newSlot(index)
		if !isNSMount(s.SandboxNSPath) || !isNSMount(s.RouterNSPath) {
			continue
		}
		l, err := netlink.LinkByName(s.hostIf)
		if err != nil {
			continue
		}
		s.hostIndex = l.Attrs().Index
		out = append(out, s)
	}
	return out
}

// isNSMount reports whether path is a mounted network namespace (an nsfs
// file), not a plain file left where a mount was.
func isNSMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}
