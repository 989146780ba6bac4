package cli

import (
	"testing"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/image"
)

// TestTemplateDefaults: the defaults `aenv pull` and `aenv build` show
// (the client's, so that the CLI need not link the image package) are
// the server's.
func TestTemplateDefaults(t *testing.T) {
	if client.DefaultCPUCount != image.DefaultCPUCount || client.DefaultMemoryMB != image.DefaultMemoryMB {
		t.Fatalf("client defaults %d CPUs, %d MiB; the server's %d, %d",
			client.DefaultCPUCount, client.DefaultMemoryMB, image.DefaultCPUCount, image.DefaultMemoryMB)
	}
}
