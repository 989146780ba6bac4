package gvisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/runtime"
)

// rootImageMarker, in a checkpoint's directory, says that the sandbox ran
// without a gofer: its restore must too, since runsc refuses a restore
// whose mounts differ from the checkpoint's. It holds the identity of the
// root's image (imageIdentity), which the restore's must match.
const rootImageMarker = "aenv-root-image"

// errOtherRootMode is a restore into a prepared sandbox that runs its root
// the other way (with or without a gofer) than the snapshot's sandbox did,
// or from another image.
var errOtherRootMode = errors.New("the prepared sandbox mounts its root otherwise than the snapshot's")

// goferlessEdit is the edit of aenv's runsc build (scripts/runsc-patch.sh)
// that a sandbox without a gofer needs: without it runsc gives the root's
// overlay no file on disk, and the sandbox's writes stay in its memory,
// beyond --disk and charged to the host's memory.
const goferlessEdit = "goferless-filestore"

// editsTimeout bounds `runsc aenv-edits`, a process start.
const editsTimeout = 30 * time.Second

// requireEdit checks that the runsc at path is aenv's build with edit.
func requireEdit(path, edit string) error {
	edits, err := runscEdits(path)
	return hasEdit(path, edits, err, edit)
}

// runscEdits lists the edits of the runsc at path: `runsc aenv-edits`
// (scripts/runsc-main) prints them, and a stock runsc refuses the
// command.
func runscEdits(path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), editsTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "aenv-edits").Output()
	if err != nil {
		return nil, fmt.Errorf("%s is not aenv's runsc build (scripts/install-deps.sh builds it): runsc aenv-edits: %w", path, err)
	}
	return strings.Fields(string(out)), nil
}

// hasEdit checks that edits, what runscEdits returned for the runsc at
// path with err, include edit.
func hasEdit(path string, edits []string, err error, edit string) error {
	if err != nil {
		return err
	}
	if !slices.Contains(edits, edit) {
		return fmt.Errorf("%s lacks aenv's edit %q (it has %q): rebuild it with scripts/install-deps.sh", path, edit, edits)
	}
	return nil
}

// withoutGoferOK reports whether spec's sandbox can run without a gofer:
// the root is an image file on this host, and everything bound in is a
// read-only node binary under /.aenv (those go into the /.aenv image).
// Volumes need the gofer.
func withoutGoferOK(spec runtime.Spec) bool {
	if spec.Root.Image == "" || spec.EnvdPath == "" {
		return false
	}
	if fi, err := os.Stat(spec.Root.Image); err != nil || !fi.Mode().IsRegular() {
		return false
	}
	for _, b := range spec.Binds {
		if b.Writable || path.Dir(b.Destination) != path.Dir(EnvdGuestPath) {
			return false
		}
	}
	return true
}

// rootMode returns the /.aenv image spec's sandbox runs with, or "" when
// it runs with a gofer. A restore runs the way its checkpoint's sandbox
// ran (imageDir's marker), whatever Config.RootImages says now (a
// template's snapshot of its started service outlives a change of it);
// a new sandbox without a gofer when it can and the driver is told to.
func (d *Driver) rootMode(ctx context.Context, spec runtime.Spec, mode startMode, imageDir string) (string, error) {
	if mode == startRestore {
		if _, marked := markedImage(imageDir); !marked {
			return "", nil
		}
		if !withoutGoferOK(spec) {
			return "", fmt.Errorf("its snapshot ran its root from an image, and this host has no image of its template's files (or the sandbox has volumes)")
		}
		if err := sameRootImage(imageDir, spec.Root.Image); err != nil {
			return "", err
		}
		img, err := d.toolsImage(ctx, spec)
		if err != nil {
			return "", err
		}
		id, err := blockimage.Identity(img)
		if err != nil {
			return "", err
		}
		if err := sameToolsImage(imageDir, id); errors.Is(err, errOtherTools) {
			return d.adoptSavedTools(imageDir, spec.ID)
		} else if err != nil {
			return "", err
		}
		return img, nil
	}
	if !d.rootImages || !withoutGoferOK(spec) {
		return "", nil
	}
	img, err := d.toolsImage(ctx, spec)
	if err != nil {
		d.log.Warn("running the sandbox with a gofer: making the /.aenv image failed", "sandbox_id", spec.ID, "err", err)
		return "", nil
	}
	return img, nil
}

