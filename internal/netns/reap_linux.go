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
	return reap(ctx, cfg)
}

// reap does Reap's work; the caller holds the RunDir lock. Only names this
// package makes are touched, so a mistaken RunDir or Tag cannot remove
// anything else.
func reap(ctx context.Context, cfg Config) error {
	var errs []error
	files, links := 0, 0
	entries, err := os.ReadDir(cfg.RunDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("listing %s: %w", cfg.RunDir, err))
	}
	for _, e := range entries {
		if _, ok := cfg.slotIndex(strings.TrimSuffix(e.Name(), ".router")); !ok {
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
	all, err := netlink.LinkList()
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
		if _, ok := cfg.slotIndex(name); !ok || l.Type() != "veth" {
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
	if err := removeHostTable(cfg.Tag); err != nil {
		errs = append(errs, err)
	}
	if files+links > 0 {
		cfg.Logger.InfoContext(ctx, "reaped leftover network slots", "files", files, "interfaces", links)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reaping network slots: %w", err)
	}
	return nil
}
