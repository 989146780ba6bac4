package build

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse: any Dockerfile text either parses or is refused with an
// error; the parser never panics, and what it accepts has a FROM.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"FROM base\nRUN echo hi\n",
		"ARG V=1\nFROM base\nENV A=$V B=\"x y\"\nWORKDIR /w\nUSER user\nCOPY --chown=user a b /d/\nCMD [\"sh\"]\n",
		"FROM base\nRUN [\"sh\", \"-c\", \"echo \\\"q\\\"\"]\n",
		"FROM base\nRUN a \\\n  b \\\n  c\n",
		"# comment\n\nFROM base AS x\n",
		"FROM base\nADD x /x\n",
		"FROM\n",
		"RUN echo before from\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		df, err := Parse(strings.NewReader(text))
		if err == nil && (df == nil || df.From == "") {
			t.Fatalf("accepted a Dockerfile without FROM: %+v", df)
		}
	})
}

// FuzzUnpackContext: an uploaded build context, whatever its entries, is
// unpacked inside its directory or refused; nothing lands outside.
func FuzzUnpackContext(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "Dockerfile", Typeflag: tar.TypeReg, Mode: 0o644}},
		{{Name: "../x", Typeflag: tar.TypeReg}},
		{{Name: "/abs", Typeflag: tar.TypeReg}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "l/x", Typeflag: tar.TypeReg}},
		{{Name: "d", Typeflag: tar.TypeDir}, {Name: "d", Typeflag: tar.TypeReg}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			tw.WriteHeader(&h)
		}
		tw.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, archive []byte) {
		dir, err := os.MkdirTemp("", "fuzz-ctx-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		err = UnpackContext(bytes.NewReader(archive), filepath.Join(dir, "ctx"))
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "ctx" {
				t.Fatalf("unpacking wrote %s outside the context", e.Name())
			}
		}
		if err != nil && len(entries) != 0 {
			t.Fatalf("a refused context left its directory behind: %v", err)
		}
	})
}
