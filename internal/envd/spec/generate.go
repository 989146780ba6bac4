// Package spec holds the Go code generated from proto/process and
// proto/filesystem: the envd wire protocol (messages in process and
// filesystem, Connect clients and handlers in processconnect and
// filesystemconnect). The envd server implements the handlers; the platform
// and the tests use the clients. Only this file, gen.sh and the doc.go files
// are written by hand.
package spec

// gen.sh builds protoc-gen-go and protoc-gen-connect-go at the versions in
// go.mod into a temporary directory, so a clean checkout needs only protoc.
//go:generate sh gen.sh
