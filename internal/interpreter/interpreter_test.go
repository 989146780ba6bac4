package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// newTestServer starts the service over this host's IPython (installed
// with python3-ipykernel by `make deps`): real kernels.
func newTestServer(t *testing.T) *httptest.Server {
	t.Helper()
	if out, err := exec.Command(DefaultPython, "-c", "import IPython, matplotlib_inline").CombinedOutput(); err != nil {
		t.Fatalf("these tests need python3-ipykernel and python3-matplotlib (make deps): %v: %s", err, out)
	}
	s := New(Config{Cwd: t.TempDir(), Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts
}

type execution struct {
	events  []map[string]any
	stdout  string
	results []map[string]any
	err     map[string]any
	count   float64
	ended   bool
}

func run(t *testing.T, ts *httptest.Server, body map[string]any) execution {
	t.Helper()
	return runCtx(t, context.Background(), ts, body)
}

func runCtx(t *testing.T, ctx context.Context, ts *httptest.Server, body map[string]any) execution {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", bytes.NewReader(b))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("execute: %s", res.Status)
	}
	var e execution
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("a line that is not JSON: %q", sc.Text())
		}
		e.events = append(e.events, ev)
		switch ev["type"] {
		case "stdout":
			e.stdout += ev["text"].(string)
		case "result":
			e.results = append(e.results, ev)
		case "error":
			e.err = ev
		case "number_of_executions":
			e.count = ev["execution_count"].(float64)
		case "end_of_execution":
			e.ended = true
		}
	}
	return e
}

// streamed runs code and returns its stdout, when (since the request)
// the stdout first held mark, and when the execution's end came.
func streamed(t *testing.T, ts *httptest.Server, code, mark string) (stdout string, markAt, endAt time.Duration) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"code": code})
	start := time.Now()
	res, err := http.Post(ts.URL+"/execute", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var ev map[string]any
		json.Unmarshal(sc.Bytes(), &ev)
		switch ev["type"] {
		case "stdout":
			stdout += ev["text"].(string)
			if markAt == 0 && strings.Contains(stdout, mark) {
				markAt = time.Since(start)
			}
		case "end_of_execution":
			endAt = time.Since(start)
		}
	}
	return stdout, markAt, endAt
}

func call(t *testing.T, ts *httptest.Server, method, path string, body any) (int, []byte) {
	t.Helper()
	var r *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	} else {
		r = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, ts.URL+path, r)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(res.Body)
	return res.StatusCode, buf.Bytes()
}

