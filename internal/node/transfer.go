package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/transfer"
)

// Without a store the nodes share, a snapshot moves from the node that
// took it to the one that restores it through the server (package
// transfer for the files, the node API's ExportSnapshot and
// ImportSnapshot for the wire): its image and metadata as this node's
// catalog keeps them (sealed with the cluster's data key, which every
// node holds), and the template it runs on when the other node lacks it.

// ExportOptions tune ExportSnapshot.
type ExportOptions struct {
	// Template sends the files of the snapshot's template too.
	Template bool
	// Offsets are how much the receiver has of each file already.
	Offsets map[string]int64
}

// ExportSnapshot emits the files of snapshot id, which this node holds,
// from the receiver's offsets (transfer.Send).
func (n *Node) ExportSnapshot(ctx context.Context, id string, opts ExportOptions, emit func(transfer.Part) error) error {
	if n.cfg.Snapshots == nil {
		return fmt.Errorf("exporting snapshot %s: %w: this node keeps no snapshots", id, ErrUnsupported)
	}
	snap, err := n.cfg.Snapshots.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", id, err)
	}
	if snap.Dir == "" {
		return fmt.Errorf("exporting snapshot %s: %w: its files are in the store, not on node %s", id, snapshot.ErrNotFound, n.cfg.ID)
	}
	srcs, err := dirSources(transfer.AreaSnapshot, snap.Dir)
	if err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", id, err)
	}
	if opts.Template {
		files, done, err := n.cfg.Templates.Export(ctx, snap.TemplateID)
		if err != nil {
			return fmt.Errorf("exporting snapshot %s: %w", id, err)
		}
		defer done()
		for _, name := range slices.Sorted(maps.Keys(files)) {
			srcs = append(srcs, transfer.Source{Name: transfer.AreaTemplate + "/" + name, Path: files[name]})
		}
	}
	start := time.Now()
	if err := transfer.Send(ctx, srcs, opts.Offsets, emit); err != nil {
		return fmt.Errorf("exporting snapshot %s: %w", id, err)
	}
	n.log.Info("snapshot exported", "snapshot_id", id, "files", len(srcs), "template", opts.Template,
		"took_ms", time.Since(start).Milliseconds())
	return nil
}

// dirSources are the regular files of dir as sources of area.
func dirSources(area, dir string) ([]transfer.Source, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []transfer.Source
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, transfer.Source{Name: area + "/" + e.Name(), Path: filepath.Join(dir, e.Name())})
		}
	}
	return out, nil
}

// ImportState is what a node has of a snapshot that is to arrive.
type ImportState struct {
	// Present says the node has the snapshot (its own, or in the store):
	// nothing need be sent.
	Present bool
	// TemplatePresent says it has the template asked about.
	TemplatePresent bool
	// Received is how much of each file an earlier, cut transfer left.
	Received map[string]int64
}

// imports orders the steps of each arriving snapshot: one at a time per
// snapshot, any number of snapshots at once.
type imports struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (im *imports) lock(id string) func() {
	im.mu.Lock()
	if im.locks == nil {
		im.locks = map[string]*sync.Mutex{}
	}
	l, ok := im.locks[id]
	if !ok {
		l = &sync.Mutex{}
		im.locks[id] = l
	}
	im.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func (im *imports) forget(id string) {
	im.mu.Lock()
	delete(im.locks, id)
	im.mu.Unlock()
}

// BeginImport says what this node has of snapshot id, and of the
// template templateID it runs on (empty: not asked).
func (n *Node) BeginImport(ctx context.Context, id, templateID string) (ImportState, error) {
	if n.cfg.Snapshots == nil {
		return ImportState{}, fmt.Errorf("importing snapshot %s: %w: this node keeps no snapshots", id, ErrUnsupported)
	}
	defer n.imports.lock(id)()
	st := ImportState{TemplatePresent: templateID == ""}
	if _, err := n.cfg.Snapshots.Get(ctx, id); err == nil {
		st.Present = true
		return st, nil
	} else if !errors.Is(err, snapshot.ErrNotFound) {
		return ImportState{}, fmt.Errorf("importing snapshot %s: %w", id, err)
	}
	if templateID != "" {
		_, err := n.cfg.Templates.Get(templateID)
		st.TemplatePresent = err == nil
	}
	dir, err := n.cfg.Snapshots.Incoming(id)
	if err != nil {
		return ImportState{}, err
	}
	if st.Received, err = transfer.NewReceiver(dir).Received(); err != nil {
		return ImportState{}, fmt.Errorf("importing snapshot %s: %w", id, err)
	}
	return st, nil
}

// ImportChunk writes a chunk of a file of snapshot id (transfer.Receiver.Write).
func (n *Node) ImportChunk(id, file string, offset int64, data []byte) error {
	if n.cfg.Snapshots == nil {
		return fmt.Errorf("importing snapshot %s: %w: this node keeps no snapshots", id, ErrUnsupported)
	}
	defer n.imports.lock(id)()
	dir, err := n.cfg.Snapshots.IncomingDir(id)
	if err != nil {
		return err
	}
	if err := transfer.NewReceiver(dir).Write(file, offset, data); err != nil {
		if errors.Is(err, transfer.ErrInvalid) {
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return fmt.Errorf("importing snapshot %s: %w", id, err)
	}
	return nil
}

// CommitImport checks the received files of snapshot id against files
// and puts the snapshot in place, with its template first when it came
// along. A file that does not match is dropped, to be sent again; the
// error then wraps transfer.ErrMismatch.
func (n *Node) CommitImport(ctx context.Context, id string, files []transfer.File) (*snapshot.Snapshot, error) {
	if n.cfg.Snapshots == nil {
		return nil, fmt.Errorf("importing snapshot %s: %w: this node keeps no snapshots", id, ErrUnsupported)
	}
	defer n.imports.lock(id)()
	dir, err := n.cfg.Snapshots.IncomingDir(id)
	if err != nil {
		return nil, err
	}
	r := transfer.NewReceiver(dir)
	if err := r.Verify(files); err != nil {
		if errors.Is(err, transfer.ErrInvalid) {
			err = fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return nil, fmt.Errorf("importing snapshot %s: %w", id, err)
	}
	if slices.ContainsFunc(files, func(f transfer.File) bool { return strings.HasPrefix(f.Name, transfer.AreaTemplate+"/") }) {
		if _, err := n.cfg.Templates.Adopt(ctx, r.Dir(transfer.AreaTemplate)); err != nil {
			return nil, fmt.Errorf("importing snapshot %s: %w", id, err)
		}
	}
	snap, err := n.cfg.Snapshots.Install(id, r.Dir(transfer.AreaSnapshot))
	if err != nil {
		return nil, err
	}
	n.cfg.Snapshots.DropIncoming(id)
	n.imports.forget(id)
	n.log.Info("snapshot imported from another node", "snapshot_id", id, "files", len(files))
	return snap, nil
}

// AbortImport drops what arrived of snapshot id.
func (n *Node) AbortImport(id string) {
	if n.cfg.Snapshots == nil {
		return
	}
	defer n.imports.lock(id)()
	n.cfg.Snapshots.DropIncoming(id)
	n.imports.forget(id)
}
