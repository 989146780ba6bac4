package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runc "github.com/containerd/go-runc"

	"github.com/aenvhq/aenv/internal/runtime"
)

// TestFreezeThroughControlServer: a pause's checkpoint freezes the sandbox
// through its control server and leaves it frozen; a failed checkpoint
// thaws it; and a driver started after one that died with a sandbox
// frozen thaws it when it recovers it.
func TestFreezeThroughControlServer(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	spec, slot := f.spec(t, "gvtestfz")
	if err := f.driver.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.driver.Kill(context.Background(), spec.ID)
		f.driver.Close()
	})
	waitHealth(t, slot.HostAddr)

	// A checkpoint whose image directory cannot be made (its parent is a
	// file) fails after the freeze.
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.Checkpoint(ctx, spec.ID, filepath.Join(notDir, "img"), runtime.CheckpointOptions{Freeze: true}); err == nil {
		t.Fatal("a checkpoint under a regular file succeeded")
	}
	if !answers(slot.HostAddr) {
		t.Fatal("envd does not answer after a failed checkpoint: the sandbox was left frozen")
	}
	if f.driver.frozen(spec.ID) {
		t.Error("the frozen marker outlived the thaw of a failed checkpoint")
	}

	img := t.TempDir()
	if err := f.driver.Checkpoint(ctx, spec.ID, img, runtime.CheckpointOptions{Freeze: true}); err != nil {
		t.Fatal(err)
	}
	if err := checkImage(img); err != nil {
		t.Fatal(err)
	}
	if answers(slot.HostAddr) {
		t.Fatal("envd answers after a freezing checkpoint: the sandbox runs on")
	}
	if !f.driver.frozen(spec.ID) {
		t.Fatal("no frozen marker while the sandbox is frozen")
	}

	// The driver dies with it frozen; the next one recovers and thaws it.
	if err := f.driver.Close(); err != nil {
		t.Fatal(err)
	}
	d2, err := New(Config{RunscPath: f.driver.cfg.RunscPath, StateDir: f.driver.cfg.StateDir, CgroupParent: "/aenvgvt"})
	if err != nil {
		t.Fatal(err)
	}
	f.driver = d2
	if err := d2.Recover(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if !answers(slot.HostAddr) {
		t.Fatal("envd does not answer after Recover: the sandbox stayed frozen")
	}
	if d2.frozen(spec.ID) {
		t.Error("the frozen marker outlived Recover's thaw")
	}
	// A running sandbox without a marker is left alone: a resume of a
	// kernel that is not paused would end it.
	if err := d2.Recover(ctx, spec.ID); err == nil {
		t.Error("recovering a sandbox twice succeeded")
	}
	if !answers(slot.HostAddr) {
		t.Fatal("the sandbox died on a second Recover")
	}
	if err := d2.Kill(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d2.sandboxDir(spec.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir survived kill: %v", err)
	}
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
}

// answers says whether envd at addr answers /health within a second.
func answers(addr netip.Addr) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://%s:49983/health", addr))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// TestControlCalls: freeze and thaw send the control server's methods
// over a socket whose path is too long for a unix address (reached
// through a descriptor), keep the frozen marker exactly while a freeze
// may hold, and drop it when the call never reached the sandbox. It needs
// no root: the control server is a fake speaking urpc's framing.
func TestControlCalls(t *testing.T) {
	short := t.TempDir()
	sock := filepath.Join(short, "c.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	calls := make(chan string, 8)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			var c controlCall
			if err := json.NewDecoder(conn).Decode(&c); err == nil {
				calls <- c.Method
				conn.Write([]byte(`{"success":true,"err":"","result":{}}`))
			}
			conn.Close()
		}
	}()
	// A path past sun_path's 108 bytes, to the socket through a link.
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(long, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(long, "control.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	d := &Driver{cfg: Config{StateDir: state}, runc: &runc.Runc{Root: filepath.Join(state, "runsc")}}
	for _, dir := range []string{d.runc.Root, d.sandboxDir("sb1")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	meta, _ := json.Marshal(map[string]any{"id": "sb1", "sandbox": map[string]any{"controlSocketPath": link}})
	if err := os.WriteFile(filepath.Join(d.runc.Root, "sb1_sandbox:sb1.state"), meta, 0o600); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	if err := d.freeze(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if m := <-calls; m != controlPause || !d.frozen("sb1") {
		t.Fatalf("freeze called %q, frozen marker %v; want %q and the marker", m, d.frozen("sb1"), controlPause)
	}
	if err := d.Thaw(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if m := <-calls; m != controlResume || d.frozen("sb1") {
		t.Fatalf("thaw called %q, frozen marker %v; want %q and no marker", m, d.frozen("sb1"), controlResume)
	}

	l.Close()
	os.Remove(sock)
	if err := d.freeze(ctx, "sb1"); !errors.Is(err, errNotSent) {
		t.Fatalf("a freeze with no control server: %v, want errNotSent", err)
	}
	if d.frozen("sb1") {
		t.Error("a freeze that was never sent left the frozen marker: a later Recover would resume a running kernel")
	}
}
