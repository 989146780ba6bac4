package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/client"
)

// TestForkSnapshotLogsMetricsVolumes drives the commands of a sandbox's
// state and history, and volumes, against a real server.
func TestForkSnapshotLogsMetricsVolumes(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	e.mustRun(t, "exec", id, "--", "echo state > /home/user/f")

	kids := strings.Fields(e.mustRun(t, "fork", id, "-n", "2", "--timeout", "60"))
	if len(kids) != 2 {
		t.Fatalf("fork -n 2 printed %v", kids)
	}
	for _, k := range kids {
		if out := e.mustRun(t, "exec", k, "--", "cat /home/user/f"); out != "state\n" {
			t.Fatalf("child %s sees %q", k, out)
		}
	}
	oneErrorLine(t, e.run(t, "", "fork", id, "-n", "0"), "-n must be at least 1")

	snap := strings.TrimSpace(e.mustRun(t, "snapshot", id, "--name", "cli-snap"))
	var snaps []client.Snapshot
	if err := json.Unmarshal([]byte(e.mustRun(t, "snapshot", "ls", "-o", "json")), &snaps); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range snaps {
		found = found || (s.SnapshotID == snap && s.SandboxID == id && len(s.Names) == 1 && s.Names[0] == "cli-snap")
	}
	if !found {
		t.Fatalf("snapshot ls lacks %s: %+v", snap, snaps)
	}
	from := e.create(t, "cli-snap")
	if out := e.mustRun(t, "exec", from, "--", "cat /home/user/f"); out != "state\n" {
		t.Fatalf("a sandbox from the snapshot sees %q", out)
	}
	e.mustRun(t, "snapshot", "rm", snap)
	oneErrorLine(t, e.run(t, "", "snapshot", "rm", snap), "no template or snapshot")

	logs := e.mustRun(t, "logs", id)
	if !strings.Contains(logs, "sandbox created") || !strings.Contains(logs, "process started") || !strings.Contains(logs, "echo state") {
		t.Fatalf("logs:\n%s", logs)
	}
	var entries []client.LogEntry
	for _, line := range strings.Split(strings.TrimSpace(e.mustRun(t, "logs", id, "-o", "json")), "\n") {
		var le client.LogEntry
		if err := json.Unmarshal([]byte(line), &le); err != nil {
			t.Fatalf("logs -o json line %q: %v", line, err)
		}
		entries = append(entries, le)
	}
	if len(entries) < 3 {
		t.Fatalf("logs -o json: %+v", entries)
	}
	metrics := e.mustRun(t, "metrics", id)
	if !strings.HasPrefix(metrics, "TIME") || !strings.Contains(metrics, "MiB / 512.0 MiB") {
		t.Fatalf("metrics:\n%s", metrics)
	}

	vol := strings.TrimSpace(e.mustRun(t, "volume", "create", "clivol", "--size", "64"))
	if !strings.Contains(e.mustRun(t, "volume", "ls"), vol+"  clivol  64 MiB") {
		t.Fatalf("volume ls lacks %s", vol)
	}
	writer := e.create(t, "base", "--volume", "clivol:/data")
	e.mustRun(t, "exec", writer, "--", "echo shared > /data/x")
	reader := e.create(t, "base", "--volume", "clivol:/mnt/v")
	if out := e.mustRun(t, "exec", reader, "--", "cat /mnt/v/x"); out != "shared\n" {
		t.Fatalf("the second sandbox reads %q", out)
	}
	oneErrorLine(t, e.run(t, "", "volume", "rm", vol), "mounted")
	oneErrorLine(t, e.run(t, "", "create", "base", "--volume", "clivol"), "--volume wants NAME:/absolute/path")
	for _, sb := range []string{writer, reader} {
		e.mustRun(t, "rm", sb)
	}
	e.mustRun(t, "volume", "rm", vol)
}
