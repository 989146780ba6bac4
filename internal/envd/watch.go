package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// watchOptions are the knobs WatchDir and CreateWatcher share.
type watchOptions struct {
	recursive          bool
	includeEntry       bool
	allowNetworkMounts bool
}

// dirWatcher turns inotify events under one directory into protocol
// events named relative to that directory. inotify is not recursive, so a
// recursive watcher adds a watch for every directory as it appears.
type dirWatcher struct {
	root string
	opts watchOptions
	db   *userDB
	log  *slog.Logger
	w    *fsnotify.Watcher

	closeOnce sync.Once
	done      chan struct{}
}

func newDirWatcher(root string, opts watchOptions, db *userDB, log *slog.Logger) (*dirWatcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", root, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("watching %s: %w: not a directory", root, errInvalid)
	}
	if fsName := networkMount(root); fsName != "" && !opts.allowNetworkMounts {
		return nil, fmt.Errorf("watching %s: %w: it is on a network mount (%s), where events may be missed; allow network mounts to watch it anyway", root, errInvalid, fsName)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", root, err)
	}
	d := &dirWatcher{root: root, opts: opts, db: db, log: log, w: w, done: make(chan struct{})}
	if err := w.Add(root); err != nil {
		w.Close()
		return nil, fmt.Errorf("watching %s: %w", root, err)
	}
	if opts.recursive {
		d.addSubdirs(root)
	}
	return d, nil
}

// addSubdirs watches every directory below dir. Failures (a directory
// removed meanwhile) only lose events under it.
func (d *dirWatcher) addSubdirs(dir string) {
	_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if de.IsDir() && p != dir {
			if err := d.w.Add(p); err != nil {
				d.log.Debug("watching subdirectory", "path", p, "err", err)
			}
		}
		return nil
	})
}

func (d *dirWatcher) close() {
	d.closeOnce.Do(func() {
		close(d.done)
		d.w.Close()
	})
}

var fsnotifyOps = []struct {
	op fsnotify.Op
	t  filesystem.EventType
}{
	{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
}

// run calls emit for each event until the watcher is closed or the watched
// directory itself is removed or moved away.
func (d *dirWatcher) run(emit func(*filesystem.FilesystemEvent)) {
	for {
		select {
		case ev, ok := <-d.w.Events:
			if !ok {
				return
			}
			if ev.Name == d.root {
				if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
					return
				}
				continue
			}
			rel, err := filepath.Rel(d.root, ev.Name)
			if err != nil {
				continue
			}
			if d.opts.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					if err := d.w.Add(ev.Name); err == nil {
						d.addSubdirs(ev.Name)
					}
				}
			}
			for _, o := range fsnotifyOps {
				if !ev.Has(o.op) {
					continue
				}
				fe := &filesystem.FilesystemEvent{Name: rel, Type: o.t}
				if d.opts.includeEntry && o.op != fsnotify.Remove && o.op != fsnotify.Rename {
					if e, err := statEntry(d.db, ev.Name); err == nil {
						fe.Entry = e
					}
				}
				emit(fe)
			}
		case err, ok := <-d.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				d.log.Warn("watch events lost", "path", d.root, "err", err)
			} else {
				d.log.Debug("watch error", "path", d.root, "err", err)
			}
		}
	}
}

// watcherTable holds the watchers of the polling API (CreateWatcher).
type watcherTable struct {
	mu sync.Mutex
	m  map[string]*polledWatcher
}

// maxPolledEvents bounds what a watcher nobody polls can hold; later events
// are dropped.
const maxPolledEvents = 10000

type polledWatcher struct {
	d *dirWatcher

	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	dropped int
}

func newWatcherTable() *watcherTable { return &watcherTable{m: map[string]*polledWatcher{}} }

func (t *watcherTable) add(id string, pw *polledWatcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[id] = pw
}

func (t *watcherTable) get(id string) (*polledWatcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pw, ok := t.m[id]
	if !ok {
		return nil, fmt.Errorf("finding watcher %q: %w", id, errNotFound)
	}
	return pw, nil
}

func (t *watcherTable) remove(id string) error {
	t.mu.Lock()
	pw, ok := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("removing watcher %q: %w", id, errNotFound)
	}
	pw.d.close()
	return nil
}

func (t *watcherTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, pw := range t.m {
		pw.d.close()
		delete(t.m, id)
	}
}

func (pw *polledWatcher) push(ev *filesystem.FilesystemEvent) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.events) >= maxPolledEvents {
		pw.dropped++
		return
	}
	pw.events = append(pw.events, ev)
}

func (pw *polledWatcher) take() ([]*filesystem.FilesystemEvent, int) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	evs, dropped := pw.events, pw.dropped
	pw.events, pw.dropped = nil, 0
	return evs, dropped
}
