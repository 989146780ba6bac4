// Package filesystemconnect holds the Connect client and handler of
// filesystem.Filesystem, generated from proto/filesystem/filesystem.proto
// (see ../../gen.sh). The envd server and its clients import it.
package filesystemconnect
