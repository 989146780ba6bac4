package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// TestEndedSandboxesAnswerFromDisk: the logs and metrics of killed
// sandboxes answer from the node's ended history on disk (a file each,
// within its byte bound), with what envd logged of their processes; a
// paused sandbox's history goes to disk and comes back on resume.
func TestEndedSandboxesAnswerFromDisk(t *testing.T) {
	srv, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolMemory = -1
		cfg.EndedHistoryBytes = 4 << 20
	})
	ctx := context.Background()
	dir := filepath.Join(srv.cfg.DataDir, "ended-history")
	var killed []string
	for range 3 {
		sb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
		runOut(t, c, sb.SandboxID, "echo churn")
		must(t, c.Kill(ctx, sb.SandboxID))
		killed = append(killed, sb.SandboxID)
	}
	files := historyFiles(t, dir)
	for _, id := range killed {
		if !files[id] {
			t.Fatalf("no history of killed sandbox %s under %s (found %v)", id, dir, files)
		}
		logs, err := c.Logs(ctx, id, time.Time{})
		if err != nil {
			t.Fatalf("the logs of killed sandbox %s: %v", id, err)
		}
		if !hasMessage(logs, "sandbox created") || !hasMessage(logs, "process started") || logs[len(logs)-1].Message != "sandbox killed" {
			t.Fatalf("the logs of killed sandbox %s lack its creation, its process or its kill: %+v", id, logs)
		}
		m, err := c.SandboxMetrics(ctx, id, time.Time{}, time.Time{})
		if err != nil || len(m) == 0 || m[0].MemTotal == 0 {
			t.Fatalf("the metrics of killed sandbox %s: %+v, %v; want its first sample", id, m, err)
		}
	}

	// A pause ends the sandbox here: its history goes to disk, and its
	// resume takes it back and goes on.
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	runOut(t, c, sb.SandboxID, "echo before the pause")
	must(t, c.Pause(ctx, sb.SandboxID))
	if !historyFiles(t, dir)[sb.SandboxID] {
		t.Fatalf("the paused sandbox %s has no history on disk", sb.SandboxID)
	}
	logs, err := c.Logs(ctx, sb.SandboxID, time.Time{})
	if err != nil || !hasMessage(logs, "sandbox stopped: its state is saved") || !hasMessage(logs, "process started") {
		t.Fatalf("the logs of the paused sandbox: %+v, %v", logs, err)
	}
	if _, resumed, err := c.Connect(ctx, sb.SandboxID, time.Minute); err != nil || !resumed {
		t.Fatalf("resuming: resumed %v, %v", resumed, err)
	}
	if historyFiles(t, dir)[sb.SandboxID] {
		t.Fatalf("the resumed sandbox %s still has its history on disk", sb.SandboxID)
	}
	runOut(t, c, sb.SandboxID, "echo after the resume")
	logs, err = c.Logs(ctx, sb.SandboxID, time.Time{})
	if err != nil || !hasMessage(logs, "sandbox created") || !hasMessage(logs, "sandbox restored") {
		t.Fatalf("the logs of the resumed sandbox lack its creation or its resume: %+v, %v", logs, err)
	}
	must(t, c.Kill(ctx, sb.SandboxID))
}

// historyFiles names the sandboxes with a history under dir.
func historyFiles(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	teams, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading the ended history: %v", err)
	}
	for _, team := range teams {
		files, _ := os.ReadDir(filepath.Join(dir, team.Name()))
		for _, f := range files {
			if id, ok := strings.CutSuffix(f.Name(), ".json.gz"); ok {
				out[id] = true
			}
		}
	}
	return out
}

func hasMessage(logs []client.LogEntry, msg string) bool {
	for _, e := range logs {
		if e.Message == msg {
			return true
		}
	}
	return false
}
