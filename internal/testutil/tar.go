package testutil

import (
	"archive/tar"
	"bytes"
	"fmt"
	"strconv"
	"testing"
)

// SparseTar is a tar archive of one file, name, that says it is size
// bytes long, all of it a hole (a PAX sparse file, GNU format 0.1): the
// archive takes 2.5 KiB whatever size is, and a reader that writes the
// holes out writes size bytes. archive/tar reads such files but cannot
// write them, so the PAX header is made by hand.
func SparseTar(t testing.TB, name string, size int64) []byte {
	t.Helper()
	var records string
	for _, kv := range [][2]string{
		{"GNU.sparse.major", "0"}, {"GNU.sparse.minor", "1"}, {"GNU.sparse.name", name},
		{"GNU.sparse.size", strconv.FormatInt(size, 10)}, {"GNU.sparse.numblocks", "0"}, {"GNU.sparse.map", ""},
	} {
		records += paxRecord(kv[0], kv[1])
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// The extended header goes in as a file's header and content, and is
	// retyped below: the writer refuses to write one itself.
	if err := tw.WriteHeader(&tar.Header{Name: "PaxHeaders/" + name, Typeflag: tar.TypeReg, Mode: 0o644,
		Size: int64(len(records)), Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(records)); err != nil {
		t.Fatal(err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatUSTAR}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	b[156] = tar.TypeXHeader
	// The header's checksum is the sum of its bytes, its own field
	// counted as spaces.
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b[:512] {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// paxRecord is one PAX record, "<length> key=value\n", its length
// counting its own digits.
func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	n := len(rest)
	for {
		rec := strconv.Itoa(n) + rest
		if len(rec) == n {
			return rec
		}
		n = len(rec)
	}
}
