package volume

import (
	"testing"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
)

// TestBoundsMatchTheWire: the API checks sizes and ids with the node
// API's bounds and ids.Valid, without linking this package; they must be
// this package's.
func TestBoundsMatchTheWire(t *testing.T) {
	if MinSize != nodeapi.MinVolumeSize || MaxSize != nodeapi.MaxVolumeSize {
		t.Fatalf("volume sizes %d..%d, the node API's %d..%d", MinSize, MaxSize, nodeapi.MinVolumeSize, nodeapi.MaxVolumeSize)
	}
	for _, id := range []string{"a", "abc123", "", "ABC", "a-b", "a/b", ids.New(), string(make([]byte, 65))} {
		if ValidID(id) != ids.Valid(id) {
			t.Errorf("id %q: ValidID %v, ids.Valid %v", id, ValidID(id), ids.Valid(id))
		}
	}
}
