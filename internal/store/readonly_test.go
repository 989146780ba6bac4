package store

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestReadOnlyS3 saves to a gateway that refuses writes (a second
// versitygw over the same data, started --readonly): Save fails saying
// which snapshot and why, and the catalog is unchanged.
func TestReadOnlyS3(t *testing.T) {
	ctx := context.Background()
	rw := newS3Backend(t)
	s := newStore(t, Options{Backend: rw, ChunkSize: MiB})
	files := writeFiles(t, map[string][]byte{"mem": randomBytes(20, 3*MiB)})
	if _, _, err := s.Save(ctx, "ro-0", "", files, nil); err != nil {
		t.Fatal(err)
	}

	ro, err := startGateway(gw.bin, gw.dataDir, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ro.stop)
	rob, err := NewS3(ctx, ro.config(rw.prefix))
	if err != nil {
		t.Fatal(err)
	}
	// Small chunks: versitygw refuses a write before reading its body and
	// then closes the connection, so a body larger than what it reads with
	// the headers may turn its 403 into "connection reset by peer" on the
	// client. A 4 KiB body is read whole, and the 403 always arrives.
	ros := newStore(t, Options{Backend: rob, ChunkSize: 4096})

	// Reading still works through the read-only gateway.
	if err := ros.Restore(ctx, "ro-0", t.TempDir()); err != nil {
		t.Fatalf("restore through the read-only gateway: %v", err)
	}
	changed := writeFiles(t, map[string][]byte{"mem": randomBytes(21, 3*4096+100)})
	_, _, err = ros.Save(ctx, "ro-1", "ro-0", changed, nil)
	if err == nil {
		t.Fatal("Save to a read-only gateway succeeded")
	}
	t.Logf("read-only save: %v", err)
	for _, want := range []string{"saving snapshot ro-1", "AccessDenied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := s.Get(ctx, "ro-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(ro-1) = %v, want ErrNotFound", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 1 {
		t.Fatalf("catalog after refused Save: %v, %v", list, err)
	}
}
