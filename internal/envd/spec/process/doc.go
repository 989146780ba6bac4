// Package process holds the messages of E2B's envd process.Process
// protocol, generated from proto/process/process.proto (see ../gen.sh).
// The envd server and its clients import it.
package process
