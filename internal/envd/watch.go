package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

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

	// synthetic holds creates reported from scanning a new directory, so
	// that inotify's own report of the same create is not sent twice.
	synthetic map[string]time.Time
}

// syntheticTTL is how long a scanned create suppresses inotify's.
const syntheticTTL = 2 * time.Second

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
	d := &dirWatcher{root: root, opts: opts, db: db, log: log, w: w, done: make(chan struct{}), synthetic: map[string]time.Time{}}
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
			if ev.Has(fsnotify.Create) {
				if at, ok := d.synthetic[ev.Name]; ok && time.Since(at) < syntheticTTL {
					delete(d.synthetic, ev.Name)
					if ev.Op == fsnotify.Create {
						continue
					}
					ev.Op &^= fsnotify.Create
				}
			}
			d.emit(ev.Name, ev.Op, emit)
			if d.opts.recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					d.watchNewDir(ev.Name, emit)
				}
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

// emit sends one protocol event per operation in op.
func (d *dirWatcher) emit(path string, op fsnotify.Op, emit func(*filesystem.FilesystemEvent)) {
	rel, err := filepath.Rel(d.root, path)
	if err != nil {
		return
	}
	for _, o := range fsnotifyOps {
		if !op.Has(o.op) {
			continue
		}
		fe := &filesystem.FilesystemEvent{Name: rel, Type: o.t}
		if d.opts.includeEntry && o.op != fsnotify.Remove && o.op != fsnotify.Rename {
			if e, err := statEntry(d.db, path); err == nil {
				fe.Entry = e
			}
		}
		emit(fe)
	}
}

// watchNewDir watches a directory that appeared under a recursive watch.
// Whatever was created in it before the watch was in place (mkdir -p a/b;
// touch a/b/f happens faster than that) is reported as created now.
func (d *dirWatcher) watchNewDir(dir string, emit func(*filesystem.FilesystemEvent)) {
	now := time.Now()
	for p, at := range d.synthetic {
		if now.Sub(at) >= syntheticTTL {
			delete(d.synthetic, p)
		}
	}
	if err := d.w.Add(dir); err != nil {
		d.log.Debug("watching new subdirectory", "path", dir, "err", err)
		return
	}
	_ = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if de.IsDir() {
			if err := d.w.Add(p); err != nil {
				d.log.Debug("watching new subdirectory", "path", p, "err", err)
			}
		}
		d.synthetic[p] = now
		d.emit(p, fsnotify.Create, emit)
		return nil
	})
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
