package state_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/testutil"
)

func TestBackupRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dataDir := filepath.Join(t.TempDir(), "etcd")
	sockDir := shortDir(t)
	e := openEtcd(t, state.Config{DataDir: dataDir, SocketDir: sockDir})
	var lastRev int64
	for i := range 10 {
		rev, err := e.Put(ctx, fmt.Sprintf("sandboxes/%d", i), []byte(fmt.Sprint("record ", i)), state.WriteOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lastRev = rev
	}
	snap := filepath.Join(t.TempDir(), "backup.db")
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Backup(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Written after the backup: gone after the restore.
	if _, err := e.Put(ctx, "sandboxes/late", []byte("late"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	if err := state.RestoreEmbedded(ctx, snap, dataDir); err != nil {
		t.Fatal(err)
	}
	old, _ := filepath.Glob(dataDir + ".old-*")
	if len(old) != 1 {
		t.Fatalf("old data dirs %v, want one moved aside", old)
	}

	e = openEtcd(t, state.Config{DataDir: dataDir, SocketDir: sockDir})
	es, rev, err := e.List(ctx, "sandboxes/")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 10 {
		t.Fatalf("restored %d records, want 10: %v", len(es), es)
	}
	if string(es[3].Value) != "record 3" {
		t.Fatalf("restored %s = %q", es[3].Key, es[3].Value)
	}
	// Restore bumps revisions so that watchers never see them go back.
	if rev <= lastRev {
		t.Fatalf("revision after restore %d, want > %d", rev, lastRev)
	}
	ev := <-e.Watch(ctx, "sandboxes/", lastRev)
	if !errors.Is(ev.Err, state.ErrCompacted) {
		t.Fatalf("watch from before the restore: %+v, want ErrCompacted", ev)
	}
	if _, err := e.Create(ctx, "sandboxes/new", []byte("x"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A fresh dir works too.
	fresh := filepath.Join(t.TempDir(), "etcd")
	if err := state.RestoreEmbedded(ctx, snap, fresh); err != nil {
		t.Fatal(err)
	}
	e2 := openEtcd(t, state.Config{DataDir: fresh, SocketDir: shortDir(t)})
	if _, err := e2.Get(ctx, "sandboxes/9"); err != nil {
		t.Fatal(err)
	}
}

func TestStats(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := openEmbedded(t)
	rev, err := e.Put(ctx, "k", []byte("v"), state.WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.DBSize <= 0 || st.DBSizeInUse <= 0 || st.DBSizeInUse > st.DBSize || st.Revision < rev || st.Version == "" {
		t.Fatalf("Stats = %+v after a write at %d", st, rev)
	}
	t.Logf("%+v", st)
}

func TestSocketDirTooLong(t *testing.T) {
	long := filepath.Join(shortDir(t), strings.Repeat("d", 100))
	_, err := state.Open(context.Background(), state.Config{DataDir: t.TempDir(), SocketDir: long, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "unix socket") {
		t.Fatalf("Open with a long SocketDir: %v, want an error naming the socket limit", err)
	}
}

func TestSocketInUse(t *testing.T) {
	e := openEmbedded(t)
	dir := filepath.Dir(strings.TrimPrefix(e.Endpoints()[0], "unix://"))
	_, err := state.Open(context.Background(), state.Config{DataDir: t.TempDir(), SocketDir: dir, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "another etcd") {
		t.Fatalf("second member on the same socket: %v, want refused", err)
	}
	// The first one still serves.
	if _, err := e.Put(context.Background(), "k", []byte("v"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestEmbeddedClientURLsLoopbackOnly(t *testing.T) {
	_, err := state.Open(context.Background(), state.Config{
		DataDir: t.TempDir(), ClientURLs: []string{"http://0.0.0.0:23790"}, Logger: quiet(),
	})
	if err == nil {
		t.Fatal("embedded member accepted a non-loopback client URL")
	}
}

func TestEmbeddedClientURLs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	e := openEtcd(t, state.Config{DataDir: t.TempDir(), ClientURLs: []string{url}})
	if _, err := e.Put(ctx, "k", []byte("v"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Another process's client reaches it on that URL.
	other := openEtcd(t, state.Config{Endpoints: []string{url}})
	if _, err := other.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	// And sees it among the members, which nodes keep sandboxes off.
	urls, err := other.MemberURLs(ctx)
	if err != nil || !slices.Contains(urls, url) {
		t.Fatalf("MemberURLs = %v, %v; want %s among them", urls, err, url)
	}
}

func TestWaitReadyNothingListens(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	e, err := state.Open(context.Background(), state.Config{
		Endpoints: []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))},
		OpTimeout: 500 * time.Millisecond,
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	start := time.Now()
	err = e.WaitReady(ctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, state.ErrUnavailable) {
		t.Fatalf("WaitReady = %v, want deadline exceeded and ErrUnavailable", err)
	}
	if took < 3500*time.Millisecond || took > 6*time.Second {
		t.Fatalf("WaitReady returned after %s, want about its ctx's 4s", took)
	}
	lines := strings.Count(logs.String(), "\n")
	if lines < 1 || lines > 6 || !strings.Contains(logs.String(), "unavailable") || !strings.Contains(logs.String(), "retrying in") {
		t.Fatalf("WaitReady logged %d lines, want a few retries:\n%s", lines, logs)
	}
	t.Logf("error: %v\nlogs:\n%s", err, logs)
}

func TestUnavailableAfterMemberStops(t *testing.T) {
	m := startMember(t)
	const opTimeout = time.Second
	e := openEtcd(t, state.Config{Endpoints: []string{m.endpoint}, OpTimeout: opTimeout})
	ctx := context.Background()
	if _, err := e.Put(ctx, "k", []byte("v"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	m.stop(t)
	for _, op := range []struct {
		name string
		fn   func() error
	}{
		{"Get", func() error { _, err := e.Get(ctx, "k"); return err }},
		{"Put", func() error { _, err := e.Put(ctx, "k", []byte("v"), state.WriteOptions{}); return err }},
		{"List", func() error { _, _, err := e.List(ctx, ""); return err }},
		{"Update", func() error { _, err := e.Update(ctx, "k", []byte("v"), 1, state.WriteOptions{}); return err }},
	} {
		start := time.Now()
		err := op.fn()
		took := time.Since(start)
		if !errors.Is(err, state.ErrUnavailable) {
			t.Errorf("%s with the member stopped: %v, want ErrUnavailable", op.name, err)
		}
		if took > opTimeout+time.Second {
			t.Errorf("%s took %s, want about OpTimeout %s", op.name, took, opTimeout)
		}
		t.Logf("%s after %s: %v", op.name, took.Round(time.Millisecond), err)
	}
}

// TestCheckURL: the state crosses the network only over TLS, unless
// insecure; loopback http and unix sockets stay local.
func TestCheckURL(t *testing.T) {
	for _, c := range []struct {
		url             string
		tls, insecure   bool
		wantErrContains string
	}{
		{url: "unix:///run/aenv/etcd.sock"},
		{url: "http://127.0.0.1:2379"},
		{url: "http://[::1]:2379"},
		{url: "http://localhost:2379"},
		{url: "http://10.0.0.5:2379", wantErrContains: "--insecure-cluster"},
		{url: "http://0.0.0.0:2379", wantErrContains: "--insecure-cluster"},
		{url: "http://etcd.example:2379", wantErrContains: "--insecure-cluster"},
		{url: "http://10.0.0.5:2379", insecure: true},
		{url: "https://10.0.0.5:2379", tls: true},
		{url: "https://10.0.0.5:2379", wantErrContains: "without TLS"},
		{url: "ftp://10.0.0.5:2379", tls: true, insecure: true, wantErrContains: "want https"},
	} {
		err := state.CheckURL(c.url, c.tls, c.insecure)
		switch {
		case c.wantErrContains == "" && err != nil:
			t.Errorf("CheckURL(%s, tls %v, insecure %v): %v, want accepted", c.url, c.tls, c.insecure, err)
		case c.wantErrContains != "" && (err == nil || !strings.Contains(err.Error(), c.wantErrContains)):
			t.Errorf("CheckURL(%s, tls %v, insecure %v): %v, want an error naming %q", c.url, c.tls, c.insecure, err, c.wantErrContains)
		}
	}
}

// TestExternalHTTPOffLoopbackRefused: a client is not pointed at plain
// http off loopback unless insecure.
func TestExternalHTTPOffLoopbackRefused(t *testing.T) {
	_, err := state.Open(context.Background(), state.Config{Endpoints: []string{"http://10.0.0.5:2379"}, Logger: quiet()})
	if err == nil || !strings.Contains(err.Error(), "--insecure-cluster") {
		t.Fatalf("Open at http://10.0.0.5: %v, want refused naming --insecure-cluster", err)
	}
}
