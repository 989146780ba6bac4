package node

import (
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
	var short ring[int]
	short.add(1, 4)
	if got := short.all(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("ring holds %v; want [1]", got)
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
	}, "\n")
	got := envdEvents(strings.NewReader(log))
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
