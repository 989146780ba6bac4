package envd_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
	"github.com/aenvhq/aenv/internal/testutil"
)

func TestStat(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "f.txt")
	if err := os.WriteFile(file, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}

	res, err := e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: file}, ""))
	if err != nil {
		t.Fatal(err)
	}
	en := res.Msg.GetEntry()
	if en.GetName() != "f.txt" || en.GetPath() != file || en.GetSize() != 5 || en.GetType() != filesystem.FileType_FILE_TYPE_FILE ||
		en.GetPermissions() != "-rw-r--r--" || en.GetMode() != 0o644 || en.GetOwner() == "" || en.GetGroup() == "" {
		t.Fatalf("file entry %v", en)
	}
	if d := time.Since(en.GetModifiedTime().AsTime()); d < 0 || d > time.Minute {
		t.Fatalf("modified time %v", en.GetModifiedTime().AsTime())
	}
	if os.Geteuid() == 0 && en.GetOwner() != "root" {
		t.Fatalf("owner %q, want root", en.GetOwner())
	}

	res, err = e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: dir}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || res.Msg.GetEntry().GetPermissions()[0] != 'd' {
		t.Fatalf("dir entry %v", res.Msg.GetEntry())
	}

	res, err = e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: link}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_SYMLINK || res.Msg.GetEntry().GetSymlinkTarget() != file {
		t.Fatalf("symlink entry %v", res.Msg.GetEntry())
	}

	_, err = e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: filepath.Join(dir, "missing")}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("stat of a missing path: %v, want not_found", err)
	}
	_, err = e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: filepath.Join(file, "below")}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("stat below a file: %v, want not_found", err)
	}

	// Relative paths are in the user's home.
	if err := os.WriteFile(filepath.Join(e.home, "rel.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err = e.fs.Stat(ctx, req(e, &filesystem.StatRequest{Path: "rel.txt"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetPath() != filepath.Join(e.home, "rel.txt") {
		t.Fatalf("relative path resolved to %q", res.Msg.GetEntry().GetPath())
	}
}

