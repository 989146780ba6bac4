//go:build aenv_runsc_main

package main

import "testing"

func TestIsSentry(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--root=/run/x", "--platform=systrap", "boot", "--bundle=/b", "id"}, true},
		{[]string{"--root=/run/x", "gofer", "--bundle=/b"}, false},
		{[]string{"--root=/run/x", "create", "--bundle", "/b", "boot"}, false},
		{[]string{"--version"}, false},
		{nil, false},
	} {
		if got := isSentry(tt.args); got != tt.want {
			t.Errorf("isSentry(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}
