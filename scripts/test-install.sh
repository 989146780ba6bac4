#!/usr/bin/env bash
# Tests scripts/install.sh and scripts/uninstall.sh for real: installs aenv
# into a scratch prefix, data and run directory under its own unit name,
# port and network tag (so that it shares the host with other servers),
# checks the unit, the settings, the API key, the running server and a
# sandbox driven by the installed CLI, that a second install changes
# nothing, and that uninstalling stops the server and removes what it
# should. Between those, a node agent is installed beside it
# (install.sh --node, with the flags of the server's `aenv cluster
# join-command` line) under scratch paths and a unit name of its own:
# it joins, runs a sandbox the server places on it, keeps no join token,
# restarts without one, and uninstalls leaving nothing behind. Run as root
# (`make test-install`). Prints `N passed, M failed` and exits non-zero on
# any failure.
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
# The server lets nodes join at its cluster listener and reach its
# embedded etcd, both on loopback.
cluster_listen=127.0.0.1:18601
etcd_listen=https://127.0.0.1:18602
server_opts="--netns-tag $tag --sandbox-cidr $cidr --cluster-listen $cluster_listen --etcd-listen $etcd_listen"

# The node agent: every address, so that install.sh derives where the
# server reaches it (loopback, the route to the join URL's host).
nunit=aenv-test-install-node
nlisten=:18603
nid=zqinsnode
ntag=zqinsn
ncidr=10.251.0.0/16
nprefix=$tmp/node-prefix
ndata=$tmp/node-data
nrun=$tmp/node-run
nenv_file=/etc/default/$nunit
nunit_file=/etc/systemd/system/$nunit.service
npid_file=/run/$nunit.pid
nlog_file=/var/log/$nunit.log

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
node_uninstall() { "$here/scripts/uninstall.sh" --node --unit-name "$nunit" --prefix "$nprefix" "$@"; }