func TestPython(t *testing.T) {
	ts := newTestServer(t)

	t.Run("state persists and the last expression is the main result", func(t *testing.T) {
		run(t, ts, map[string]any{"code": "x = 41"})
		e := run(t, ts, map[string]any{"code": "x + 1"})
		if len(e.results) != 1 || e.results[0]["text"] != "42" || e.results[0]["is_main_result"] != true {
			t.Fatalf("results %v", e.results)
		}
		if !e.ended || e.count < 2 {
			t.Fatalf("ended %v, count %v", e.ended, e.count)
		}
	})

	t.Run("stdout streams before the end", func(t *testing.T) {
		_, firstAt, endAt := streamed(t, ts, "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')", "first")
		if firstAt == 0 || endAt-firstAt < time.Second {
			t.Fatalf("first line at %v, end at %v: output was not streamed", firstAt, endAt)
		}
	})

	t.Run("a loop's lines arrive whole, in order, batched", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "for i in range(20000):\n    print(i)"})
		var want strings.Builder
		for i := range 20000 {
			fmt.Fprintln(&want, i)
		}
		if e.stdout != want.String() {
			t.Fatalf("stdout: %d bytes, want the %d of 20000 lines in order", len(e.stdout), want.Len())
		}
		n := 0
		for _, ev := range e.events {
			if ev["type"] == "stdout" {
				n++
			}
		}
		if n >= 20000 {
			t.Errorf("%d stdout events for 20000 lines printed in a loop: not batched", n)
		}
	})

	t.Run("a line held back by the batching still comes before a long pause ends", func(t *testing.T) {
		got, bAt, endAt := streamed(t, ts, "import time\nprint('a')\nprint('b')\ntime.sleep(2)", "b")
		if got != "a\nb\n" || bAt == 0 || endAt-bAt < time.Second {
			t.Fatalf("stdout %q, second line at %v, end at %v: want both lines a second or more before the end", got, bAt, endAt)
		}
	})

	t.Run("programs the code starts write to its stdout; input() reads nothing", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "import os\nos.system('echo from a child')\ntry:\n    input()\nexcept EOFError:\n    print('no stdin')"})
		if !strings.Contains(e.stdout, "from a child\n") || !strings.Contains(e.stdout, "no stdin\n") || e.err != nil {
			t.Fatalf("stdout %q, error %v", e.stdout, e.err)
		}
		// A NUL is output like any byte (the end-of-execution marker
		// starts with two).
		e = run(t, ts, map[string]any{"code": "import os\nos.system(\"printf 'a\\\\0b\\\\n'\")"})
		if e.stdout != "a\x00b\n" {
			t.Fatalf("a child's NUL byte: stdout %q", e.stdout)
		}
		e = run(t, ts, map[string]any{"code": "40 + 2"})
		if len(e.results) != 1 || e.results[0]["text"] != "42" {
			t.Fatalf("the kernel after a child's output and input(): results %v error %v", e.results, e.err)
		}
	})

	t.Run("an exception has its name, value and traceback", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "def f():\n    return 1/0\nf()"})
		if e.err == nil || e.err["name"] != "ZeroDivisionError" || !strings.Contains(e.err["value"].(string), "division by zero") {
			t.Fatalf("error %v", e.err)
		}
		tb := e.err["traceback"].(string)
		if !strings.Contains(tb, "return 1/0") || strings.Contains(tb, "\x1b[") {
			t.Fatalf("traceback %q: want the failing line, without terminal colours", tb)
		}
	})

	t.Run("a matplotlib figure is a PNG and a chart", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 7], label='up')\nplt.title('growth')\nplt.show()"})
		if len(e.results) != 1 {
			t.Fatalf("results %v, error %v", e.results, e.err)
		}
		png, err := base64.StdEncoding.DecodeString(e.results[0]["png"].(string))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
			t.Fatalf("png: %v", err)
		}
		chart, _ := e.results[0]["chart"].(map[string]any)
		if chart["type"] != "line" || chart["title"] != "growth" {
			t.Fatalf("chart %v", chart)
		}
		el := chart["elements"].([]any)[0].(map[string]any)
		if el["label"] != "up" || len(el["points"].([]any)) != 3 {
			t.Fatalf("chart element %v", el)
		}
	})

	t.Run("env_vars apply to one execution only", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "import os\nos.environ.get('AENV_T')", "env_vars": map[string]string{"AENV_T": "it's \"set\""}})
		if len(e.results) != 1 || e.results[0]["text"] != `'it\'s "set"'` {
			t.Fatalf("results %v error %v", e.results, e.err)
		}
		e = run(t, ts, map[string]any{"code": "import os\nos.environ.get('AENV_T', 'gone')"})
		if len(e.results) != 1 || e.results[0]["text"] != "'gone'" {
			t.Fatalf("after: results %v", e.results)
		}
	})

	t.Run("a request that times out interrupts the kernel", func(t *testing.T) {
		run(t, ts, map[string]any{"code": "y = 'kept'"})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		b, _ := json.Marshal(map[string]any{"code": "import time\nwhile True: time.sleep(0.1)"})
		req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", bytes.NewReader(b))
		if res, err := http.DefaultClient.Do(req); err == nil {
			var buf bytes.Buffer
			buf.ReadFrom(res.Body)
			res.Body.Close()
		}
		e := run(t, ts, map[string]any{"code": "y"})
		if len(e.results) != 1 || e.results[0]["text"] != "'kept'" {
			t.Fatalf("after the interrupt: results %v error %v", e.results, e.err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("the kernel took %v to come back after the interrupt", took)
		}
	})

	t.Run("an unknown language is an UnsupportedLanguage error", func(t *testing.T) {
		e := run(t, ts, map[string]any{"code": "1", "language": "cobol"})
		if e.err == nil || e.err["name"] != "UnsupportedLanguage" {
			t.Fatalf("error %v", e.err)
		}
		status, body := call(t, ts, "POST", "/contexts", map[string]any{"language": "cobol"})
		if status != 400 || !strings.Contains(string(body), "cobol") {
			t.Fatalf("create context: %d %s", status, body)
		}
	})
}

