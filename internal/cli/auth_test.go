package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// isolateConfig points HOME at a fresh directory and clears every
// variable that could name a server or key.
func isolateConfig(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"XDG_CONFIG_HOME", "AENV_API_URL", "AENV_API_KEY", "E2B_API_URL", "E2B_API_KEY"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	return home
}

func TestAuth(t *testing.T) {
	e := startServer(t)
	home := isolateConfig(t)
	path := filepath.Join(home, ".config", "aenv", "credentials")

	// A wrong key is refused and nothing is stored.
	r := (*testEnv)(nil).run(t, "", "auth", "--url", e.url, "--key", "e2b_0000wrong")
	oneErrorLine(t, r, "wrong key")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refused key was stored: %v", err)
	}
	// An unreachable server is not stored either.
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "auth", "--url", "http://127.0.0.1:1", "--key", e.key), "cannot reach")
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "auth", "--url", "localhost:8000", "--key", e.key), "invalid server URL")

	r = (*testEnv)(nil).run(t, "", "auth", "--url", e.url+"/", "--key", e.key)
	if r.code != 0 {
		t.Fatalf("auth: exit %d stderr %q", r.code, r.stderr)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials mode %v, want 0600", fi.Mode().Perm())
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("credentials directory: %v %v, want mode 0700", di.Mode().Perm(), err)
	}
	var stored credentials
	b, _ := os.ReadFile(path)
	if err := json.Unmarshal(b, &stored); err != nil || stored.URL != e.url || stored.Key != e.key {
		t.Fatalf("stored %q (%v), want url %s and the key", b, err, e.url)
	}

	// Other commands now need neither flag.
	if r := (*testEnv)(nil).run(t, "", "ls"); r.code != 0 {
		t.Fatalf("ls with stored credentials: exit %d stderr %q", r.code, r.stderr)
	}
	// The environment beats the file.
	t.Setenv("AENV_API_KEY", "e2b_0000wrong")
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "ls"), "401")
	os.Unsetenv("AENV_API_KEY")

	// Without a terminal, the key is read from stdin.
	os.Remove(path)
	r = (*testEnv)(nil).run(t, e.key+"\n", "auth", "--url", e.url)
	if r.code != 0 {
		t.Fatalf("auth with the key on stdin: exit %d stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "auth", "--url", e.url), "no API key")
}

// TestResolveServer checks the precedence of flags, environment, the
// credentials file and the local key file, without a server.
func TestResolveServer(t *testing.T) {
	home := isolateConfig(t)
	keyFile := filepath.Join(home, "api-key")
	if err := os.WriteFile(keyFile, []byte("e2b_local\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(g globals) string {
		t.Helper()
		g.keyFile = keyFile
		url, key, err := g.resolveServer()
		if err != nil {
			return "error: " + err.Error()
		}
		return url + " " + key
	}
	check := func(name, got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: got %q, want %q", name, got, want)
		}
	}
	check("nothing", resolve(globals{}), "http://localhost:8000 e2b_local")

	if _, err := saveCredentials(credentials{URL: "http://stored:8000", Key: "e2b_stored"}); err != nil {
		t.Fatal(err)
	}
	check("file", resolve(globals{}), "http://stored:8000 e2b_stored")
	check("file, same url flag", resolve(globals{url: "http://stored:8000/"}), "http://stored:8000/ e2b_stored")
	// The stored key does not follow a URL pointing elsewhere.
	check("file, other url", resolve(globals{url: "http://other:8000"}), "http://other:8000 e2b_local")

	t.Setenv("E2B_API_URL", "http://e2b:1")
	t.Setenv("E2B_API_KEY", "e2b_e2b")
	check("E2B env", resolve(globals{}), "http://e2b:1 e2b_e2b")
	t.Setenv("AENV_API_URL", "http://aenv:2")
	t.Setenv("AENV_API_KEY", "e2b_aenv")
	check("AENV env", resolve(globals{}), "http://aenv:2 e2b_aenv")
	check("flags", resolve(globals{url: "http://flag:3", key: "e2b_flag"}), "http://flag:3 e2b_flag")

	os.Unsetenv("AENV_API_KEY")
	os.Unsetenv("E2B_API_KEY")
	os.Remove(keyFile)
	got := resolve(globals{url: "http://nowhere:9"})
	if !strings.HasPrefix(got, "error: no API key for http://nowhere:9") {
		t.Fatalf("no key anywhere: %q", got)
	}

	if err := os.WriteFile(filepath.Join(home, ".config", "aenv", "credentials"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := resolve(globals{}); !strings.Contains(got, "reading credentials") {
		t.Fatalf("a corrupt credentials file: %q", got)
	}
}