cleanup() {
  # Whatever a failed check left: ours by unit name, prefix and scratch dir.
  node_uninstall --purge --keep-runsc >/dev/null 2>&1
  uninstall --purge --keep-runsc >/dev/null 2>&1
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT

# Leftovers of an interrupted earlier run (same unit names, other scratch dir).
if [ -e "$nunit_file" ] || [ -e "$nenv_file" ] || [ -e "$npid_file" ]; then
  "$here/scripts/uninstall.sh" --node --unit-name "$nunit" --purge --keep-runsc >/dev/null 2>&1
fi
if [ -e "$unit_file" ] || [ -e "$env_file" ] || [ -e "$pid_file" ]; then
  "$here/scripts/uninstall.sh" --unit-name "$unit" --purge --keep-runsc >/dev/null 2>&1
fi
if curl -fsS -m 2 -o /dev/null "$url/health" 2>/dev/null; then
  fail "port of $listen is free" "something already answers on $url"
  finish
  exit 1
fi

args=(--prefix "$prefix" --listen "$listen" --data-dir "$data" --run-dir "$run" --unit-name "$unit"
  --server-opts "$server_opts")
[ "${AENV_TEST_SKIP_DEPS:-0}" = 1 ] && args+=(--skip-deps)
first_args=("${args[@]}")
[ -n "${AENV_BIN_DIR:-}" ] && first_args+=(--bin-dir "$AENV_BIN_DIR")

# unit_pid UNIT PIDFILE prints the running pid of an installed service
# (systemd's MainPID, or its pid file's without systemd).
unit_pid() {
  local pid
  if have_systemd; then
    pid=$(systemctl show -p MainPID --value "$1" 2>/dev/null)
  else
    pid=$(cat "$2" 2>/dev/null)
  fi
  [ -n "$pid" ] && [ "$pid" != 0 ] && [ -d "/proc/$pid" ] || return 1
  echo "$pid"
}
# server_pid prints the running server's pid.
server_pid() { unit_pid "$unit" "$pid_file"; }
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
    grep -qx 'AENV_OPTS=$server_opts' '$env_file'"
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

# --- a node agent joins the server ---------------------------------------------

# node_pid prints the node agent's pid.
node_pid() { unit_pid "$nunit" "$npid_file"; }
# node_state prints the node's state in the server's `aenv nodes`.
node_state() { cli nodes 2>/dev/null | awk -v id="$nid" '$1 == id { print $2 }'; }
# wait_node_state STATE: the server lists the node so within 30 s.
wait_node_state() {
  for _ in $(seq 1 60); do
    [ "$(node_state)" = "$1" ] && return 0
    sleep 0.5
  done
  echo "aenv nodes:"
  cli nodes 2>&1
  return 1
}
# no_token_kept: the join token is in none of the node's files.
no_token_kept() {
  local f
  for f in "$nenv_file" "$nunit_file" "$nlog_file" "$ndata/secrets/join-token"; do
    if [ -e "$f" ] && grep -qF "$join_token" "$f"; then echo "the token is in $f"; return 1; fi
  done
  if grep -rqF --exclude-dir=base-rootfs "$join_token" "$ndata"; then
    grep -rlF --exclude-dir=base-rootfs "$join_token" "$ndata"
    return 1
  fi
}
# no_procs_in DIR...: no process runs a binary in a DIR or names one in
# its command line (the agent, its image server, runsc).
no_procs_in() {
  local p d exe cmdline found=0
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    cmdline=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)
    for d in "$@"; do
      if [[ $exe == "$d"/* || $cmdline == *"$d/"* ]]; then
        echo "pid ${p#/proc/}: $cmdline"
        found=1
      fi
    done
  done
  [ "$found" = 0 ]
}
# node_gone: the server answers, and lists the node lost (it left) or
# not at all, within 5 s.
node_gone() {
  local out
  for _ in $(seq 1 10); do
    out=$(cli nodes 2>&1) || { echo "$out"; return 1; }
    awk -v id="$nid" '$1 == id && $2 != "lost" { f = 1 } END { exit f }' <<<"$out" && return 0
    sleep 0.5
  done
  echo "$out"
  return 1
}

echo "# installing a node agent into $nprefix (unit $nunit, $nlisten), joined with the server's join command"
join_line=$(cli cluster join-command --description test-install 2>"$tmp/join.err")
join_re='^aenv node --join (https://[^ ]+) --token ([^ ]+) --ca-hash (sha256:[0-9a-f]{64})$'
if [[ $join_line =~ $join_re ]]; then
  ok "aenv cluster join-command prints an 'aenv node --join ... --token ... --ca-hash ...' line"
  join_url=${BASH_REMATCH[1]}
  join_token=${BASH_REMATCH[2]}
  ca_hash=${BASH_REMATCH[3]}
  # The tail of the line, as a user pastes it.
  read -r -a join_flags <<<"${join_line#aenv node }"
  nargs=(--node "${join_flags[@]}" --prefix "$nprefix" --data-dir "$ndata" --run-dir "$nrun" --unit-name "$nunit"
    --listen "$nlisten" --node-opts "--node-id $nid --netns-tag $ntag --sandbox-cidr $ncidr --warm-pool 0" --bin-dir "$tmp/bin")
  [ "${AENV_TEST_SKIP_DEPS:-0}" = 1 ] && nargs+=(--skip-deps)
  start=$(date +%s)
  if "$here/scripts/install.sh" "${nargs[@]}" >"$tmp/node-install1.out" 2>&1; then
    ok "install.sh --node exits 0 once the node has joined ($(($(date +%s) - start)) s)"
    node_ok=1
  else
    fail "install.sh --node exits 0 once the node has joined" "$(tail -n 30 "$tmp/node-install1.out")"
    node_ok=0
  fi
else
  fail "aenv cluster join-command prints an 'aenv node --join ... --token ... --ca-hash ...' line" "$join_line $(cat "$tmp/join.err")"
  node_ok=0
fi

if [ "$node_ok" = 1 ]; then
  check "install.sh --node says the node joined" grep -q "aenv node $nid has joined the cluster of $join_url" "$tmp/node-install1.out"
  nexec="ExecStart=$nprefix/bin/aenv node --join \${AENV_JOIN} --ca-hash \${AENV_CA_HASH} --token-file \${AENV_TOKEN_FILE} --listen \${AENV_LISTEN} --advertise \${AENV_ADVERTISE} --data-dir \${AENV_DATA_DIR} --run-dir \${AENV_RUN_DIR} --on-stop \${AENV_ON_STOP} \$AENV_NODE_OPTS"
  check "node unit: ExecStart runs PREFIX/bin/aenv node with the settings" grep -qxF "$nexec" "$nunit_file"
  check "node unit: EnvironmentFile=-$nenv_file, KillMode=process, Delegate=yes" \
    sh -c "grep -qxF 'EnvironmentFile=-$nenv_file' '$nunit_file' && grep -qx KillMode=process '$nunit_file' && grep -qx Delegate=yes '$nunit_file'"
  if command -v systemd-analyze >/dev/null; then
    check "node unit: systemd-analyze verify accepts it" systemd-analyze verify "$nunit_file"
  fi
  check "node settings: the join URL and CA hash, the derived advertise address, drain on stop, the directories" \
    sh -c "grep -qxF 'AENV_JOIN=$join_url' '$nenv_file' && grep -qxF 'AENV_CA_HASH=$ca_hash' '$nenv_file' &&
      grep -qxF 'AENV_ADVERTISE=127.0.0.1:${nlisten##*:}' '$nenv_file' && grep -qx 'AENV_ON_STOP=drain' '$nenv_file' &&
      grep -qxF 'AENV_DATA_DIR=$ndata' '$nenv_file' && grep -qxF 'AENV_RUN_DIR=$nrun' '$nenv_file' &&
      grep -qxF 'AENV_TOKEN_FILE=$ndata/secrets/join-token' '$nenv_file' && grep -qxF 'AENV_BASE_ROOTFS=$ndata/base-rootfs' '$nenv_file'"
  check "node settings have mode 0600, its data dir 0700" sh -c "[ \"\$(stat -c %a '$nenv_file')\" = 600 ] && [ \"\$(stat -c %a '$ndata')\" = 700 ]"
  check "the node holds its certificate and key (mode 0600)" \
    sh -c "[ -s '$ndata/secrets/node.crt' ] && [ \"\$(stat -c %a '$ndata/secrets/node.key')\" = 600 ]"
  check "the join token is kept nowhere: its file is gone, and no settings, unit, log or data file holds it" no_token_kept
  npid1=$(node_pid)
  check "the node agent runs the installed binary" \
    sh -c "[ -n '$npid1' ] && [ \"\$(readlink /proc/$npid1/exe)\" = '$(readlink -f "$nprefix/bin")/aenv' ]"
  check "the server's aenv nodes lists the node ready" wait_node_state ready

  # The server's own node takes no sandboxes for now: the next lands on
  # the new node, reached over mutual TLS.
  local_node=$(cli nodes 2>/dev/null | awk -v id="$nid" 'NR > 1 && $1 != id { print $1; exit }')
  check "the server's local node ($local_node) drains" cli node drain "$local_node"
  if nsb=$(cli create base --timeout 120 2>"$tmp/node-create.err") && [ -n "$nsb" ]; then
    ok "aenv create prints a sandbox id ($nsb)"
    check "the sandbox runs on the new node" \
      sh -c "curl -fsS -H 'X-API-Key: $key' '$url/sandboxes/$nsb' | grep -qF '\"nodeID\":\"$nid\"'"
    out=$(cli exec "$nsb" -- echo ok from the node 2>&1)
    if [ "$out" = "ok from the node" ]; then ok "aenv exec in it answers"; else fail "aenv exec in it answers" "$out"; fi
    check "aenv rm removes it" cli rm "$nsb"
  else
    fail "aenv create prints a sandbox id" "$(cat "$tmp/node-create.err")"
  fi
  cli node drain --undo "$local_node" >/dev/null 2>&1

  # The same command again: nothing changes, and the token is not stored.
  if "$here/scripts/install.sh" "${nargs[@]}" >"$tmp/node-install2.out" 2>&1; then
    ok "a second install.sh --node exits 0"
  else
    fail "a second install.sh --node exits 0" "$(tail -n 30 "$tmp/node-install2.out")"
  fi
  check "the second install changes nothing (same agent) and keeps no token" \
    sh -c "grep -q 'nothing changed' '$tmp/node-install2.out' && grep -q 'join token is not needed' '$tmp/node-install2.out' &&
      [ '$(node_pid)' = '$npid1' ] && [ ! -e '$ndata/secrets/join-token' ]"

  # A restart joins again with the certificate: no token anywhere.
  if have_systemd; then
    systemctl restart "$nunit"
  else
    pid=$(node_pid) && kill -TERM "$pid"
    for _ in $(seq 1 120); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
  fi
  # Without --token: the flags minus the token and its value.
  notoken=()
  skip=0
  for a in "${nargs[@]}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    if [ "$a" = --token ]; then skip=1; continue; fi
    notoken+=("$a")
  done
  if "$here/scripts/install.sh" "${notoken[@]}" >"$tmp/node-install3.out" 2>&1; then
    ok "after a restart the node joins again without a token (install.sh --node without --token)"
  else
    fail "after a restart the node joins again without a token (install.sh --node without --token)" "$(tail -n 30 "$tmp/node-install3.out")"
  fi
  check "the restarted agent is a new process" sh -c "[ '$(node_pid)' != '$npid1' ] && [ -n '$(node_pid)' ]"
  check "the server lists it ready again" wait_node_state ready
  npid1=$(node_pid)

  # Uninstalling the node: it leaves the cluster, and nothing of it stays.
  # Without --node or --prefix: the unit tells both.
  if "$here/scripts/uninstall.sh" --unit-name "$nunit" >"$tmp/node-uninstall.out" 2>&1; then ok "uninstall.sh --node exits 0"; else fail "uninstall.sh --node exits 0" "$(cat "$tmp/node-uninstall.out")"; fi
  check "the node agent has stopped" sh -c "! kill -0 $npid1 2>/dev/null || grep -q '^State:.*Z' /proc/$npid1/status"
  check "the node left the cluster (aenv nodes lists it lost)" node_gone
  check "node pid file, unit and binaries are gone" \
    sh -c "[ ! -e '$npid_file' ] && [ ! -e '$nunit_file' ] && [ ! -e '$nprefix/bin/aenv' ] && [ ! -e '$nprefix/bin/envd' ]"
  check "the node cleaned up its network (no $ntag interfaces or nftables tables)" \
    sh -c "! ip -o link | grep -q ': $ntag' && ! nft list tables 2>/dev/null | grep -qx 'table inet $ntag'"
  check "no process of the node is left (agent, image server, runsc)" no_procs_in "$nprefix" "$nrun" "$ndata"
  check "the node's data dir (certificate) and settings are kept" sh -c "[ -f '$ndata/secrets/node.crt' ] && [ -f '$nenv_file' ]"
  if have_systemd; then
    journalctl -u "$nunit" -n 60 --no-pager >"$tmp/node.log" 2>&1
  elif [ -f "$nlog_file" ]; then
    cp "$nlog_file" "$tmp/node.log"
  fi
  if node_uninstall --purge --keep-runsc >"$tmp/node-purge.out" 2>&1; then ok "uninstall.sh --node --purge exits 0"; else fail "uninstall.sh --node --purge exits 0" "$(cat "$tmp/node-purge.out")"; fi
  check "--purge removes the node's data dir, settings and log" sh -c "[ ! -e '$ndata' ] && [ ! -e '$nenv_file' ] && [ ! -e '$nlog_file' ]"
fi

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

check "no process of either install is left" no_procs_in "$tmp"

if [ "$failed" != 0 ] && [ -s "$tmp/server.log" ]; then
  echo "# the end of the server's log:"
  tail -n 30 "$tmp/server.log" | sed 's/^/#   /'
fi
if [ "$failed" != 0 ] && [ -s "$tmp/node.log" ]; then
  echo "# the end of the node agent's log:"
  tail -n 30 "$tmp/node.log" | sed 's/^/#   /'
fi
finish