// toolsImage returns an EROFS image holding envd and the node binaries
// spec binds under /.aenv, made once per set of binaries (named by their
// paths, sizes and times) under the driver's state directory.
func (d *Driver) toolsImage(ctx context.Context, spec runtime.Spec) (string, error) {
	files := map[string]string{path.Base(EnvdGuestPath): spec.EnvdPath}
	for _, b := range spec.Binds {
		files[path.Base(b.Destination)] = b.Source
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fi, err := os.Stat(files[n])
		if err != nil {
			return "", fmt.Errorf("making the /.aenv image: %w", err)
		}
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00", n, files[n], fi.Size(), fi.ModTime().UnixNano())
	}
	out := filepath.Join(d.imagesDir(), "aenv-"+hex.EncodeToString(h.Sum(nil))[:16]+".erofs")
	d.imageMu.Lock()
	defer d.imageMu.Unlock()
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	tree := out + ".d"
	defer os.RemoveAll(tree)
	if err := os.RemoveAll(tree); err != nil {
		return "", fmt.Errorf("making the /.aenv image: %w", err)
	}
	if err := os.MkdirAll(tree, 0o755); err != nil {
		return "", fmt.Errorf("making the /.aenv image: %w", err)
	}
	for _, n := range names {
		if err := linkOrCopy(files[n], filepath.Join(tree, n)); err != nil {
			return "", fmt.Errorf("making the /.aenv image: %w", err)
		}
	}
	// A restore checks the image's superblock against the checkpoint's:
	// fixed times, owner and UUID make the image of the same binaries the
	// same on every host.
	if err := blockimage.Build(ctx, tree, out, "-T0", "--all-root", "-U"+toolsImageUUID); err != nil {
		return "", fmt.Errorf("making the /.aenv image: %w", err)
	}
	d.log.Info("made the /.aenv image of sandboxes without a gofer", "image", out, "files", strings.Join(names, ","))
	return out, nil
}

// pruneToolsImages removes what the images directory holds that no
// sandbox of the state directory names as a mount source: /.aenv images
// of binaries replaced since (each set of binaries has its own, so every
// upgrade or rebuild of envd left one more behind, 10-20 MB each) and the
// trees of makings cut short. A checkpoint keeps its own link to its
// image, and a restore adopts it again (adoptSavedTools), so only
// sandboxes that run (kept over a restart, their specs in their
// directories) need one here. It runs in New, before anything makes an
// image; a spec it cannot read keeps them all. The images directory of
// builds before Config.ImagesDir, in the state directory, goes the same
// way.
func (d *Driver) pruneToolsImages() {
	used, ok := d.mountedImages()
	if !ok {
		return
	}
	dirs := []string{d.imagesDir()}
	if legacy := filepath.Join(d.cfg.StateDir, "images"); legacy != dirs[0] {
		dirs = append(dirs, legacy)
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // none made yet
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			if used[p] {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				d.log.Warn("removing an unused /.aenv image", "image", p, "err", err)
				continue
			}
			d.log.Info("removed a /.aenv image no sandbox uses", "image", p)
		}
	}
}

// mountedImages is the set of the mount sources of the sandboxes in the
// state directory, and false when a spec cannot be read.
func (d *Driver) mountedImages() (map[string]bool, bool) {
	used := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(d.cfg.StateDir, "sandboxes", "*", "config.json"))
	if err != nil {
		return nil, false
	}
	for _, f := range files {
		var s specs.Spec
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue // its sandbox was removed meanwhile
		}
		if err != nil {
			d.log.Warn("keeping every /.aenv image: a sandbox's spec is unreadable", "spec", f, "err", err)
			return nil, false
		}
		for _, m := range s.Mounts {
			used[m.Source] = true
		}
	}
	return used, true
}

