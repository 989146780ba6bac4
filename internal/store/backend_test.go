package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	rand.NewChaCha8(s).Read(b)
	return b
}

func put(t *testing.T, b Backend, key string, data []byte) {
	t.Helper()
	if err := b.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func get(t *testing.T, b Backend, key string) []byte {
	t.Helper()
	rc, err := b.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	return data
}

func keys(objs []ObjectInfo) []string {
	var ks []string
	for _, o := range objs {
		ks = append(ks, o.Key)
	}
	return ks
}

// TestBackendConformance holds every promise the Backend interface makes,
// for each implementation.
func TestBackendConformance(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()

		t.Run("RoundTrip", func(t *testing.T) {
			for _, n := range []int{0, 1, 4096, 5<<20 + 3} {
				key := fmt.Sprintf("rt/obj-%d", n)
				data := randomBytes(uint64(n), n)
				put(t, b, key, data)
				if got := get(t, b, key); !bytes.Equal(got, data) {
					t.Fatalf("%s: got %d bytes back, want %d (equal=false)", key, len(got), n)
				}
				fi, err := b.Stat(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Key != key || fi.Size != int64(n) {
					t.Fatalf("Stat(%s) = %+v, want key %s size %d", key, fi, key, n)
				}
				if d := time.Since(fi.ModTime); d < -time.Minute || d > time.Minute {
					t.Fatalf("Stat(%s).ModTime = %v, not near now", key, fi.ModTime)
				}
			}
		})

		t.Run("Missing", func(t *testing.T) {
			if _, err := b.Get(ctx, "missing/x"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get missing: %v, want ErrNotFound", err)
			}
			if _, err := b.Stat(ctx, "missing/x"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Stat missing: %v, want ErrNotFound", err)
			}
			if ok, err := Exists(ctx, b, "missing/x"); ok || err != nil {
				t.Fatalf("Exists missing = %v, %v", ok, err)
			}
			if err := b.Delete(ctx, "missing/x"); err != nil {
				t.Fatalf("Delete missing: %v, want nil", err)
			}
			if objs, err := b.List(ctx, "missing/"); err != nil || len(objs) != 0 {
				t.Fatalf("List missing prefix = %v, %v", objs, err)
			}
		})

		t.Run("OverwriteAndDelete", func(t *testing.T) {
			put(t, b, "ow/k", []byte("first"))
			put(t, b, "ow/k", []byte("second!"))
			if got := get(t, b, "ow/k"); string(got) != "second!" {
				t.Fatalf("after overwrite got %q", got)
			}
			if ok, err := Exists(ctx, b, "ow/k"); !ok || err != nil {
				t.Fatalf("Exists = %v, %v", ok, err)
			}
			if err := b.Delete(ctx, "ow/k"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Get(ctx, "ow/k"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get after Delete: %v", err)
			}
		})

		t.Run("List", func(t *testing.T) {
			for _, k := range []string{"ls/b/2", "ls/a", "ls/b/1", "ls/bc", "ls/b1/x", "lsx"} {
				put(t, b, k, []byte(k))
			}
			cases := map[string][]string{
				"ls/":   {"ls/a", "ls/b/1", "ls/b/2", "ls/b1/x", "ls/bc"},
				"ls/b":  {"ls/b/1", "ls/b/2", "ls/b1/x", "ls/bc"},
				"ls/b/": {"ls/b/1", "ls/b/2"},
				"ls/bc": {"ls/bc"},
				"ls/z":  nil,
			}
			for prefix, want := range cases {
				objs, err := b.List(ctx, prefix)
				if err != nil {
					t.Fatalf("List(%q): %v", prefix, err)
				}
				if got := keys(objs); strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("List(%q) = %v, want %v", prefix, got, want)
				}
				for _, o := range objs {
					if o.Size != int64(len(o.Key)) {
						t.Errorf("List(%q): %s has size %d, want %d", prefix, o.Key, o.Size, len(o.Key))
					}
				}
			}
			all, err := b.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(keys(all), ","), "lsx") {
				t.Errorf("List(\"\") = %v, lacks lsx", keys(all))
			}
		})

		t.Run("WrongSizeStoresNothing", func(t *testing.T) {
			put(t, b, "ws/k", []byte("keep me"))
			if err := b.Put(ctx, "ws/k", bytes.NewReader([]byte("short")), 10); err == nil {
				t.Fatal("Put of 5 bytes claimed as 10 succeeded")
			}
			if err := b.Put(ctx, "ws/k", bytes.NewReader([]byte("much too long")), 4); err == nil {
				t.Fatal("Put of 13 bytes claimed as 4 succeeded")
			}
			if err := b.Put(ctx, "ws/k", iotest.OneByteReader(strings.NewReader("abc")), 5); err == nil {
				t.Fatal("Put of a one-shot 3-byte reader claimed as 5 succeeded")
			}
			if got := get(t, b, "ws/k"); string(got) != "keep me" {
				t.Fatalf("after failed Puts got %q, want the old object", got)
			}
			objs, err := b.List(ctx, "ws/")
			if err != nil || len(objs) != 1 {
				t.Fatalf("List after failed Puts = %v, %v; want only ws/k", keys(objs), err)
			}
		})

		t.Run("OneShotReader", func(t *testing.T) {
			data := randomBytes(7, 300_000)
			r := iotest.HalfReader(io.MultiReader(bytes.NewReader(data[:1000]), bytes.NewReader(data[1000:])))
			if err := b.Put(ctx, "os/k", r, int64(len(data))); err != nil {
				t.Fatal(err)
			}
			if got := get(t, b, "os/k"); !bytes.Equal(got, data) {
				t.Fatal("one-shot reader round trip differs")
			}
		})

		t.Run("ReaderError", func(t *testing.T) {
			r := io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(errInjected))
			if err := b.Put(ctx, "re/k", r, 10); err == nil {
				t.Fatal("Put from a failing reader succeeded")
			}
			if _, err := b.Stat(ctx, "re/k"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("object exists after failed Put: %v", err)
			}
		})

		t.Run("InvalidKeys", func(t *testing.T) {
			for _, k := range []string{"", "/abs", "a//b", "../x", "a/../b", "a/./b", ".tmp-x", "a/.hidden", "a/"} {
				if err := b.Put(ctx, k, strings.NewReader("x"), 1); err == nil {
					t.Errorf("Put(%q) accepted", k)
				}
				if _, err := b.Get(ctx, k); err == nil || errors.Is(err, ErrNotFound) {
					t.Errorf("Get(%q) = %v, want an invalid-key error", k, err)
				}
			}
		})

		t.Run("CancelledContext", func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if err := b.Put(cctx, "cc/k", strings.NewReader("x"), 1); err == nil {
				t.Fatal("Put with a cancelled context succeeded")
			}
		})

		t.Run("ConcurrentPutsSameKey", func(t *testing.T) {
			const n = 8
			payloads := make([][]byte, n)
			for i := range payloads {
				payloads[i] = randomBytes(uint64(100+i), 256<<10)
			}
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() {
					errs[i] = b.Put(ctx, "cp/k", bytes.NewReader(payloads[i]), int64(len(payloads[i])))
				})
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			got := get(t, b, "cp/k")
			for _, p := range payloads {
				if bytes.Equal(got, p) {
					return
				}
			}
			t.Fatal("object after concurrent Puts is none of the payloads (torn write)")
		})
	})
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, u := range []string{dir, "file://" + dir} {
		b, err := Open(ctx, u, OpenOptions{})
		if err != nil {
			t.Fatalf("Open(%q): %v", u, err)
		}
		if l, ok := b.(*Local); !ok || l.root != dir {
			t.Fatalf("Open(%q) = %#v, want Local at %s", u, b, dir)
		}
	}

	for _, bad := range []string{"relative/path", "file://host/x", "file:relative", "ftp://x/y", "s3:///prefix", "s3://b/p?bogus=1", "s3://b/p?path_style=maybe"} {
		if _, err := Open(ctx, bad, OpenOptions{}); err == nil {
			t.Errorf("Open(%q) succeeded", bad)
		}
	}

	cfg, err := parseS3URLString("s3://bkt/some/prefix/?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true&access_key=AK&secret_key=SK")
	if err != nil {
		t.Fatal(err)
	}
	want := S3Config{Bucket: "bkt", Prefix: "some/prefix", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1", PathStyle: true, AccessKeyID: "AK", SecretAccessKey: "SK"}
	if cfg != want {
		t.Fatalf("parsed %+v, want %+v", cfg, want)
	}

	// The secret never shows in an error.
	_, err = Open(ctx, "s3://b/p?secret_key=hunter2&bogus=1", OpenOptions{})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v leaks the secret", err)
	}

	// A URL with test credentials reaches the real gateway; credentials
	// passed as options win over the URL's.
	u := fmt.Sprintf("s3://%s/openurl-%d?endpoint=%s&region=us-east-1&path_style=true&access_key=%s&secret_key=%s",
		testBucket, time.Now().UnixNano(), gw.endpoint, gw.access, gw.secret)
	b, err := Open(ctx, u, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	put(t, b, "hello", []byte("world"))
	if got := get(t, b, "hello"); string(got) != "world" {
		t.Fatalf("got %q", got)
	}
	wrong, err := Open(ctx, u, OpenOptions{AccessKeyID: gw.access, SecretAccessKey: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Stat(ctx, "hello"); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat with a wrong secret = %v, want an authentication error", err)
	}

	// Credentials from the environment (the default chain).
	t.Setenv("AWS_ACCESS_KEY_ID", gw.access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", gw.secret)
	envURL := fmt.Sprintf("s3://%s/%s?endpoint=%s&region=us-east-1&path_style=true",
		testBucket, strings.TrimPrefix(strings.TrimSuffix(b.String(), "/"), "s3://"+testBucket+"/"), gw.endpoint)
	eb, err := Open(ctx, envURL, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, eb, "hello"); string(got) != "world" {
		t.Fatalf("env credentials: got %q", got)
	}
}

func parseS3URLString(s string) (S3Config, error) {
	u, err := url.Parse(s)
	if err != nil {
		return S3Config{}, err
	}
	return parseS3URL(u)
}
