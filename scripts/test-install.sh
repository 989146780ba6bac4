#!/usr/bin/env bash
# Tests scripts/install.sh and scripts/uninstall.sh for real: installs aenv
# into a scratch prefix, data and run directory under its own unit name,
# port and network tag (so that it shares the host with other servers),
# checks the unit, the settings, the API key, the running server and a
# sandbox driven by the installed CLI, that a second install changes
# nothing, and that uninstalling stops the server and removes what it
# should. Run as root (`make test-install`). Prints `N passed, M failed`
# and exits non-zero on any failure.
#
# AENV_BIN_DIR: prebuilt aenv and envd to install (default: install.sh runs
# `make build`). AENV_TEST_SKIP_DEPS=1: do not run install-deps.sh again.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin

unit=aenv-test-install
listen=127.0.0.1:18600
url=http://$listen
tag=zqinst
cidr=10.248.0.0/16
tmp=$(mktemp -d /tmp/aenv-test-install.XXXXXX)
prefix=$tmp/prefix
data=$tmp/data
run=$tmp/run
env_file=/etc/default/$unit
unit_file=/etc/systemd/system/$unit.service
pid_file=/run/$unit.pid
log_file=/var/log/$unit.log

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
fail() { failed=$((failed + 1)); echo "FAIL - $1"; [ -z "${2:-}" ] || printf "%s\n" "$2" | sed "s/^/       /"; }
# check NAME COMMAND...: passes when COMMAND succeeds.
check() {
  local name=$1 out
  shift
  if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "$(echo "$out" | tail -n 15)"; fi
}
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}

if [ "$(id -u)" != 0 ]; then
  fail "runs as root (the server runs gVisor sandboxes)"
  finish
  exit 1
fi

have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }
uninstall() { "$here/scripts/uninstall.sh" --unit-name "$unit" --prefix "$prefix" "$@"; }

