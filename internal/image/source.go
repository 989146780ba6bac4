package image

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// wantPlatform is the only platform aenv's sandboxes run.
var wantPlatform = v1.Platform{OS: "linux", Architecture: "amd64"}

// imageSource is an image resolved to its configuration and layers, from
// whichever transport.
type imageSource struct {
	digest string
	config *v1.ConfigFile
	layers []*layerSource
	// prefetch says layers come over the network: download several at
	// once, ahead of unpacking.
	prefetch bool
	closers  []io.Closer
}

func (s *imageSource) close() {
	for _, c := range s.closers {
		c.Close()
	}
}

// layerSource is one layer as stored (usually compressed).
type layerSource struct {
	digest string
	size   int64 // -1 if unknown
	open   func(ctx context.Context) (io.ReadCloser, error)
}

// Transport prefixes, named as skopeo names them.
const (
	transportDocker        = "docker://"
	transportOCI           = "oci:"
	transportDockerArchive = "docker-archive:"
)

// unsupportedTransports are skopeo's other transports, named so that their
// references get a clear error rather than a registry lookup.
var unsupportedTransports = []string{"oci-archive:", "docker-daemon:", "dir:", "containers-storage:", "ostree:", "sif:"}

// openSource resolves ref through its transport.
func openSource(ctx context.Context, ref string, opts PullOptions) (*imageSource, error) {
	var src *imageSource
	var err error
	switch {
	case strings.HasPrefix(ref, transportDocker):
		src, err = openRemote(ctx, strings.TrimPrefix(ref, transportDocker), opts)
	case strings.HasPrefix(ref, transportOCI):
		p, tag := splitPathRef(strings.TrimPrefix(ref, transportOCI))
		src, err = openLayout(p, tag)
	case strings.HasPrefix(ref, transportDockerArchive):
		p, tag := splitPathRef(strings.TrimPrefix(ref, transportDockerArchive))
		src, err = openArchive(p, tag)
	default:
		for _, t := range unsupportedTransports {
			if strings.HasPrefix(ref, t) {
				return nil, fmt.Errorf("%w: transport %q is not supported (use docker://, oci: or docker-archive:)", ErrBadReference, strings.TrimSuffix(t, ":"))
			}
		}
		src, err = openRemote(ctx, ref, opts)
	}
	if err != nil {
		return nil, err
	}
	if err := checkPlatform(src.config); err != nil {
		src.close()
		return nil, err
	}
	return src, nil
}

// splitPathRef splits `PATH[:REF]` (REF may have colons of its own, as in
// docker-archive:img.tar:busybox:latest). The shortest prefix that exists
// is the path; failing that, the text before the first colon.
func splitPathRef(s string) (path, ref string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	first := -1
	for i := 0; i < len(s); i++ {
		if s[i] != ':' {
			continue
		}
		if first < 0 {
			first = i
		}
		if _, err := os.Stat(s[:i]); err == nil {
			return s[:i], s[i+1:]
		}
	}
	if first > 0 {
		return s[:first], s[first+1:]
	}
	return s, ""
}

// openRemote resolves a registry reference.
func openRemote(ctx context.Context, ref string, opts PullOptions) (*imageSource, error) {
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	r, err := name.ParseReference(ref, nameOpts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadReference, ref, err)
	}
	tr := remote.DefaultTransport.(*http.Transport).Clone()
	if opts.Insecure {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for with --insecure
	}
	if opts.PublicOnly {
		// The same dialer as the default transport's, checking each
		// address it connects to.
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: refuseNonPublic}
		tr.DialContext = d.DialContext
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain() // no credentials: anonymous
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(kc),
		remote.WithTransport(tr),
		remote.WithPlatform(wantPlatform),
		remote.WithUserAgent("aenv"),
	}
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, classifyRemote(r.Context().RegistryStr(), err)
	}
	var img v1.Image
	digest := desc.Digest
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, classifyRemote(r.Context().RegistryStr(), err)
		}
		img, digest, err = pickPlatform(idx)
		if err != nil {
			return nil, classifyRemote(r.Context().RegistryStr(), err)
		}
	case desc.MediaType.IsImage():
		img, err = desc.Image()
		if err != nil {
			return nil, classifyRemote(r.Context().RegistryStr(), err)
		}
	default:
		return nil, fmt.Errorf("%s is a %s, not an image (docker schema 1 images are not supported)", ref, desc.MediaType)
	}
	src, err := fromImage(img, digest.String(), false)
	if err != nil {
		return nil, classifyRemote(r.Context().RegistryStr(), err)
	}
	src.prefetch = true
	return src, nil
}

