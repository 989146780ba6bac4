package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// namespacePair holds a slot's two fresh namespaces, with netlink sockets
// opened inside them (a socket stays in the namespace it was made in, so
// they can be used from any thread).
type namespacePair struct {
	router, sandbox     *os.File
	routerNL, sandboxNL *netlink.Handle
	routerNFT           *nftables.Conn
}

func (p namespacePair) close() {
	if p.routerNFT != nil {
		p.routerNFT.CloseLasting()
	}
	for _, h := range []*netlink.Handle{p.routerNL, p.sandboxNL} {
		if h != nil {
			h.Close()
		}
	}
	for _, f := range []*os.File{p.router, p.sandbox} {
		if f != nil {
			f.Close()
		}
	}
}

// newNamespaces creates a router and a sandbox network namespace, enables
// forwarding in the router and opens the sockets to configure them.
// unshare, /proc/sys/net and socket creation all act in the calling thread's
// namespace, so this runs on a thread of its own: should the thread fail to
// return to its original namespace, it stays locked and Go discards it with
// the goroutine instead of letting other goroutines run in the wrong
// network.
func newNamespaces() (namespacePair, error) {
	type result struct {
		p   namespacePair
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		p, err := unshareNamespaces()
		if err == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{p, err}
	}()
	r := <-ch
	return r.p, r.err
}

// unshareNamespaces must run on a locked thread. On error the thread may be
// in a foreign namespace and must not be unlocked.
func unshareNamespaces() (p namespacePair, err error) {
	orig, err := openNS("/proc/thread-self/ns/net")
	if err != nil {
		return p, err
	}
	defer orig.Close()
	defer func() {
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); rerr != nil {
			err = errors.Join(err, fmt.Errorf("returning to the original network namespace: %w", rerr))
		}
		if err != nil {
			p.close()
			p = namespacePair{}
		}
	}()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return p, fmt.Errorf("unsharing router namespace: %w", err)
	}
	if p.router, err = openNS("/proc/thread-self/ns/net"); err != nil {
		return p, err
	}
	// A new namespace may or may not inherit the host's ip_forward
	// (net.core.devconf_inherit_init_net); the router needs it on.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
		return p, fmt.Errorf("enabling forwarding in router namespace: %w", err)
	}
	if p.routerNL, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return p, fmt.Errorf("opening netlink in router namespace: %w", err)
	}
	if p.routerNFT, err = nftables.New(nftables.AsLasting()); err != nil {
		return p, fmt.Errorf("opening nftables in router namespace: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return p, fmt.Errorf("unsharing sandbox namespace: %w", err)
	}
	if p.sandbox, err = openNS("/proc/thread-self/ns/net"); err != nil {
		return p, err
	}
	if p.sandboxNL, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return p, fmt.Errorf("opening netlink in sandbox namespace: %w", err)
	}
	return p, nil
}

// inNS runs fn on a thread switched into the namespace ns; sockets fn
// makes stay in ns. The thread is switched back afterwards (or, failing
// that, discarded), so no thread has to be created per call, as
// nftables.WithNetNSFd does.
func inNS(ns *os.File, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := openNS("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- fmt.Errorf("entering namespace %s: %w", ns.Name(), err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- errors.Join(ferr, fmt.Errorf("returning to the original network namespace: %w", err))
			return // still locked: Go ends the thread with the goroutine
		}
		runtime.UnlockOSThread()
		ch <- ferr
	}()
	return <-ch
}

// nftAt opens a lasting nftables connection inside the namespace at path.
func nftAt(path string) (*nftables.Conn, error) {
	ns, err := openNS(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	var c *nftables.Conn
	err = inNS(ns, func() (err error) {
		c, err = nftables.New(nftables.AsLasting())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening nftables in %s: %w", path, err)
	}
	return c, nil
}

func openNS(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening namespace %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// bindNS persists the namespace ns at path, as `ip netns add` does, so that
// it outlives our handle and other processes can open it by name.
func bindNS(ns *os.File, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating namespace file %s: %w", path, err)
	}
	f.Close()
	src := fmt.Sprintf("/proc/self/fd/%d", ns.Fd())
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("bind-mounting namespace %s: %w", path, err)
	}
	return nil
}

// unbindNS undoes bindNS; a missing or unmounted file is not an error. The
// namespace itself goes away once nothing else refers to it.
func unbindNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmounting namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing namespace file %s: %w", path, err)
	}
	return nil
}

// makeSharedDir makes dir a mount point with shared propagation, as `ip
// netns` does for /run/netns: mount namespaces copied from ours (runsc
// creates some) then see our unmounts, instead of keeping released
// namespaces alive. selfBound reports whether dir had to be bind-mounted
// onto itself for that, so that the caller can undo it.
func makeSharedDir(dir string) (selfBound bool, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating run directory %s: %w", dir, err)
	}
	err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		// Already a mount point: ours, if a manager that crashed left its
		// self-bind (and marker) behind; the caller then removes it.
		_, statErr := os.Stat(filepath.Join(dir, selfBoundMarker))
		return statErr == nil, nil
	}
	if err != unix.EINVAL { // EINVAL: dir is not a mount point yet
		return false, fmt.Errorf("sharing run directory %s: %w", dir, err)
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return false, fmt.Errorf("bind-mounting run directory %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return false, fmt.Errorf("sharing run directory %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, selfBoundMarker), nil, 0o644); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return false, fmt.Errorf("marking run directory %s: %w", dir, err)
	}
	return true, nil
}

// selfBoundMarker tells a later manager that the run directory's mount is
// a self-bind of ours (not an administrator's mount), so that it is
// removed on Close even when the manager that made it crashed.
const selfBoundMarker = ".aenv-self-bound"

// lockDir takes an exclusive, non-blocking flock on dir, so that two
// managers (which would reap each other's slots) cannot share a RunDir.
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating run directory %s: %w", dir, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening run directory %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("locking run directory %s: %w", dir, ErrBusy)
		}
		return nil, fmt.Errorf("locking run directory %s: %w", dir, err)
	}
	return os.NewFile(uintptr(fd), dir), nil
}