func TestMakeDir(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	res, err := e.fs.MakeDir(ctx, req(e, &filesystem.MakeDirRequest{Path: "a/b/c"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(e.home, "a/b/c")
	if res.Msg.GetEntry().GetPath() != want || res.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY {
		t.Fatalf("entry %v", res.Msg.GetEntry())
	}
	uid, gid := testIDs()
	for _, d := range []string{"a", "a/b", "a/b/c"} {
		fi, err := os.Stat(filepath.Join(e.home, d))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Fatalf("%s owned by %d:%d, want %d:%d", d, st.Uid, st.Gid, uid, gid)
		}
	}
	_, err = e.fs.MakeDir(ctx, req(e, &filesystem.MakeDirRequest{Path: want}, ""))
	if connectCode(err) != connect.CodeAlreadyExists {
		t.Fatalf("making an existing dir: %v, want already_exists", err)
	}
}

func TestMakeDirAsRootIsOwnedByRoot(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t)
	dir := filepath.Join(t.TempDir(), "x")
	if _, err := e.fs.MakeDir(context.Background(), req(e, &filesystem.MakeDirRequest{Path: dir}, "root")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Fatalf("owned by %d", st.Uid)
	}
}

func TestListDir(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, p := range []string{"a/b/c", "d"} {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"f1", "a/f2", "a/b/f3"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := func(depth uint32) []string {
		t.Helper()
		res, err := e.fs.ListDir(ctx, req(e, &filesystem.ListDirRequest{Path: dir, Depth: depth}, ""))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, en := range res.Msg.GetEntries() {
			rel, _ := filepath.Rel(dir, en.GetPath())
			if filepath.Base(rel) != en.GetName() {
				t.Fatalf("entry name %q for path %q", en.GetName(), en.GetPath())
			}
			got = append(got, rel)
		}
		sort.Strings(got)
		return got
	}
	if got, want := list(0), []string{"a", "d", "f1"}; !slices.Equal(got, want) {
		t.Fatalf("depth default: %v, want %v", got, want)
	}
	if got, want := list(2), []string{"a", "a/b", "a/f2", "d", "f1"}; !slices.Equal(got, want) {
		t.Fatalf("depth 2: %v, want %v", got, want)
	}
	if got, want := list(5), []string{"a", "a/b", "a/b/c", "a/b/f3", "a/f2", "d", "f1"}; !slices.Equal(got, want) {
		t.Fatalf("depth 5: %v, want %v", got, want)
	}
	_, err := e.fs.ListDir(ctx, req(e, &filesystem.ListDirRequest{Path: filepath.Join(dir, "f1")}, ""))
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("listing a file: %v, want invalid_argument", err)
	}
	_, err = e.fs.ListDir(ctx, req(e, &filesystem.ListDirRequest{Path: filepath.Join(dir, "nope")}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("listing a missing dir: %v, want not_found", err)
	}
}

func TestMoveAndRemove(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "new/parent/dst")
	res, err := e.fs.Move(ctx, req(e, &filesystem.MoveRequest{Source: src, Destination: dst}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetPath() != dst || res.Msg.GetEntry().GetSize() != 4 {
		t.Fatalf("moved entry %v", res.Msg.GetEntry())
	}
	if _, err := os.Stat(src); !os.IsNotExist(err) {
		t.Fatalf("source still there: %v", err)
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "data" {
		t.Fatalf("destination: %q %v", b, err)
	}
	_, err = e.fs.Move(ctx, req(e, &filesystem.MoveRequest{Source: src, Destination: dst}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("moving a missing file: %v, want not_found", err)
	}

	if _, err := e.fs.Remove(ctx, req(e, &filesystem.RemoveRequest{Path: filepath.Join(dir, "new")}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
		t.Fatalf("directory not removed recursively: %v", err)
	}
	_, err = e.fs.Remove(ctx, req(e, &filesystem.RemoveRequest{Path: filepath.Join(dir, "new")}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("removing a missing path: %v, want not_found", err)
	}
}

// watchEvent is an event reduced to what the tests compare.
type watchEvent struct {
	name string
	typ  filesystem.EventType
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := req(e, &filesystem.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true}, "")
	r.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := e.fs.WatchDir(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first event %v, err %v", s.Msg(), s.Err())
	}

	events := make(chan *filesystem.WatchDirResponse, 100)
	go func() {
		defer close(events)
		for s.Receive() {
			events <- s.Msg()
		}
	}()
	var seen []watchEvent
	entries := map[watchEvent]*filesystem.EntryInfo{}
	keepalives := 0
	expect := func(want ...watchEvent) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for _, w := range want {
			for !slices.Contains(seen, w) {
				select {
				case ev, ok := <-events:
					if !ok {
						t.Fatalf("stream ended waiting for %v: %v", w, s.Err())
					}
					if ev.GetKeepalive() != nil {
						keepalives++
					}
					if fe := ev.GetFilesystem(); fe != nil {
						we := watchEvent{fe.GetName(), fe.GetType()}
						seen = append(seen, we)
						entries[we] = fe.GetEntry()
					}
				case <-deadline:
					t.Fatalf("no %v; saw %v", w, seen)
				}
			}
		}
	}

	f := filepath.Join(dir, "file")
	must(t, os.WriteFile(f, []byte("x"), 0o644))
	expect(watchEvent{"file", filesystem.EventType_EVENT_TYPE_CREATE}, watchEvent{"file", filesystem.EventType_EVENT_TYPE_WRITE})
	if en := entries[watchEvent{"file", filesystem.EventType_EVENT_TYPE_CREATE}]; en.GetPath() != f {
		t.Fatalf("create event entry %v", en)
	}
	must(t, os.Chmod(f, 0o600))
	expect(watchEvent{"file", filesystem.EventType_EVENT_TYPE_CHMOD})
	must(t, os.Rename(f, filepath.Join(dir, "renamed")))
	expect(watchEvent{"file", filesystem.EventType_EVENT_TYPE_RENAME}, watchEvent{"renamed", filesystem.EventType_EVENT_TYPE_CREATE})
	must(t, os.Remove(filepath.Join(dir, "renamed")))
	expect(watchEvent{"renamed", filesystem.EventType_EVENT_TYPE_REMOVE})

	// Recursive: a new directory is watched too.
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	expect(watchEvent{"sub", filesystem.EventType_EVENT_TYPE_CREATE})
	time.Sleep(100 * time.Millisecond)
	must(t, os.WriteFile(filepath.Join(dir, "sub", "inner"), []byte("y"), 0o644))
	expect(watchEvent{"sub/inner", filesystem.EventType_EVENT_TYPE_CREATE})

	// Faster than a watch can be added on the new directories: what is in
	// them is still reported, once.
	must(t, os.MkdirAll(filepath.Join(dir, "quick", "deeper"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "quick", "deeper", "f"), nil, 0o644))
	deep := watchEvent{"quick/deeper/f", filesystem.EventType_EVENT_TYPE_CREATE}
	expect(watchEvent{"quick/deeper", filesystem.EventType_EVENT_TYPE_CREATE}, deep)

	timeout := time.After(3 * time.Second)
	for keepalives == 0 {
		select {
		case ev := <-events:
			if ev.GetKeepalive() != nil {
				keepalives++
			}
			if fe := ev.GetFilesystem(); fe != nil {
				seen = append(seen, watchEvent{fe.GetName(), fe.GetType()})
			}
		case <-timeout:
			t.Fatal("no keepalive events")
		}
	}

	n := 0
	for _, ev := range seen {
		if ev == deep {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d create events for %s: %v", n, deep.name, seen)
	}

	_, err = e.fs.WatchDir(ctx, req(e, &filesystem.WatchDirRequest{Path: filepath.Join(dir, "missing")}, ""))
	if err == nil {
		s2, _ := e.fs.WatchDir(ctx, req(e, &filesystem.WatchDirRequest{Path: filepath.Join(dir, "missing")}, ""))
		s2.Receive()
		err = s2.Err()
	}
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("watching a missing dir: %v, want not_found", err)
	}
}

func TestWatchDirNonRecursiveIgnoresSubdirectories(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.fs.WatchDir(ctx, req(e, &filesystem.WatchDirRequest{Path: dir}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first event %v, err %v", s.Msg(), s.Err())
	}
	must(t, os.WriteFile(filepath.Join(dir, "sub", "deep"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "top"), nil, 0o644))
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	if fe := s.Msg().GetFilesystem(); fe.GetName() != "top" || fe.GetEntry() != nil {
		t.Fatalf("first event %v, want top (without entry)", fe)
	}
}

func TestWatcherPollingAPI(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	res, err := e.fs.CreateWatcher(ctx, req(e, &filesystem.CreateWatcherRequest{Path: dir}, ""))
	if err != nil {
		t.Fatal(err)
	}
	id := res.Msg.GetWatcherId()
	if id == "" {
		t.Fatal("empty watcher id")
	}
	must(t, os.WriteFile(filepath.Join(dir, "polled"), []byte("z"), 0o644))
	var got []watchEvent
	waitFor(t, 5*time.Second, "polled events", func() bool {
		ev, err := e.fs.GetWatcherEvents(ctx, req(e, &filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
		if err != nil {
			t.Fatal(err)
		}
		for _, fe := range ev.Msg.GetEvents() {
			got = append(got, watchEvent{fe.GetName(), fe.GetType()})
		}
		return slices.Contains(got, watchEvent{"polled", filesystem.EventType_EVENT_TYPE_WRITE})
	})
	if got[0] != (watchEvent{"polled", filesystem.EventType_EVENT_TYPE_CREATE}) {
		t.Fatalf("events %v", got)
	}
	// Events are handed out once.
	ev, err := e.fs.GetWatcherEvents(ctx, req(e, &filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
	if err != nil || len(ev.Msg.GetEvents()) != 0 {
		t.Fatalf("second poll: %v %v", ev, err)
	}
	if _, err := e.fs.RemoveWatcher(ctx, req(e, &filesystem.RemoveWatcherRequest{WatcherId: id}, "")); err != nil {
		t.Fatal(err)
	}
	_, err = e.fs.GetWatcherEvents(ctx, req(e, &filesystem.GetWatcherEventsRequest{WatcherId: id}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("polling a removed watcher: %v, want not_found", err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestSmallResponsesAreNotCompressed checks that envd sends small Connect
// responses uncompressed even to a client that accepts gzip (a gzip
// writer costs envd 1.3 MiB that its pool keeps), and still compresses a
// large one.
func TestSmallResponsesAreNotCompressed(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	list := func() *http.Response {
		t.Helper()
		body := strings.NewReader(`{"path":"` + dir + `","depth":1}`)
		res, _ := e.httpDo("POST", "/filesystem.Filesystem/ListDir", body, map[string]string{
			"Content-Type": "application/json", "Accept-Encoding": "gzip",
		})
		if res.StatusCode != http.StatusOK {
			t.Fatalf("ListDir: %s", res.Status)
		}
		return res
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if enc := list().Header.Get("Content-Encoding"); enc != "" {
		t.Errorf("a small listing came with Content-Encoding %q, want none", enc)
	}
	// About 300 bytes of JSON per entry: 400 entries are over 64 KiB.
	for i := range 400 {
		name := fmt.Sprintf("file-%04d-%s", i, strings.Repeat("x", 100))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if enc := list().Header.Get("Content-Encoding"); enc != "gzip" {
		t.Errorf("a large listing came with Content-Encoding %q, want gzip", enc)
	}
}