// openLayout resolves an OCI layout directory: the manifest tagged tag
// (org.opencontainers.image.ref.name), or the only one when tag is empty.
func openLayout(dir, tag string) (*imageSource, error) {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%w: OCI layout %s: not a directory", ErrNotFound, dir)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	var chosen *v1.Descriptor
	var names []string
	for i, d := range m.Manifests {
		n := d.Annotations["org.opencontainers.image.ref.name"]
		if n != "" {
			names = append(names, n)
		}
		if tag == "" || n == tag || strings.HasSuffix(n, ":"+tag) {
			if chosen != nil && tag == "" {
				return nil, fmt.Errorf("%w: OCI layout %s holds several images (%s); name one as oci:%s:TAG", ErrBadReference, dir, strings.Join(names, ", "), dir)
			}
			if chosen == nil {
				chosen = &m.Manifests[i]
			}
		}
	}
	if chosen == nil {
		if tag == "" {
			return nil, fmt.Errorf("%w: OCI layout %s holds no image", ErrNotFound, dir)
		}
		return nil, fmt.Errorf("%w: OCI layout %s has no image tagged %q (it has: %s)", ErrNotFound, dir, tag, strings.Join(names, ", "))
	}
	var img v1.Image
	digest := chosen.Digest
	switch {
	case chosen.MediaType.IsIndex():
		child, err := idx.ImageIndex(chosen.Digest)
		if err != nil {
			return nil, fmt.Errorf("reading OCI layout %s: %w", dir, err)
		}
		if img, digest, err = pickPlatform(child); err != nil {
			return nil, err
		}
	case chosen.MediaType.IsImage():
		if img, err = idx.Image(chosen.Digest); err != nil {
			return nil, fmt.Errorf("reading OCI layout %s: %w", dir, err)
		}
	default:
		return nil, fmt.Errorf("OCI layout %s: %s is a %s, not an image", dir, chosen.Digest, chosen.MediaType)
	}
	src, err := fromImage(img, digest.String(), true)
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout %s: %w", dir, err)
	}
	return src, nil
}

// fromImage lists img's layers. verify asks for each layer's digest to be
// checked while it is read (remote layers check themselves).
func fromImage(img v1.Image, digest string, verify bool) (*imageSource, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading image config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("listing layers: %w", err)
	}
	src := &imageSource{digest: digest, config: cfg}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("reading layer digest: %w", err)
		}
		size, err := l.Size()
		if err != nil {
			return nil, fmt.Errorf("reading layer %s size: %w", d, err)
		}
		l := l
		src.layers = append(src.layers, &layerSource{
			digest: d.String(),
			size:   size,
			open: func(context.Context) (io.ReadCloser, error) {
				rc, err := l.Compressed()
				if err != nil {
					return nil, err
				}
				if verify && d.Algorithm == "sha256" {
					return &verifyingReader{rc: rc, h: sha256.New(), want: d.Hex, size: size}, nil
				}
				return rc, nil
			},
		})
	}
	return src, nil
}

// pickPlatform chooses the linux/amd64 image of an index.
func pickPlatform(idx v1.ImageIndex) (v1.Image, v1.Hash, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading image index: %w", err)
	}
	var seen []string
	for _, d := range m.Manifests {
		if d.Platform == nil {
			continue
		}
		p := d.Platform
		if p.OS == wantPlatform.OS && p.Architecture == wantPlatform.Architecture {
			switch {
			case d.MediaType.IsImage():
				img, err := idx.Image(d.Digest)
				return img, d.Digest, err
			case d.MediaType.IsIndex():
				child, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return nil, v1.Hash{}, err
				}
				return pickPlatform(child)
			}
		}
		if p.OS != "unknown" {
			seen = append(seen, p.String())
		}
	}
	if len(seen) == 0 {
		return nil, v1.Hash{}, fmt.Errorf("%w: the image index names no platforms", ErrPlatform)
	}
	return nil, v1.Hash{}, fmt.Errorf("%w: the image is built for %s only", ErrPlatform, strings.Join(seen, ", "))
}

// checkPlatform refuses an image whose config says it is for another
// platform: its programs would not run.
func checkPlatform(cfg *v1.ConfigFile) error {
	if (cfg.OS != "" && cfg.OS != wantPlatform.OS) || (cfg.Architecture != "" && cfg.Architecture != wantPlatform.Architecture) {
		return fmt.Errorf("%w: the image is built for %s/%s", ErrPlatform, cfg.OS, cfg.Architecture)
	}
	return nil
}

// verifyingReader checks a blob's sha256 and size when it reaches EOF.
type verifyingReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want string
	size int64
	n    int64
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want || (v.size >= 0 && v.n != v.size) {
			return n, fmt.Errorf("blob sha256:%s is corrupt (read %d bytes with digest sha256:%s)", v.want, v.n, got)
		}
	}
	return n, err
}

func (v *verifyingReader) Close() error { return v.rc.Close() }
