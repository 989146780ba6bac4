package egress

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzPeekName feeds what a sandbox may send as the start of a connection:
// peekName must never panic, and must keep every byte it read for replay.
func FuzzPeekName(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x05hello"))
	f.Add([]byte("\x16\x03\x01\xff\xff"))
	f.Add([]byte("POST /x HTTP/1.0\r\nHost: [::1]:80\r\nContent-Length: 99999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var seen bytes.Buffer
		br := bufio.NewReader(teeConn{bytes.NewReader(data), &seen})
		peekName(br, &seen)
		if !bytes.HasPrefix(data, seen.Bytes()) {
			t.Fatalf("kept %q, which is not what was sent (%q)", seen.Bytes(), data)
		}
	})
}
