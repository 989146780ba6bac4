package proxy

import (
	"encoding/binary"
	"testing"
)

// FuzzConnectStream feeds the envelope follower of proxied Connect streams
// arbitrary bytes, cut at an arbitrary point: it must never panic, and
// after a whole number of well-formed envelopes it must be at a boundary
// (only there may it append its end-of-stream error).
func FuzzConnectStream(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 2, 'h', 'i'}, uint16(3), []byte("abc"))
	f.Add([]byte{0x02, 0xff, 0xff, 0xff, 0xff}, uint16(1), []byte{})
	f.Add([]byte{}, uint16(0), []byte("x"))
	f.Fuzz(func(t *testing.T, raw []byte, cut uint16, payload []byte) {
		c := &connectStream{}
		at := int(cut) % (len(raw) + 1)
		c.follow(raw[:at])
		c.follow(raw[at:])

		var env []byte
		for range 3 {
			var hdr [5]byte
			binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
			env = append(append(env, hdr[:]...), payload...)
		}
		w := &connectStream{}
		at = int(cut) % (len(env) + 1)
		w.follow(env[:at])
		w.follow(env[at:])
		if w.left != 0 || len(w.hdr) != 0 {
			t.Fatalf("after whole envelopes: left %d, header %d bytes", w.left, len(w.hdr))
		}
	})
}
