package membership

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
)

// ErrPlainRefused is the error of cluster traffic that would cross a
// network unencrypted without the operator's say-so (--insecure-cluster).
var ErrPlainRefused = errors.New("plain cluster traffic off loopback refused")

// InsecureClusterWarning is what a process started with --insecure-cluster
// logs at every start, so that it never goes unnoticed.
const InsecureClusterWarning = "--insecure-cluster: cluster traffic may cross the network unencrypted (the cluster token, the data key, the state store's records and sandboxes' traffic can be read and replayed by anyone on the path); use it only on a network you trust, and join with 'aenv cluster join-command' instead"

// CheckPlain refuses plain (unencrypted, unauthenticated) cluster traffic
// to or from target unless target is on loopback or insecure is set.
// what names the traffic for the error ("joining", "the node API"); flag
// is the way to encrypt it instead. target is host:port, a URL, or a
// unix socket URL (always local).
func CheckPlain(what, target, instead string, insecure bool) error {
	if insecure || IsLocal(target) {
		return nil
	}
	return fmt.Errorf("%w: %s at %s would be plain HTTP across the network, where anyone on the path can read and replay it: %s, or pass --insecure-cluster on a network you trust", ErrPlainRefused, what, target, instead)
}

// IsLocal reports whether target stays on this host: a unix socket, or a
// loopback address or localhost. A host:port with no host (":8100")
// listens on every address, so it is not.
func IsLocal(target string) bool {
	if u, err := url.Parse(target); err == nil && (u.Scheme == "unix" || u.Scheme == "unixs") {
		return true
	}
	host := HostOf(target)
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}
