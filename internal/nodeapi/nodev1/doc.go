// Package nodev1 holds the messages of the node API, generated from
// proto/node/node.proto (see ../gen.sh). Only package nodeapi and its
// callers import it.
package nodev1
