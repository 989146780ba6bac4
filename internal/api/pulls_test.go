package api_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// pullingNode answers Pull as a node does: a queued line, a layer's
// progress, then result; it keeps the request and the uploads it got.
type pullingNode struct {
	nodeapi.Node // only ID, Pull and PutBuildContext are called
	result       *nodev1.PullResult

	mu       sync.Mutex
	req      *nodev1.PullRequest
	contexts map[string][]byte
}

func (*pullingNode) ID() string { return "puller" }

func (n *pullingNode) PutBuildContext(_ context.Context, r *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.contexts[r.BuildId+"/"+r.Name] = append(n.contexts[r.BuildId+"/"+r.Name], r.Data...)
	return &nodev1.PutBuildContextResponse{}, nil
}

func (n *pullingNode) Pull(_ context.Context, r *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error {
	n.mu.Lock()
	n.req = r
	res := n.result
	n.mu.Unlock()
	fn(&nodev1.PullEvent{Lines: []string{"queued: 1 pulls run at once on this node"}})
	fn(&nodev1.PullEvent{Progress: &nodev1.PullProgress{Layer: 0, Layers: 1, Fetched: 7, Total: 7, Unpacked: true, ImageFetched: 7, ImageTotal: 7}})
	fn(&nodev1.PullEvent{Result: res})
	return nil
}

// request is the last pull the node got; set changes its next result.
func (n *pullingNode) request() *nodev1.PullRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.req
}

func (n *pullingNode) set(res *nodev1.PullResult) {
	n.mu.Lock()
	n.result = res
	n.mu.Unlock()
}

// events reads a pull's NDJSON stream to its end.
func events(t *testing.T, body string) []map[string]json.RawMessage {
	t.Helper()
	var out []map[string]json.RawMessage
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		out = append(out, ev)
	}
	return out
}

// uploaded is what the node got of pull r's upload, as files.
func (n *pullingNode) uploaded(t *testing.T) map[string]string {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	files := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(n.contexts[n.req.PullId+"/"+n.req.Context]))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("the upload sent to the node: %v", err)
		}
		b, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = string(b)
		}
	}
}

// TestPullRunsOnANode: a pull is handed to a node with what the caller
// asked (the team's template, its resources, the registry or the upload,
// insecure, and public-only for a client's registry pull), and the node's
// log lines, progress and outcome stream back to the client as before;
// a failure's class gives the error event its status.
func TestPullRunsOnANode(t *testing.T) {
	n := &pullingNode{contexts: map[string][]byte{},
		result: &nodev1.PullResult{TemplateId: "x", Digest: "sha256:feed", Layers: 1, Bytes: 7}}
	url, client := trustServer(t, api.Config{Builds: api.NewTestJobs(t, n)})

	code, body := post(t, url+"/templates/pulls?name=app&ref=8.8.8.8/x/y:1&cpuCount=3&memoryMB=256&startCmd=serve", client, nil)
	if code != http.StatusOK {
		t.Fatalf("client registry pull: %d %s", code, body)
	}
	evs := events(t, body)
	if len(evs) != 3 || !strings.Contains(string(evs[0]["log"]), "queued: 1 pulls") ||
		!strings.Contains(string(evs[1]["progress"]), `"fetched":7`) || evs[2]["done"] == nil {
		t.Fatalf("the pull's events: %s", body)
	}
	var done struct {
		TemplateID, Digest string
		Layers             int
		Bytes              int64
	}
	json.Unmarshal(evs[2]["done"], &done)
	r := n.request()
	if !strings.HasPrefix(done.TemplateID, "app.") || done.TemplateID != r.Template.Id || done.Digest != "sha256:feed" || done.Layers != 1 || done.Bytes != 7 {
		t.Fatalf("done %+v for the node's template %v", done, r.Template)
	}
	if r.Source != nodev1.PullRequest_SOURCE_REGISTRY || r.Ref != "8.8.8.8/x/y:1" || !r.PublicOnly || r.Insecure ||
		r.Template.Name != "app" || r.Template.Team == "" || r.Template.CpuCount != 3 || r.Template.MemoryMb != 256 || r.Template.StartCmd != "serve" {
		t.Fatalf("the node's request: %v", r)
	}

	// The admin's pull may reach private registries, insecurely.
	if code, body := post(t, url+"/templates/pulls?name=adm&ref=10.0.0.8/x:1&insecure=true", "admin", nil); code != http.StatusOK || !strings.Contains(body, `"done"`) {
		t.Fatalf("admin pull: %d %s", code, body)
	}
	if r := n.request(); r.PublicOnly || !r.Insecure || r.Ref != "10.0.0.8/x:1" {
		t.Fatalf("the admin pull's request: %v", r)
	}

	// An upload travels to the node as a context; a docker archive as
	// image.tar in it. The node's failure keeps its status.
	n.set(&nodev1.PullResult{Error: "pulling: image not found", ErrorClass: nodev1.PullResult_ERROR_CLASS_NOT_FOUND})
	code, body = post(t, url+"/templates/pulls?name=arch&source=docker-archive&ref=example.test/x:2", client, []byte("a docker save tarball"))
	if evs := events(t, body); code != http.StatusOK || len(evs) == 0 || !strings.Contains(string(evs[len(evs)-1]["error"]), `"code":404`) {
		t.Fatalf("archive pull: %d %s", code, body)
	}
	r = n.request()
	if r.Source != nodev1.PullRequest_SOURCE_DOCKER_ARCHIVE || r.Ref != "example.test/x:2" || r.PublicOnly || r.Context == "" {
		t.Fatalf("the archive pull's request: %v", r)
	}
	if files := n.uploaded(t); files["image.tar"] != "a docker save tarball" {
		t.Fatalf("the node got the upload as %q", files)
	}

	n.set(&nodev1.PullResult{Error: "too big", ErrorClass: nodev1.PullResult_ERROR_CLASS_TOO_LARGE})
	layout := tarFiles(t, map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": "{}"})
	code, body = post(t, url+"/templates/pulls?name=lay&source=oci", client, layout)
	if code != http.StatusOK || !strings.Contains(body, `"code":413`) {
		t.Fatalf("layout pull: %d %s", code, body)
	}
	if files := n.uploaded(t); n.request().Source != nodev1.PullRequest_SOURCE_OCI || files["oci-layout"] == "" || files["index.json"] != "{}" {
		t.Fatalf("the layout pull: %v, files %q", n.request(), files)
	}
}
