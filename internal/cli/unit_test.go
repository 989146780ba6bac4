package cli

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

func TestShellJoin(t *testing.T) {
	got := shellJoin([]string{"printf", "%s|", "a b", "it's", "$HOME", "", "x=1"})
	want := `printf '%s|' 'a b' 'it'\''s' '$HOME' '' x=1`
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestStripDash(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"id -- ls -la", "id ls -la"},
		{"id ls -- x", "id ls -- x"},
		{"id", "id"},
	} {
		if got := strings.Join(stripDash(strings.Fields(tc.in)), " "); got != tc.want {
			t.Fatalf("stripDash(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestOneLine(t *testing.T) {
	err := oneLine(errors.New("first\n\n  second\r\nthird  "))
	if err.Error() != "first; second; third" {
		t.Fatalf("got %q", err)
	}
}

// slowReader returns its chunks one Read at a time, then EOF.
type slowReader struct {
	chunks []string
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

// TestForwardInputBatches: everything arrives in order, and reads that
// pile up behind a slow send go out together.
func TestForwardInputBatches(t *testing.T) {
	in := &slowReader{}
	for i := range 200 {
		in.chunks = append(in.chunks, string(rune('a'+i%26)))
	}
	var mu sync.Mutex
	var got bytes.Buffer
	sends := 0
	err := forwardInput(in, func(b []byte) error {
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		got.Write(b)
		sends++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for i := range 200 {
		want += string(rune('a' + i%26))
	}
	if got.String() != want {
		t.Fatalf("forwarded %q, want %q", got.String(), want)
	}
	if sends >= 200 {
		t.Fatalf("%d sends for 200 reads: nothing was batched", sends)
	}
}

func TestForwardInputStopsOnSendError(t *testing.T) {
	in := strings.NewReader(strings.Repeat("x", 1<<20))
	boom := errors.New("process gone")
	if err := forwardInput(in, func([]byte) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the send error", err)
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 10 << 20: "10.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := humanBytes(n); got != want {
			t.Fatalf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestLinuxOnly: a host command built off Linux takes any arguments and
// flags and fails saying where it runs, without touching anything.
func TestLinuxOnly(t *testing.T) {
	cmd := linuxOnly(&cobra.Command{Use: "server", Short: "Run the aenv server"})
	cmd.SetArgs([]string{"--listen", ":8000", "extra"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "aenv server runs on Linux only") {
		t.Fatalf("got %v, want an error saying aenv server runs on Linux only", err)
	}
	if !strings.HasSuffix(cmd.Short, "(Linux only)") {
		t.Fatalf("short help %q does not say Linux only", cmd.Short)
	}
}
