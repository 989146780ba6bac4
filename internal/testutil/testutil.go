// Package testutil holds helpers shared by the tests of every package: the
// rule that privileged tests skip on a laptop but fail in CI lives here so
// that each package applies it the same way. Only _test.go files import it.
package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// privilegedRequired reports whether missing prerequisites must fail the test
// instead of skipping it. CI sets AENV_REQUIRE_PRIVILEGED=1 so that a test
// that needs root or runsc can never silently stop running there.
func privilegedRequired() bool { return os.Getenv("AENV_REQUIRE_PRIVILEGED") == "1" }

// Unavailable skips the test with reason, or fails it when CI demands that
// every privileged test runs.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if privilegedRequired() {
		t.Fatalf("prerequisite missing (AENV_REQUIRE_PRIVILEGED=1): %s", reason)
	}
	t.Skipf("skipping: %s (set AENV_REQUIRE_PRIVILEGED=1 to make this a failure)", reason)
}

// RequireRoot skips (or fails in CI) unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "test needs root")
	}
}

// RequireBinary returns the path of the named program, skipping (or failing
// in CI) when it is not installed. envVar, if set in the environment,
// names the program's path explicitly.
func RequireBinary(t testing.TB, name, envVar string) string {
	t.Helper()
	if envVar != "" {
		if p := os.Getenv(envVar); p != "" {
			if _, err := os.Stat(p); err != nil {
				Unavailable(t, envVar+"="+p+": "+err.Error())
			}
			return p
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, name+" not found in PATH")
	}
	return p
}
