// Package store keeps what must outlive a node durably: sandbox snapshots
// (so that a paused sandbox can resume on any host), templates' block
// images (which nodes read lazily) and volumes on the move. It has two
// layers: a Backend (a flat key → bytes object store: a local or shared
// directory, or an S3 bucket) and, on top of it, a content-addressed
// Repository that cuts files into chunks, uploads only the chunks the
// backend lacks, and publishes a snapshot by writing its manifest last.
//
// Chunks are addressed by the sha256 of their content, compressed with zstd
// when that pays, verified on every read, and kept in a bounded LRU cache
// directory on the node so that a restore where the snapshot was taken (or
// last restored) needs no network. GC deletes chunks no manifest references.
//
// The node's side (snapshot, template, blockimage, node, agent) and the
// server wiring import this package; it imports nothing of aenv. Its tests start a real S3 server (versitygw, built from the module
// cache) as a separate process.
package store
