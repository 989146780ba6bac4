#!/usr/bin/env bash
# Installs what aenv needs on a Debian 12 host, idempotently: Debian
# packages, a static runsc built from the pinned gVisor release (cached, so a
# second run is quick) and the e2e suite's npm packages. Run as root.
set -euo pipefail

RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
CACHE=${AENV_CACHE:-/var/cache/aenv}
here=$(cd "$(dirname "$0")/.." && pwd)

if [ "$(id -u)" != 0 ]; then
  echo "install-deps: run as root (sandboxes need namespaces, cgroups and nftables)" >&2
  exit 1
fi

pkgs=(debootstrap iproute2 util-linux nftables e2fsprogs ca-certificates curl procps psmisc busybox-static python3-ipykernel python3-matplotlib erofs-utils fuse3)
# The multihost e2e suite captures the cluster's traffic (tcpdump) to check no
# secret crosses the network in the clear.
pkgs+=(tcpdump)
# The web console's e2e suite (e2e/console.test.mjs) drives Debian's chromium, headless.
pkgs+=(chromium)
# The Python e2e suite (e2e/python) runs the E2B Python SDK from
# ../shared/python-e2b with Debian's Python: the SDK's dependencies that
# Debian ships come from here.
pkgs+=(python3-h2 python3-hpack python3-hyperframe python3-protobuf python3-dateutil python3-typing-extensions
  python3-certifi python3-idna python3-sniffio python3-packaging python3-attr python3-rich python3-wcmatch
  python3-bracex python3-pygments python3-markdown-it python3-mdurl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# runsc must be built without cgo: a dynamic build fails at every sandbox
# start. It is built from a copy of the gVisor module with its seccomp
# programs precompiled (scripts/runsc-seccomp: without them every sandbox
# start and restore compiles them, ~50 ms of CPU each), from the main
# package scripts/runsc-main (its sentry returns freed heap to the host:
# 0.55 MiB less per idle sandbox; and collects less often while its heap is
# small), with scripts/runsc-patch.sh's edits. The build takes minutes, so
# the result is cached per version and per source of all three.
seccomp_gen=$here/scripts/runsc-seccomp/main.go
runsc_main=("$here"/scripts/runsc-main/*.go)
runsc_patch=$here/scripts/runsc-patch.sh
# gVisor's Bazel release stamps its version into runsc; `go build` leaves
# VERSION_MISSING unless told, and the version is what snapshots record to
# be restored only by the runsc that made them.
runsc_ldflags="-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION"
runsc_bin=$CACHE/runsc-$RUNSC_VERSION-seccomp-$({ cat "$seccomp_gen" "${runsc_main[@]}" "$runsc_patch"; echo "$runsc_ldflags"; } | sha256sum | cut -c1-12)/runsc
if [ ! -x "$runsc_bin" ]; then
  echo "install-deps: building runsc $RUNSC_VERSION (static, seccomp precompiled; a few minutes, once)"
  src=$(mktemp -d /tmp/aenv-gvisor-XXXXXX)
  trap 'rm -rf "$src"' EXIT
  mod=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$mod" ] || { echo "install-deps: downloading gvisor.dev/gvisor@$RUNSC_VERSION failed" >&2; exit 1; }
  cp -r "$mod/." "$src" && chmod -R u+w "$src"
  "$runsc_patch" "$src"
  mkdir -p "$src/aenv-runsc-seccomp" && cp "$seccomp_gen" "$src/aenv-runsc-seccomp/"
  (cd "$src" && CGO_ENABLED=0 go run -tags aenv_runsc_seccomp ./aenv-runsc-seccomp)
  mkdir -p "$src/aenv-runsc" && cp "${runsc_main[@]}" "$src/aenv-runsc/"
  # Its test needs the gVisor module, so it runs here, with the build.
  (cd "$src" && CGO_ENABLED=0 go test -tags aenv_runsc_main ./aenv-runsc)
  mkdir -p "$(dirname "$runsc_bin")"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -tags aenv_runsc_main -ldflags "$runsc_ldflags" -o "$runsc_bin.tmp" ./aenv-runsc && mv "$runsc_bin.tmp" "$runsc_bin")
  rm -rf "$src"
  trap - EXIT
fi
install -m 0755 "$runsc_bin" /usr/local/bin/runsc
# Builds of another version or of other sources are not used again once
# this one is installed (/usr/local/bin/runsc is a copy): ~100 MB each.
for old in "$CACHE"/runsc-*; do
  if [ "$old" != "$(dirname "$runsc_bin")" ]; then
    echo "install-deps: removing an earlier runsc build, $old"
    rm -rf "$old"
  fi
done

if [ -f "$here/e2e/package.json" ]; then
  (cd "$here/e2e" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "install-deps: done (runsc: $(/usr/local/bin/runsc --version | head -1))"
