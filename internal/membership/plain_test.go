package membership

import (
	"errors"
	"testing"
)

func TestCheckPlain(t *testing.T) {
	for _, c := range []struct {
		target string
		local  bool
	}{
		{"127.0.0.1:8100", true},
		{"127.5.0.1:8100", true},
		{"[::1]:8100", true},
		{"localhost:8000", true},
		{"http://127.0.0.1:2379", true},
		{"http://localhost:2379", true},
		{"unix:///run/aenv/etcd.sock", true},
		{":8100", false},
		{"0.0.0.0:8100", false},
		{"10.0.0.5:8100", false},
		{"http://10.0.0.5:2379", false},
		{"http://etcd.example:2379", false},
		{"[2001:db8::1]:8100", false},
		{"node1:8100", false},
	} {
		err := CheckPlain("the node API", c.target, "use TLS", false)
		if got := err == nil; got != c.local {
			t.Errorf("CheckPlain(%q) = %v, want allowed=%v", c.target, err, c.local)
		}
		if err != nil && !errors.Is(err, ErrPlainRefused) {
			t.Errorf("CheckPlain(%q): %v is not ErrPlainRefused", c.target, err)
		}
		if err := CheckPlain("the node API", c.target, "use TLS", true); err != nil {
			t.Errorf("CheckPlain(%q, insecure) = %v", c.target, err)
		}
	}
}
