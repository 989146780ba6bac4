package image

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/google/go-containerregistry/pkg/name"
)

// budget bounds a count of bytes that several goroutines add to (the
// layers downloading at once).
type budget struct {
	max  int64 // <= 0: no bound
	what string
	used atomic.Int64
}

// take counts n more bytes; past the bound it fails, and keeps failing.
func (b *budget) take(n int64) error {
	if b == nil || b.max <= 0 {
		return nil
	}
	// Clamped, so that a declared size near the int64 bound cannot wrap
	// the sum around below the bound.
	if b.used.Add(min(n, b.max+1)) > b.max {
		return fmt.Errorf("%w: its layers are over %s %s (the server's --max-image-size)", ErrTooLarge, humanize.IBytes(uint64(b.max)), b.what)
	}
	return nil
}

// limitedReader fails once what it read is past its budget.
type limitedReader struct {
	r     io.Reader
	limit *budget
}

func (l *limitedReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if n > 0 {
		if lerr := l.limit.take(int64(n)); lerr != nil {
			// None of the read that crossed the bound is handed on
			// (it could be a whole buffer): nothing past it is written.
			return 0, lerr
		}
	}
	return n, err
}

// checkSize refuses, before anything is downloaded, an image whose
// manifest already says its layers are over max.
func checkSize(src *imageSource, max int64) error {
	if max <= 0 {
		return nil
	}
	var total int64
	for _, l := range src.layers {
		if l.size > 0 {
			total += l.size
		}
	}
	if total > max {
		return fmt.Errorf("%w: its layers are %s as stored, over %s (the server's --max-image-size)", ErrTooLarge,
			humanize.IBytes(uint64(total)), humanize.IBytes(uint64(max)))
	}
	return nil
}

// IsLocalRef reports whether ref names files on this host (oci:PATH,
// docker-archive:PATH) rather than a registry's image.
func IsLocalRef(ref string) bool {
	if strings.HasPrefix(ref, transportOCI) || strings.HasPrefix(ref, transportDockerArchive) {
		return true
	}
	for _, t := range unsupportedTransports {
		if strings.HasPrefix(ref, t) {
			return true
		}
	}
	return false
}

// CheckClientRef refuses, with ErrForbidden, what a caller without the
// operator's trust may not pull: files on this host, and registries whose
// host is, or resolves to, a non-public address. PullOptions.PublicOnly
// checks the addresses again at each connection; this check comes first
// so that the caller gets a plain answer before any work starts. A name
// that does not resolve is left to the pull to report.
func CheckClientRef(ctx context.Context, ref string) error {
	if IsLocalRef(ref) {
		return fmt.Errorf("%w: %s names files on the server's host (an admin key may)", ErrForbidden, ref)
	}
	r, err := name.ParseReference(strings.TrimPrefix(ref, transportDocker))
	if err != nil {
		return fmt.Errorf("%w: %q: %v", ErrBadReference, ref, err)
	}
	host := r.Context().RegistryStr()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if addrs, err = net.DefaultResolver.LookupNetIP(lctx, "ip", host); err != nil {
			return nil
		}
	}
	for _, a := range addrs {
		if !publicAddr(a) {
			return fmt.Errorf("%w: registry %s is at %s, a private, loopback or link-local address (an admin key may)", ErrForbidden, host, a)
		}
	}
	return nil
}

// publicAddr reports whether a is an address on the public internet: not
// loopback, private (RFC 1918, IPv6 ULA), link-local (cloud metadata
// among them), shared (100.64/10), unspecified or multicast.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	switch {
	case !a.IsValid(), a.IsLoopback(), a.IsPrivate(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(),
		a.IsInterfaceLocalMulticast(), a.IsMulticast(), a.IsUnspecified():
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// nonPublic are the ranges netip's predicates leave out.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// refuseNonPublic is a net.Dialer's Control for PublicOnly pulls: it sees
// each address after resolution, just before the connection is made.
func refuseNonPublic(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot check address %s", ErrForbidden, address)
	}
	if !publicAddr(ap.Addr()) {
		return fmt.Errorf("%w: %s is a private, loopback or link-local address (an admin key may pull from it)", ErrForbidden, ap.Addr())
	}
	return nil
}
