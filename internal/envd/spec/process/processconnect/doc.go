// Package processconnect holds the Connect client and handler of
// process.Process, generated from proto/process/process.proto (see
// ../../gen.sh). The envd server and its clients import it.
package processconnect
