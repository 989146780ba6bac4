package store

import (
	"bufio"
	"errors"
	"hash/crc32"
	"io"
)

// Where chunks are cut. Memory images (gVisor's pages file) store the
// committed pages packed in address order, so one page allocated or freed
// shifts everything after it by a page: fixed-size chunks would then all
// change, and a 1 MiB change would re-upload the whole image. Chunks are
// therefore cut where the content says (content-defined chunking), but only
// at page boundaries, since shifts come in whole pages: a page whose
// CRC-32C matches a pattern ends a chunk. CRC-32C runs in hardware, so the
// test costs far less than the sha256 each chunk gets anyway.
const (
	pageSize = 4096
	// minChunkPages keeps chunks from getting tiny (per-object overhead).
	minChunkPages = 16 // 64 KiB
	// boundaryMask gives one boundary per 64 pages on average past the
	// minimum: chunks average about 320 KiB. Between two snapshots a
	// sandbox's activity changes pages all over its image (process and
	// kernel state, not just the data it wrote), and each changed page
	// costs its whole chunk: measured on a 10 MiB image after a 1 MiB
	// write, 1.25 MiB chunks re-uploaded 7.7 MiB, 320 KiB chunks 4.4 MiB.
	boundaryMask = 0x3f
	// boundaryMagic is the value of crc&boundaryMask that ends a chunk.
	// It is not the all-zero page's, so runs of zero pages make long
	// (maximum-size) chunks rather than minimum-size ones.
	boundaryMagic = 0x1a
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// chunker cuts a stream into chunks of at most max bytes: exactly max
// (but the last) unless content-defined.
type chunker struct {
	r     *bufio.Reader
	max   int
	cdc   bool
	total int64
	done  bool
}

func newChunker(r io.Reader, max int64, contentDefined bool) *chunker {
	return &chunker{r: bufio.NewReaderSize(r, 1<<20), max: int(max), cdc: contentDefined}
}

// next appends the next chunk to buf (whose capacity must be at least max)
// and returns it; io.EOF when the stream is done.
func (c *chunker) next(buf []byte) ([]byte, error) {
	if c.done {
		return nil, io.EOF
	}
	pages := 0
	for len(buf) < c.max {
		n := min(pageSize, c.max-len(buf))
		page := buf[len(buf) : len(buf)+n]
		got, err := io.ReadFull(c.r, page)
		buf = buf[:len(buf)+got]
		c.total += int64(got)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			c.done = true
			break
		}
		if err != nil {
			return nil, err
		}
		pages++
		if c.cdc && pages >= minChunkPages && got == pageSize &&
			crc32.Checksum(page, crcTable)&boundaryMask == boundaryMagic {
			break
		}
	}
	if len(buf) == 0 {
		return nil, io.EOF
	}
	return buf, nil
}

// maxChunks bounds how many chunks a file of size bytes can be cut into.
func maxChunks(size, max int64) int {
	minChunk := min(int64(minChunkPages*pageSize), max)
	return int(size/minChunk) + 1
}
