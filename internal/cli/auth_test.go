package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// isolateConfig points HOME at a fresh directory and clears every
// variable that could name a server or key.
func isolateConfig(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, v := range []string{"XDG_CONFIG_HOME", "AENV_API_URL", "AENV_API_KEY", "E2B_API_URL", "E2B_API_KEY", "AENV_CA_FILE"} {
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
	wrong := filepath.Join(home, "wrong-key")
	if err := os.WriteFile(wrong, []byte("e2b_0000wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := (*testEnv)(nil).run(t, "", "auth", "--url", e.url, "--key-file", wrong)
	oneErrorLine(t, r, "wrong key")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a refused key was stored: %v", err)
	}
	// An unreachable server is not stored either.
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "auth", "--url", "http://127.0.0.1:1", "--key-file", e.keyFile), "cannot reach")
	oneErrorLine(t, (*testEnv)(nil).run(t, "", "auth", "--url", "localhost:8000", "--key-file", e.keyFile), "invalid server URL")

	r = (*testEnv)(nil).run(t, "", "auth", "--url", e.url+"/", "--key-file", e.keyFile)
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
		g.localKeyFile = keyFile
		srv, err := g.resolveServer()
		if err != nil {
			return "error: " + err.Error()
		}
		return srv.url + " " + srv.key + " " + caSubject(srv.ca)
	}
	check := func(name, got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: got %q, want %q", name, got, want)
		}
	}
	check("nothing", resolve(globals{}), "http://localhost:8000 e2b_local -")

	storedCA, otherCA := testCA(t, "stored"), testCA(t, "flag")
	if _, err := saveCredentials(credentials{URL: "https://stored:8000", Key: "e2b_stored", CA: string(storedCA)}); err != nil {
		t.Fatal(err)
	}
	check("file", resolve(globals{}), "https://stored:8000 e2b_stored stored")
	check("file, same url flag", resolve(globals{url: "https://stored:8000/"}), "https://stored:8000/ e2b_stored stored")
	// The stored key and CA do not follow a URL pointing elsewhere.
	check("file, other url", resolve(globals{url: "http://other:8000"}), "http://other:8000 e2b_local -")

	t.Setenv("E2B_API_URL", "http://e2b:1")
	t.Setenv("E2B_API_KEY", "e2b_e2b")
	check("E2B env", resolve(globals{}), "http://e2b:1 e2b_e2b -")
	t.Setenv("AENV_API_URL", "http://aenv:2")
	t.Setenv("AENV_API_KEY", "e2b_aenv")
	check("AENV env", resolve(globals{}), "http://aenv:2 e2b_aenv -")
	flagKey := filepath.Join(home, "flag-key")
	flagCA := filepath.Join(home, "flag-ca.crt")
	if err := os.WriteFile(flagKey, []byte("e2b_flag\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(flagCA, otherCA, 0o600); err != nil {
		t.Fatal(err)
	}
	check("flags", resolve(globals{url: "http://flag:3", keyFile: flagKey, caFile: flagCA}), "http://flag:3 e2b_flag flag")
	t.Setenv("AENV_CA_FILE", flagCA)
	check("CA from the environment", resolve(globals{}), "http://aenv:2 e2b_aenv flag")
	os.Unsetenv("AENV_CA_FILE")
	check("missing key file", resolve(globals{keyFile: filepath.Join(home, "none")}), "error: reading --key-file: open "+filepath.Join(home, "none")+": no such file or directory")

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

// testCA is a self-signed CA certificate (PEM) named cn.
func testCA(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// caSubject is the CommonName of the PEM certificate in b, "-" for none.
func caSubject(b []byte) string {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "-"
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "bad: " + err.Error()
	}
	return c.Subject.CommonName
}