func TestContexts(t *testing.T) {
	ts := newTestServer(t)
	dir := t.TempDir()
	status, body := call(t, ts, "POST", "/contexts", map[string]any{"language": "python", "cwd": dir})
	if status != 200 {
		t.Fatalf("create: %d %s", status, body)
	}
	var c struct{ ID, Language, Cwd string }
	json.Unmarshal(body, &c)
	if c.ID == "" || c.Language != "python" || c.Cwd != dir {
		t.Fatalf("context %s", body)
	}
	if e := run(t, ts, map[string]any{"code": "import os\nos.getcwd()", "context_id": c.ID}); len(e.results) != 1 || e.results[0]["text"] != "'"+dir+"'" {
		t.Fatalf("cwd: %v", e.results)
	}
	run(t, ts, map[string]any{"code": "z = 1", "context_id": c.ID})
	if e := run(t, ts, map[string]any{"code": "z"}); e.err == nil || e.err["name"] != "NameError" {
		t.Fatalf("the default context sees another context's variable: %v", e.results)
	}
	_, body = call(t, ts, "GET", "/contexts", nil)
	if !strings.Contains(string(body), c.ID) {
		t.Fatalf("list: %s", body)
	}
	if status, body := call(t, ts, "POST", "/contexts/"+c.ID+"/restart", nil); status != 204 {
		t.Fatalf("restart: %d %s", status, body)
	}
	if e := run(t, ts, map[string]any{"code": "z", "context_id": c.ID}); e.err == nil || e.err["name"] != "NameError" {
		t.Fatalf("state survived a restart: %v", e.results)
	}
	if status, _ := call(t, ts, "DELETE", "/contexts/"+c.ID, nil); status != 204 {
		t.Fatalf("delete: %d", status)
	}
	if status, _ := call(t, ts, "DELETE", "/contexts/"+c.ID, nil); status != 404 {
		t.Fatalf("second delete: %d", status)
	}
	if status, body := call(t, ts, "POST", "/contexts", map[string]any{"cwd": "/no/such/dir"}); status != 400 {
		t.Fatalf("bad cwd: %d %s", status, body)
	}

	t.Run("bash keeps its state between executions", func(t *testing.T) {
		status, body := call(t, ts, "POST", "/contexts", map[string]any{"language": "bash", "cwd": dir})
		if status != 200 {
			t.Fatalf("create: %d %s", status, body)
		}
		var b struct{ ID string }
		json.Unmarshal(body, &b)
		run(t, ts, map[string]any{"code": "export GREETING=hi; cd /; mkdir -p /tmp", "context_id": b.ID})
		e := run(t, ts, map[string]any{"code": "printf '%s from %s' \"$GREETING\" \"$PWD\"; echo; echo $AENV_X", "context_id": b.ID,
			"env_vars": map[string]string{"AENV_X": "x'y"}})
		if e.stdout != "hi from /\nx'y\n" || e.err != nil {
			t.Fatalf("stdout %q error %v", e.stdout, e.err)
		}
		e = run(t, ts, map[string]any{"code": "echo ${AENV_X-unset}; false", "context_id": b.ID})
		if e.stdout != "unset\n" || e.err == nil || e.err["value"] != "exit status 1" {
			t.Fatalf("stdout %q error %v", e.stdout, e.err)
		}
		e = run(t, ts, map[string]any{"code": "exit 3", "context_id": b.ID})
		if e.err == nil {
			t.Fatalf("an exiting shell was not reported")
		}
		if e = run(t, ts, map[string]any{"code": "echo back", "context_id": b.ID}); e.stdout != "back\n" {
			t.Fatalf("after exit: %q %v", e.stdout, e.err)
		}
	})
}
