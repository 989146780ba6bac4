package gvisor

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime"
)

func testDriver(t *testing.T) *Driver {
	t.Helper()
	return &Driver{cfg: Config{StateDir: t.TempDir()}, log: slog.New(slog.DiscardHandler),
		running: map[string]int{}, pumps: map[string]*logPump{}}
}

// readLog is envd's log of sandbox id as EnvdLog gives it, whole.
func readLog(t *testing.T, d *Driver, id string) string {
	t.Helper()
	files, err := d.EnvdLog(id)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range files {
		io.Copy(&b, f)
		f.Close()
	}
	return b.String()
}

// pumped makes sandbox id's directory and FIFO and starts its pump; it
// returns the sandbox's end of the FIFO, which stands for envd's output.
func pumped(t *testing.T, d *Driver, id string) *os.File {
	t.Helper()
	if err := os.MkdirAll(d.sandboxDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	w, err := makeEnvdPipe(d.sandboxDir(id))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.startPump(id); err != nil {
		t.Fatal(err)
	}
	return w
}

func waitPump(t *testing.T, d *Driver, id string) {
	t.Helper()
	p := d.pump(id)
	if p == nil {
		return
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump did not end with its writer")
	}
}

// TestEnvdLogSurvivesRestart: what the sandbox writes while no driver
// reads its FIFO (between two processes) waits in the pipe and reaches
// the log once the next one reads; the pump ends with the sandbox.
func TestEnvdLogSurvivesRestart(t *testing.T) {
	d := testDriver(t)
	w := pumped(t, d, "sb1")
	fmt.Fprintln(w, "before the restart")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(readLog(t, d, "sb1"), "before") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	d.stopPump("sb1", 0) // the process stops
	if _, err := fmt.Fprintln(w, "while nobody reads"); err != nil {
		t.Fatalf("writing while the driver is away: %v", err)
	}
	d2 := testDriver(t)
	d2.cfg.StateDir = d.cfg.StateDir
	if err := d2.startPump("sb1"); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(w, "after the restart")
	w.Close() // the sandbox ends
	waitPump(t, d2, "sb1")
	if got := readLog(t, d2, "sb1"); got != "before the restart\nwhile nobody reads\nafter the restart\n" {
		t.Fatalf("envd's log across a restart: %q", got)
	}
}

// TestEnvdLogCapped: a writer that never stops leaves at most two files
// of envdLogMax bytes, in lines, the latest lines kept whole.
func TestEnvdLogCapped(t *testing.T) {
	d := testDriver(t)
	dir := d.sandboxDir("sb2")
	w := pumped(t, d, "sb2")
	junk := make([]byte, 1<<20) // zeros, no newline: cat /dev/zero
	for range 3 * envdLogMax / len(junk) {
		if _, err := w.Write(junk); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Fprintln(w, "\nthe last line")
	w.Close()
	waitPump(t, d, "sb2")
	var total int64
	for _, name := range []string{envdLogName, envdLogName + ".1"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > envdLogMax {
			t.Fatalf("%s holds %d bytes, over %d", name, fi.Size(), envdLogMax)
		}
		total += fi.Size()
	}
	if total < envdLogMax {
		t.Fatalf("the log holds %d bytes of %d written", total, 3*envdLogMax)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Fatalf("the sandbox directory holds %v; want the pipe and two logs", entries)
	}
	sc := bufio.NewScanner(strings.NewReader(readLog(t, d, "sb2")))
	sc.Buffer(nil, 2*maxLogLine)
	last := ""
	for sc.Scan() {
		if len(sc.Text()) > maxLogLine {
			t.Fatalf("a line of %d bytes", len(sc.Text()))
		}
		last = sc.Text()
	}
	if sc.Err() != nil || last != "the last line" {
		t.Fatalf("the log ends with %q (%v)", last, sc.Err())
	}
}

// TestEnvdLogCatchesUp: a read of the log right after envd wrote a line
// holds it, though a flood of output before it (a pipe's worth left
// unread) still had to be copied.
func TestEnvdLogCatchesUp(t *testing.T) {
	d := testDriver(t)
	w := pumped(t, d, "sb4")
	defer w.Close()
	junk := make([]byte, 1<<20) // zeros, no newline: cat /dev/zero
	for round := range 5 {
		for range 2 {
			if _, err := w.Write(junk); err != nil {
				t.Fatal(err)
			}
		}
		marker := fmt.Sprintf("\nthe line after the flood, round %d\n", round)
		if _, err := io.WriteString(w, marker); err != nil {
			t.Fatal(err)
		}
		if got := readLog(t, d, "sb4"); !strings.HasSuffix(got, marker) {
			t.Fatalf("round %d: the log read right after a line ends with %q, not the line", round, got[max(0, len(got)-80):])
		}
	}
}

// TestEnvdServingNotice: the channel of EnvdServing closes at the line
// in which envd says it serves, written as envd writes it (slog's text),
// not at a line that only quotes it; and when the log ends without it.
func TestEnvdServingNotice(t *testing.T) {
	d := testDriver(t)
	if ch := d.EnvdServing("none"); ch != nil {
		t.Fatal("a notice for a sandbox the driver does not know")
	}
	start := func(id string) (*os.File, *slog.Logger, <-chan struct{}) {
		w := pumped(t, d, id)
		ch := d.EnvdServing(id)
		if ch == nil {
			t.Fatalf("no notice for %s, whose log the driver reads", id)
		}
		return w, slog.New(slog.NewTextHandler(w, nil)), ch
	}
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	w, log, serving := start("sb1")
	defer w.Close()
	log.Info("process started", "cmd", "/bin/echo", "args", `msg="envd serving" level=INFO msg="envd serving" `)
	log.Debug(runtime.EnvdServingMessage)
	log.Info("initialized")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(readLog(t, d, "sb1"), "initialized") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if closed(serving) {
		t.Fatalf("the notice came from lines quoting it:\n%s", readLog(t, d, "sb1"))
	}
	log.Info(runtime.EnvdServingMessage, "addr", "[::]:49983", "pid1", true)
	select {
	case <-serving:
	case <-time.After(5 * time.Second):
		t.Fatalf("no notice after envd said it serves:\n%s", readLog(t, d, "sb1"))
	}

	// A sandbox gone before envd served: the waiter is let go.
	w2, _, serving2 := start("sb2")
	w2.Close()
	waitPump(t, d, "sb2")
	if !closed(serving2) {
		t.Fatal("the notice stays pending after envd's log ended")
	}
}
