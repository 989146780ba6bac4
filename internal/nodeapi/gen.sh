#!/bin/sh
# Regenerates the node API code from proto/node (run via `go generate`).
set -eu
cd "$(dirname "$0")"
root=$(cd ../.. && pwd)
module=github.com/aenvhq/aenv
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
go build -o "$tmp/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$tmp/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
PATH="$tmp:$PATH" protoc -I "$root/proto" \
	--go_out="$root" --go_opt=module="$module" \
	--connect-go_out="$root" --connect-go_opt=module="$module",simple \
	node/node.proto