cleanup() {
  # Whatever a failed check left: ours by unit name, prefix and scratch dir.
  uninstall --purge --keep-runsc >/dev/null 2>&1
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

# Leftovers of an interrupted earlier run (same unit name, other scratch dir).
if [ -e "$unit_file" ] || [ -e "$env_file" ] || [ -e "$pid_file" ]; then
  "$here/scripts/uninstall.sh" --unit-name "$unit" --purge --keep-runsc >/dev/null 2>&1
fi
if curl -fsS -m 2 -o /dev/null "$url/health" 2>/dev/null; then
  fail "port of $listen is free" "something already answers on $url"
  finish
  exit 1
fi

args=(--prefix "$prefix" --listen "$listen" --data-dir "$data" --run-dir "$run" --unit-name "$unit"
  --server-opts "--netns-tag $tag --sandbox-cidr $cidr")
[ "${AENV_TEST_SKIP_DEPS:-0}" = 1 ] && args+=(--skip-deps)
first_args=("${args[@]}")
[ -n "${AENV_BIN_DIR:-}" ] && first_args+=(--bin-dir "$AENV_BIN_DIR")

# server_pid prints the running server's pid (systemd's MainPID or the pid file's).
server_pid() {
  local pid
  if have_systemd; then
    pid=$(systemctl show -p MainPID --value "$unit" 2>/dev/null)
  else
    pid=$(cat "$pid_file" 2>/dev/null)
  fi
  [ -n "$pid" ] && [ "$pid" != 0 ] && [ -d "/proc/$pid" ] || return 1
  echo "$pid"
}
healthy() { curl -fsS -m 5 -o /dev/null "$url/health"; }

# --- first install -----------------------------------------------------------

echo "# installing into $prefix (unit $unit, $listen)"
if "$here/scripts/install.sh" "${first_args[@]}" >"$tmp/install1.out" 2>&1; then
  ok "install.sh exits 0"
else
  fail "install.sh exits 0" "$(tail -n 30 "$tmp/install1.out")"
  finish # nothing else to check; cleanup undoes what it did
  exit 1
fi

check "aenv and envd are installed in PREFIX/bin" test -x "$prefix/bin/aenv" -a -x "$prefix/bin/envd"

exec_line="ExecStart=$prefix/bin/aenv server --listen \${AENV_LISTEN} --data-dir \${AENV_DATA_DIR} --run-dir \${AENV_RUN_DIR} \$AENV_OPTS"
check "unit: ExecStart runs PREFIX/bin/aenv server with the settings" grep -qxF "$exec_line" "$unit_file"
check "unit: EnvironmentFile=-$env_file" grep -qxF "EnvironmentFile=-$env_file" "$unit_file"
check "unit: Restart=on-failure, KillMode=process (sandboxes outlive a restart), TimeoutStopSec=600, Delegate=yes" \
  sh -c "grep -qx Restart=on-failure '$unit_file' && grep -qx KillMode=process '$unit_file' &&
    grep -qx TimeoutStopSec=600 '$unit_file' && grep -qx Delegate=yes '$unit_file' && grep -q '^LimitNOFILE=' '$unit_file'"
if command -v systemd-analyze >/dev/null; then
  check "unit: systemd-analyze verify accepts it" systemd-analyze verify "$unit_file"
fi
check "settings: $env_file holds the listen address, directories and flags" \
  sh -c "grep -qx 'AENV_LISTEN=$listen' '$env_file' && grep -qx 'AENV_DATA_DIR=$data' '$env_file' &&
    grep -qx 'AENV_RUN_DIR=$run' '$env_file' && grep -qx 'AENV_BASE_ROOTFS=$data/base-rootfs' '$env_file' &&
    grep -qx 'AENV_OPTS=--netns-tag $tag --sandbox-cidr $cidr' '$env_file'"
check "data dir has mode 0700" test "$(stat -c %a "$data" 2>&1)" = 700
check "the base template is in the data dir" test -x "$data/base-rootfs/bin/bash"

pid1=$(server_pid)
check "the server runs the installed binary" \
  sh -c "[ -n '$pid1' ] && [ \"\$(readlink /proc/$pid1/exe)\" = '$(readlink -f "$prefix/bin")/aenv' ]"
check "GET /health answers" healthy

key_file=$data/secrets/api-key
check "API key file exists with mode 0600" test "$(stat -c %a "$key_file" 2>&1)" = 600
key=$(cat "$key_file" 2>/dev/null)
check "API key looks like e2b_<hex>" grep -qE '^e2b_[0-9a-f]+$' "$key_file"
check "the API takes the key and refuses requests without it" \
  sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'X-API-Key: $key' $url/sandboxes)\" = 200 ] &&
    [ \"\$(curl -s -o /dev/null -w '%{http_code}' $url/sandboxes)\" = 401 ]"
check "install.sh prints the URL, the key's place and the E2B env lines" \
  sh -c "grep -q 'aenv is running at $url' '$tmp/install1.out' && grep -qF '$key_file' '$tmp/install1.out' &&
    grep -qF 'export E2B_API_URL=$url E2B_SANDBOX_URL=$url' '$tmp/install1.out'"

cli() { AENV_API_KEY=$key "$prefix/bin/aenv" --url "$url" "$@"; }
if id=$(cli create base --timeout 120 2>"$tmp/create.err") && [ -n "$id" ]; then
  ok "aenv create prints a sandbox id ($id)"
  out=$(cli exec "$id" -- echo ok 2>&1)
  if [ "$out" = ok ]; then ok "aenv exec ... -- echo ok prints ok"; else fail "aenv exec ... -- echo ok prints ok" "$out"; fi

  # A restart of the service keeps the sandbox, and the counter running
  # in its memory, going.
  cli exec "$id" -- 'nohup sh -c "i=0; while :; do i=\$((i+1)); echo \$i >/tmp/n; sleep 0.1; done" >/dev/null 2>&1 &' >/dev/null 2>&1
  sleep 1
  n1=$(cli exec "$id" -- cat /tmp/n 2>&1)
  if have_systemd; then
    systemctl restart "$unit"
  else
    pid=$(server_pid) && kill -TERM "$pid"
    for _ in $(seq 1 120); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
    "$here/scripts/install.sh" "${args[@]}" --bin-dir "$prefix/bin" >"$tmp/restart.out" 2>&1
  fi
  for _ in $(seq 1 60); do healthy && break; sleep 0.5; done
  check "the server is back after a restart with a new pid" sh -c "[ -n \"\$(cat /proc/$(server_pid)/stat 2>/dev/null)\" ] && [ '$(server_pid)' != '$pid1' ]"
  n2=$(cli exec "$id" -- cat /tmp/n 2>&1)
  check "the sandbox survives the restart and its counter goes on ($n1 then $n2)" \
    sh -c "[ '$n1' -gt 0 ] 2>/dev/null && [ '$n2' -gt '$n1' ] 2>/dev/null"
  pid1=$(server_pid)
  check "aenv rm removes the sandbox" cli rm "$id"
else
  fail "aenv create prints a sandbox id" "$(cat "$tmp/create.err")"
  fail "aenv exec ... -- echo ok prints ok" "(no sandbox)"
fi

# --- second install: nothing to do ------------------------------------------

# An admin's edit that a second install must keep.
echo "# edited by test-install" >>"$env_file"
sums=$(md5sum "$unit_file" "$env_file" "$prefix/bin/aenv" "$prefix/bin/envd" "$key_file" 2>&1)
# The same binaries again (a copy: the tree may be rebuilt meanwhile).
mkdir -p "$tmp/bin"
cp "$prefix/bin/aenv" "$prefix/bin/envd" "$tmp/bin/" 2>/dev/null
if "$here/scripts/install.sh" "${args[@]}" --bin-dir "$tmp/bin" >"$tmp/install2.out" 2>&1; then
  ok "second install.sh exits 0"
else
  fail "second install.sh exits 0" "$(tail -n 30 "$tmp/install2.out")"
fi
check "second install says nothing changed" grep -q "nothing changed" "$tmp/install2.out"
check "second install leaves unit, settings, binaries and key as they were" \
  sh -c "[ \"\$(md5sum '$unit_file' '$env_file' '$prefix/bin/aenv' '$prefix/bin/envd' '$key_file' 2>&1)\" = '$sums' ]"
check "second install keeps the server running (same pid)" test "$(server_pid)" = "$pid1"
check "GET /health still answers" healthy

# --- uninstall ---------------------------------------------------------------

if uninstall >"$tmp/uninstall.out" 2>&1; then ok "uninstall.sh exits 0"; else fail "uninstall.sh exits 0" "$(cat "$tmp/uninstall.out")"; fi
check "the server has stopped" sh -c "! kill -0 $pid1 2>/dev/null || grep -q '^State:.*Z' /proc/$pid1/status"
check "nothing answers on $listen any more" sh -c "! curl -fsS -m 2 -o /dev/null $url/health"
check "pid file and unit are gone" sh -c "[ ! -e '$pid_file' ] && [ ! -e '$unit_file' ]"
check "binaries are gone" sh -c "[ ! -e '$prefix/bin/aenv' ] && [ ! -e '$prefix/bin/envd' ]"
check "the server cleaned up its network (no $tag interfaces or nftables tables)" \
  sh -c "! ip -o link | grep -q ': $tag' && ! nft list tables 2>/dev/null | grep -qx 'table inet $tag'"
check "data dir, key and settings are kept" sh -c "[ -f '$key_file' ] && [ -f '$env_file' ]"
check "runsc is kept" test -x /usr/local/bin/runsc
if uninstall >"$tmp/uninstall2.out" 2>&1; then ok "a second uninstall.sh exits 0"; else fail "a second uninstall.sh exits 0" "$(cat "$tmp/uninstall2.out")"; fi
# The server's log, for failures (--purge removes the nohup server's).
if have_systemd; then
  journalctl -u "$unit" -n 60 --no-pager >"$tmp/server.log" 2>&1
elif [ -f "$log_file" ]; then
  cp "$log_file" "$tmp/server.log"
fi
if uninstall --purge --keep-runsc >"$tmp/purge.out" 2>&1; then ok "uninstall.sh --purge exits 0"; else fail "uninstall.sh --purge exits 0" "$(cat "$tmp/purge.out")"; fi
check "--purge removes the data dir and settings" sh -c "[ ! -e '$data' ] && [ ! -e '$env_file' ] && [ ! -e '$log_file' ]"
check "--keep-runsc keeps runsc" test -x /usr/local/bin/runsc

if [ "$failed" != 0 ] && [ -s "$tmp/server.log" ]; then
  echo "# the end of the server's log:"
  tail -n 30 "$tmp/server.log" | sed 's/^/#   /'
fi
finish
