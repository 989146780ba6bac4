package buildjob

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// pullNode answers Pull with a queued line, progress, then result.
type pullNode struct {
	fakeNode
	pullResult *nodev1.PullResult

	pullMu  sync.Mutex
	pullReq *nodev1.PullRequest
}

func (n *pullNode) Pull(ctx context.Context, r *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error {
	n.pullMu.Lock()
	n.pullReq = r
	n.pullMu.Unlock()
	fn(&nodev1.PullEvent{Lines: []string{"queued: 1 pulls run at once on this node"}})
	fn(&nodev1.PullEvent{Progress: &nodev1.PullProgress{Layer: 0, Layers: 1, Fetched: 5, Total: 10, ImageTotal: 10}})
	fn(&nodev1.PullEvent{Result: n.pullResult})
	return nil
}

// TestPullJob: a pull is a job run by the node's Pull: its upload is sent
// first as a context, the node's lines reach the log and Lines, its
// progress reaches Progress, and its outcome the record: what was
// unpacked, or the error's class. The team's build limiter is not asked.
func TestPullJob(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	n := &pullNode{fakeNode: fakeNode{id: "n1"},
		pullResult: &nodev1.PullResult{TemplateId: "tpl", Digest: "sha256:ab", Layers: 1, Bytes: 10}}
	j, err := Open(context.Background(), Config{
		State: st, Server: "a",
		Node: func(context.Context) (nodeapi.Node, error) { return n, nil },
		Limiter: func(context.Context, string) (func(), error) {
			t.Error("a pull asked the build limiter")
			return func() {}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close(context.Background())
	upload := t.TempDir()
	os.WriteFile(filepath.Join(upload, "image.tar"), []byte("archive"), 0o600)

	run := func(build string) (*Record, []string, []Progress) {
		t.Helper()
		if _, err := j.Request(context.Background(), Record{TemplateID: "tpl", BuildID: build, Kind: KindPull, Team: "t", Names: []string{"app"}}); err != nil {
			t.Fatal(err)
		}
		var lines []string
		var progress []Progress
		done := make(chan *Record, 1)
		err := j.Start(context.Background(), "tpl", build, Spec{
			Contexts: map[string]string{"image": upload},
			Pull: &PullSpec{Source: FromDockerArchive, Ref: "example.test/x:1", Context: "image", PublicOnly: true,
				Progress: func(p Progress) { progress = append(progress, p) }},
			Lines: func(ls []string) { lines = append(lines, ls...) },
			Done:  func(r *Record) { done <- r },
		})
		if err != nil {
			t.Fatal(err)
		}
		return <-done, lines, progress
	}
	rec, lines, progress := run("p1")
	if rec.Status != Ready || rec.Kind != KindPull || rec.Pulled == nil || rec.Pulled.Digest != "sha256:ab" || rec.Pulled.Bytes != 10 {
		t.Fatalf("record %+v (pulled %+v)", rec, rec.Pulled)
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "queued:") || len(progress) != 1 || progress[0].Fetched != 5 || progress[0].Total != 10 {
		t.Fatalf("lines %q, progress %+v", lines, progress)
	}
	r := n.pullReq
	if r.PullId != "p1" || r.Source != nodev1.PullRequest_SOURCE_DOCKER_ARCHIVE || r.Ref != "example.test/x:1" || r.Context != "image" ||
		!r.PublicOnly || r.Template.Id != "tpl" || r.Template.Name != "app" || r.Template.Team != "t" {
		t.Fatalf("the node's request: %v", r)
	}
	if len(n.contexts["image"]) == 0 {
		t.Fatal("the upload was not sent to the node")
	}
	if es, _, _ := j.Logs(context.Background(), "p1", 0, -1); len(es) != 1 || !strings.HasPrefix(es[0].Message, "queued:") {
		t.Fatalf("the pull's log: %+v", es)
	}

	n.pullResult = &nodev1.PullResult{Error: "pulling x: image not found", ErrorClass: nodev1.PullResult_ERROR_CLASS_NOT_FOUND}
	n.contexts = nil
	rec, _, _ = run("p2")
	if rec.Status != Error || rec.Class != ClassNotFound || rec.Pulled != nil || !strings.Contains(rec.Reason.Message, "image not found") {
		t.Fatalf("failed pull's record %+v (reason %+v)", rec, rec.Reason)
	}
}
