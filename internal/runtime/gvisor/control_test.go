package gvisor

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

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
