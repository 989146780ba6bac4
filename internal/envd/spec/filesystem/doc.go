// Package filesystem holds the messages of E2B's envd
// filesystem.Filesystem protocol, generated from
// proto/filesystem/filesystem.proto (see ../gen.sh). The envd server and
// its clients import it.
package filesystem
