package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRingKeepsTheLast(t *testing.T) {
	var r ring[int]
	for i := range 10 {
		r.add(i, 4)
	}
	got := r.all()
	if len(got) != 4 || got[0] != 6 || got[3] != 9 {
		t.Fatalf("ring holds %v; want [6 7 8 9]", got)
	}
	if last, ok := r.last(); !ok || last != 9 {
		t.Fatalf("the last of a full ring: %d %v; want 9", last, ok)
	}
	var short ring[int]
	if _, ok := short.last(); ok {
		t.Fatal("an empty ring has a last item")
	}
	short.add(1, 4)
	if got := short.all(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("ring holds %v; want [1]", got)
	}
	if last, ok := short.last(); !ok || last != 1 {
		t.Fatalf("the last of a ring of one: %d %v; want 1", last, ok)
	}
}

func TestParseSlogText(t *testing.T) {
	kv := parseSlogText(`time=2026-12-01T13:11:38.713Z level=INFO msg="process started" pid=8 args="-l -c echo \"hi\" there" user=user`)
	want := map[string]string{"time": "2026-12-01T13:11:38.713Z", "level": "INFO", "msg": "process started", "pid": "8",
		"args": `-l -c echo "hi" there`, "user": "user"}
	for k, v := range want {
		if kv[k] != v {
			t.Errorf("%s = %q; want %q", k, kv[k], v)
		}
	}
	// A line cut short or not key=value gives what it has, not a panic.
	for _, line := range []string{"", "garbage", `msg="unterminated`, "a=1 =2", `k="\xff"`} {
		parseSlogText(line)
	}
}

func TestEnvdEvents(t *testing.T) {
	log := strings.Join([]string{
		`time=2026-12-01T13:11:38.673Z level=INFO msg=initialized env_vars=0 token_set=true`,
		`time=2026-12-01T13:11:38.700Z level=DEBUG msg="request served" path=/health`,
		`time=2026-12-01T13:11:38.713Z level=INFO msg="process started" pid=8 cmd=/bin/bash args="-l -c true"`,
		`not a log line`,
		`time=2026-12-01T13:11:44.772Z level=INFO msg="process ended" pid=8 exit_code=0`,
	}, "\n") + "\n"
	var c envdCursor
	got := c.advance([]*os.File{logFile(t, "envd.log", log)})
	if len(got) != 3 {
		t.Fatalf("%d events: %+v; want initialized, started, ended", len(got), got)
	}
	if got[1].Message != "process started" || got[1].Level != "info" || got[1].Fields["args"] != "-l -c true" ||
		!got[1].At.Equal(time.Date(2026, 12, 1, 13, 11, 38, 713e6, time.UTC)) {
		t.Fatalf("started event %+v", got[1])
	}
	if got[2].Fields["exit_code"] != "0" {
		t.Fatalf("ended event %+v", got[2])
	}
}

func logFile(t *testing.T, name, content string) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func event(at time.Time, pid int) string {
	return fmt.Sprintf("time=%s level=INFO msg=\"process started\" pid=%d\n", at.Format(time.RFC3339Nano), pid)
}

// TestEnvdCursor: each read takes only what was written since the last,
// a half-written line waits for its end, an overlong line is skipped, and
// after a rotation the rest of the old file and the new one are read,
// nothing twice.
func TestEnvdCursor(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	cur := logFile(t, "envd.log", event(at(1), 1)+event(at(2), 2))
	var c envdCursor
	if got := c.advance([]*os.File{cur}); len(got) != 2 {
		t.Fatalf("first read: %d events", len(got))
	}
	line := event(at(3), 3)
	cur.WriteString(line[:10])
	if got := c.advance([]*os.File{cur}); len(got) != 2 {
		t.Fatalf("a half-written line was taken: %d events", len(got))
	}
	cur.WriteString(line[10:] + strings.Repeat("x", 100<<10) + "\n" + event(at(4), 4))
	got := c.advance([]*os.File{cur})
	if len(got) != 4 || got[2].Fields["pid"] != "3" || got[3].Fields["pid"] != "4" {
		t.Fatalf("after the rest of a line and an overlong one: %+v", got)
	}
	readFrom := c.off

	// Rotated: the current file is now the old part, and more was
	// written to it before it moved.
	cur.WriteString(event(at(5), 5))
	next := logFile(t, "envd.log.new", event(at(6), 6))
	got = c.advance([]*os.File{cur, next})
	if len(got) != 6 || got[4].Fields["pid"] != "5" || got[5].Fields["pid"] != "6" {
		t.Fatalf("after a rotation: %+v", got)
	}
	if c.off <= 0 || c.off == readFrom {
		t.Fatalf("the cursor stands at %d", c.off)
	}
	// Both files gone by the next read: all is read again, and only the
	// events after the last kept are taken.
	newer := logFile(t, "envd.log.newer", event(at(6), 6)+event(at(7), 7))
	got = c.advance([]*os.File{newer})
	if len(got) != 7 || got[6].Fields["pid"] != "7" {
		t.Fatalf("after losing track: %+v", got)
	}
	// The sandbox gone: what was read stays.
	if got := c.advance(nil); len(got) != 7 {
		t.Fatalf("with no file: %d events", len(got))
	}
}

// TestLastSamples: a running sandbox has its last sample (its first is
// taken as it starts); one killed has none.
func TestLastSamples(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(h.config())
	ctx := t.Context()
	for _, id := range []string{"kept", "killed"} {
		if _, err := n.Create(ctx, CreateRequest{SandboxID: id, TemplateID: testTemplate}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Kill(ctx, "killed"); err != nil {
		t.Fatal(err)
	}
	got := n.LastSamples()
	s, ok := got["kept"]
	if len(got) != 1 || !ok || s.MemUsed != 64<<20 || s.MemTotal != 256<<20 || s.CPUCount != 1 {
		t.Fatalf("last samples %+v; want the running sandbox's only, with the runtime's 64 MiB of its 256", got)
	}
}
