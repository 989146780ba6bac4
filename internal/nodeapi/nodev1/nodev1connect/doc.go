// Package nodev1connect holds the Connect client and handler of the node
// API, generated from proto/node/node.proto (see ../../gen.sh).
package nodev1connect