// adoptSavedTools returns the /.aenv image that the checkpoint in
// imageDir keeps (savedToolsImage), made one of the driver's images: the
// restore of sandbox id runs under the build of envd that saved it, whose
// memory the checkpoint holds, rather than this host's. A checkpoint from
// before checkpoints kept their image fails with errOtherTools.
func (d *Driver) adoptSavedTools(imageDir, id string) (string, error) {
	want, _ := readIdentity(filepath.Join(imageDir, toolsImageMarker))
	saved := filepath.Join(imageDir, savedToolsImage)
	switch got, err := blockimage.Identity(saved); {
	case errors.Is(err, fs.ErrNotExist):
		return "", errOtherTools
	case err != nil:
		return "", fmt.Errorf("reading the /.aenv image its snapshot keeps: %w", err)
	case got != want:
		return "", errors.New("the /.aenv image its snapshot keeps is not the one it was saved with")
	}
	d.log.Info("restoring under the envd build its snapshot was saved with, not this host's", "sandbox_id", id)
	out := filepath.Join(d.imagesDir(), "saved-"+want[:16]+".erofs")
	d.imageMu.Lock()
	defer d.imageMu.Unlock()
	if got, err := blockimage.Identity(out); err == nil && got == want {
		return out, nil
	}
	if err := os.MkdirAll(d.imagesDir(), 0o755); err != nil {
		return "", fmt.Errorf("adopting the /.aenv image of the snapshot: %w", err)
	}
	tmp := out + ".tmp"
	os.Remove(tmp)
	if err := linkOrCopy(saved, tmp); err != nil {
		return "", fmt.Errorf("adopting the /.aenv image of the snapshot: %w", err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("adopting the /.aenv image of the snapshot: %w", err)
	}
	return out, nil
}

// toolsImageUUID is every /.aenv image's UUID (see toolsImage).
const toolsImageUUID = "ae7e0000-0000-4000-8000-00000000ae7e"

func (d *Driver) imagesDir() string {
	if d.cfg.ImagesDir != "" {
		return d.cfg.ImagesDir
	}
	return filepath.Join(d.cfg.StateDir, "images")
}

// linkOrCopy makes dst a hard link to src, or a copy where src is on
// another file system (or may not be linked).
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// rootImageID, in a sandbox's directory, is the identity of the image
// its root runs from (imageIdentity), read as it started: a checkpoint
// must not depend on the image file still being there. It is there only
// for a sandbox without a gofer.
const rootImageID = "root-image-id"

// toolsImagePath, in a sandbox's directory, is the path of its /.aenv
// image (which stays while a sandbox mounts it: pruneToolsImages), and
// toolsImageMarker, in a checkpoint's, the image's identity: gVisor
// restores /.aenv only from an image with the same superblock.
// savedToolsImage is the image itself in the checkpoint's directory: a
// restore under the build that saved it uses the image of the binaries it
// runs with (toolsImage), one under another build the checkpoint's own
// (adoptSavedTools).
const (
	toolsImagePath   = "tools-image"
	toolsImageMarker = "aenv-tools-image"
	savedToolsImage  = "aenv-tools.erofs"
)

// noteRootImage records the identity of spec's root image and the path of
// the /.aenv image toolsImage in dir, the directory of its sandbox, which
// runs without a gofer.
func noteRootImage(dir string, spec runtime.Spec, toolsImage string) error {
	id, err := blockimage.Identity(spec.Root.Image)
	if err != nil {
		return err
	}
	if err := writeIdentity(filepath.Join(dir, toolsImagePath), toolsImage); err != nil {
		return err
	}
	return writeIdentity(filepath.Join(dir, rootImageID), id)
}

// recordedTools is the path of the /.aenv image of the sandbox whose
// directory is dir, and its identity; "" for a sandbox with a gofer (or
// one started by a build that did not record the path).
func recordedTools(dir string) (image, id string, err error) {
	image, ok := readIdentity(filepath.Join(dir, toolsImagePath))
	if !ok {
		return "", "", nil
	}
	id, err = blockimage.Identity(image)
	return image, id, err
}

// recordedImage is the root image identity the sandbox directory dir
// records, "" for a sandbox with a gofer.
func recordedImage(dir string) string {
	id, _ := readIdentity(filepath.Join(dir, rootImageID))
	return id
}

// markedImage is the root image identity the checkpoint in imageDir was
// saved from, and whether it ran without a gofer at all (a marker without
// an identity predates the identity).
func markedImage(imageDir string) (id string, marked bool) {
	return readIdentity(filepath.Join(imageDir, rootImageMarker))
}

// readIdentity returns the image identity file holds, and whether file
// is there at all.
func readIdentity(file string) (string, bool) {
	b, err := os.ReadFile(file)
	return strings.TrimSpace(string(b)), err == nil
}

// writeIdentity writes image identity id into file.
func writeIdentity(file, id string) error {
	return os.WriteFile(file, []byte(id+"\n"), 0o644)
}

// markRootMode leaves rootImageMarker in imageDir when the sandbox whose
// directory is dir runs without a gofer, and toolsImageMarker and the
// /.aenv image itself (savedToolsImage: a hard link on the same file
// system, so a few microseconds of a pause, and the store uploads it once
// per build since it keeps chunks by content) beside it.
func markRootMode(dir, imageDir string) error {
	id := recordedImage(dir)
	if id == "" {
		return nil
	}
	image, tools, err := recordedTools(dir)
	if err != nil {
		return err
	}
	if image != "" {
		if err := writeIdentity(filepath.Join(imageDir, toolsImageMarker), tools); err != nil {
			return err
		}
		if err := linkOrCopy(image, filepath.Join(imageDir, savedToolsImage)); err != nil {
			return fmt.Errorf("keeping the /.aenv image with the checkpoint: %w", err)
		}
	}
	return writeIdentity(filepath.Join(imageDir, rootImageMarker), id)
}

// errOtherTools is a restore whose checkpoint ran envd (and the
// template's tools) from another /.aenv image than this host makes of its
// binaries (aenv was upgraded or rebuilt since the pause, or the node
// restoring it runs another build) and does not keep that image, having
// been saved before checkpoints did. gVisor would refuse it too, with a
// dump of its state; the saved memory cannot run against other binaries.
var errOtherTools = errors.New("its snapshot was saved under another build of envd than this host runs (aenv was upgraded or rebuilt since), by a build that did not keep its /.aenv image with its snapshots: only a host running the build that saved it can restore it")

// sameToolsImage checks that the /.aenv image of identity got is the one
// the checkpoint in imageDir was saved with, where the checkpoint says
// (older checkpoints do not).
func sameToolsImage(imageDir, got string) error {
	if want, _ := readIdentity(filepath.Join(imageDir, toolsImageMarker)); want != "" && want != got {
		return errOtherTools
	}
	return nil
}

// sameRootMode reports whether a prepared sandbox whose directory
// records root image identity got (recordedImage) runs its root as the
// checkpoint in imageDir was saved: both with a gofer, or both without
// one from the same image.
func sameRootMode(got, imageDir string) bool {
	want, marked := markedImage(imageDir)
	if !marked {
		return got == ""
	}
	return got != "" && (want == "" || want == got)
}

// sameRootImage checks that image is the root image the checkpoint in
// imageDir was saved from, so that a restore from another (another
// host's base tree) fails with a reason rather than in gVisor's loader.
func sameRootImage(imageDir, image string) error {
	want, _ := markedImage(imageDir)
	if want == "" {
		return nil
	}
	got, err := blockimage.Identity(image)
	if err != nil {
		return err
	}
	if got != want {
		return errors.New("its snapshot was saved from another image of its template's files than this host's (every host builds its own base: see --base-root-image)")
	}
	return nil
}
