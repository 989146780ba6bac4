package sealed

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

func mustKeyring(t *testing.T, keys ...Key) *Keyring {
	t.Helper()
	kr, err := NewKeyring(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestSealOpen(t *testing.T) {
	k := NewKey()
	kr := mustKeyring(t, k)
	v := kr.Seal("s3cret-token", "sandboxes/a/envdAccessToken")
	if strings.Contains(v, "s3cret") || !IsSealed(v) || KeyOf(v) != k.ID {
		t.Fatalf("sealed value %q: want it opaque, sealed, naming key %s", v, k.ID)
	}
	if again := kr.Seal("s3cret-token", "sandboxes/a/envdAccessToken"); again == v {
		t.Fatal("two seals of one secret are equal: the nonce is not fresh")
	}
	got, err := kr.Open(v, "sandboxes/a/envdAccessToken")
	if err != nil || got != "s3cret-token" {
		t.Fatalf("open: %q %v", got, err)
	}
	// Bound to its place: another record's field does not take it.
	if _, err := kr.Open(v, "sandboxes/b/envdAccessToken"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("opened for another place: %v, want ErrCorrupt", err)
	}
	// Changed by one character, it does not open.
	i := len(v) - 3
	flipped := v[:i] + string("AB"[boolInt(v[i] == 'A')]) + v[i+1:]
	if _, err := kr.Open(flipped, "sandboxes/a/envdAccessToken"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a changed value opened: %v", err)
	}
	// Empty stays empty; plain (from before sealing) passes through.
	if kr.Seal("", "x") != "" {
		t.Fatal("an empty secret got a ciphertext")
	}
	if got, err := kr.Open("plain-old", "x"); err != nil || got != "plain-old" {
		t.Fatalf("plain value: %q %v", got, err)
	}
	// Another cluster's key does not open it.
	if _, err := mustKeyring(t, NewKey()).Open(v, "sandboxes/a/envdAccessToken"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("another key: %v, want ErrUnknownKey", err)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRotation: a keyring with a new key first seals with it and still
// opens what the old key sealed.
func TestRotation(t *testing.T) {
	old, next := NewKey(), NewKey()
	before := mustKeyring(t, old).Seal("v", "p")
	kr := mustKeyring(t, next, old)
	if got, err := kr.Open(before, "p"); err != nil || got != "v" {
		t.Fatalf("old value after rotation: %q %v", got, err)
	}
	if after := kr.Seal("v", "p"); KeyOf(after) != next.ID {
		t.Fatalf("sealed with %s, want the new key %s", KeyOf(after), next.ID)
	}
	if back, err := ParseKeys(kr.Text()); err != nil || len(back) != 2 || back[0].ID != next.ID || back[1].ID != old.ID {
		t.Fatalf("Text round trip: %v %v", back, err)
	}
	if ids := kr.IDs(); len(ids) != 2 || ids[0] != next.ID || kr.Current() != next.ID {
		t.Fatalf("ids %v current %s", ids, kr.Current())
	}
}

// TestReload: a value sealed with a key this keyring lacks makes it ask
// for the keys again (another process rotated them), then seal with the
// new one.
func TestReload(t *testing.T) {
	old, next := NewKey(), NewKey()
	var mu sync.Mutex
	file := []Key{old}
	kr, err := NewKeyring(file, func() ([]Key, error) {
		mu.Lock()
		defer mu.Unlock()
		return file, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	v := mustKeyring(t, next).Seal("v", "p")
	mu.Lock()
	file = []Key{next, old}
	mu.Unlock()
	if got, err := kr.Open(v, "p"); err != nil || got != "v" {
		t.Fatalf("after the file changed: %q %v", got, err)
	}
	if kr.Current() != next.ID {
		t.Fatalf("seals with %s after the reload, want %s", kr.Current(), next.ID)
	}
}

func TestParseKeys(t *testing.T) {
	a, b := NewKey(), NewKey()
	keys, err := ParseKeys("# data keys\n" + FormatKeys([]Key{a, b}) + "\n")
	if err != nil || len(keys) != 2 || keys[0].ID != a.ID || keys[1].ID != b.ID {
		t.Fatalf("parse: %v %v", keys, err)
	}
	if keys, err := ParseKeys(a.String() + "," + b.String()); err != nil || len(keys) != 2 {
		t.Fatalf("comma-separated: %v %v", keys, err)
	}
	for _, bad := range []string{"", "# nothing", "aenvdk1_short", "nope"} {
		if _, err := ParseKeys(bad); err == nil {
			t.Fatalf("ParseKeys(%q) accepted it", bad)
		}
	}
	if strings.Contains(func() string { _, err := ParseKeys(a.String() + "x"); return err.Error() }(), a.String()[10:]) {
		t.Fatal("a parse error repeats the key")
	}
}

func TestNilKeyring(t *testing.T) {
	var kr *Keyring
	if kr.Seal("v", "p") != "v" {
		t.Fatal("a nil keyring changed the value")
	}
	if _, err := kr.Open(mustKeyring(t, NewKey()).Seal("v", "p"), "p"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("a nil keyring opening a sealed value: %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	kr := mustKeyring(t, NewKey())
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				v := kr.Seal("secret", "p")
				if got, err := kr.Open(v, "p"); err != nil || got != "secret" {
					t.Errorf("goroutine %d: %q %v", i, got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
