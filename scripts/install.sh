#!/usr/bin/env bash
# Installs aenv as a service on a Debian 12 host, idempotently: the
# prerequisites (scripts/install-deps.sh), the aenv and envd binaries, the
# base template's root filesystem, a systemd unit and its settings file, then
# starts the server and waits until it answers. With --node it installs a
# node agent instead, which joins a cluster with the flags of the line
# `aenv cluster join-command` prints on a server, and waits until it has
# joined. Running it again with the same binaries changes nothing and keeps
# the service running (and the server's API key, the node's certificate).
# Run as root from the repository (or an unpacked copy of it).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sudo scripts/install.sh [OPTIONS]
       sudo scripts/install.sh --node --join https://SERVER:8443 --token TOKEN --ca-hash sha256:... [OPTIONS]

Installs the aenv server as a service: Debian packages and runsc
(scripts/install-deps.sh), aenv and envd into PREFIX/bin, the base template
into DATA_DIR/base-rootfs, /etc/systemd/system/aenv.service and
/etc/default/aenv (written once, never overwritten), then starts the server
and waits until it answers. Without a running systemd (containers, some CI
machines) the server is started in the background with nohup instead.

With --node it installs a node agent (`aenv node`), which runs sandboxes
for a cluster's servers, the same way: aenv-node.service and
/etc/default/aenv-node, then it starts the agent and waits until it has
joined the cluster (registered with it: `aenv nodes` on a server lists it
ready). `aenv cluster join-command` on a server prints the line
`aenv node --join URL --token TOKEN --ca-hash HASH`: give install.sh --node
what follows `aenv node`. Nodes must reach the server's cluster listener
and its etcd: give the server --cluster-advertise ADDR:8443 and
--etcd-listen https://ADDR:2379 (or --etcd-endpoints) in its --server-opts.

Options:
  --prefix DIR        install binaries into DIR/bin (default: $PREFIX or /usr/local)
  --bin-dir DIR       take prebuilt aenv and envd from DIR instead of `make build`
  --listen ADDR       server: address of the API and sandbox proxy (default
                      127.0.0.1:8000, plain HTTP; beyond loopback, e.g. :8000,
                      it serves HTTPS with a certificate of the cluster's own CA);
                      node: address of the node API and sandbox traffic (default :8100)
  --data-dir DIR      durable state: API key or node certificate, templates
                      (default /var/lib/aenv)
  --run-dir DIR       state that dies with the host (default /run/aenv)
  --unit-name NAME    systemd unit NAME.service, settings /etc/default/NAME,
                      pid file /run/NAME.pid, log /var/log/NAME.log
                      (default aenv; with --node, aenv-node)
  --server-opts STR   more `aenv server` flags, kept in AENV_OPTS
                      (e.g. "--domain sbx.example.com --warm-pool 4")
  --skip-deps         do not run scripts/install-deps.sh (already done)
  --no-start          install everything but do not start the service
  -h, --help          this help

Node agent:
  --node              install a node agent instead of a server
  --join URL          a server's cluster listener, https://SERVER:8443
  --token TOKEN       the join token (also --token-file FILE, or $AENV_JOIN_TOKEN,
                      which keep it off this command line); needed until the
                      node has joined, not after
  --token-file FILE   file holding the join token
  --ca-hash HASH      the cluster CA's hash, sha256:..., which the server must
                      prove it holds before the token is sent
  --advertise H:P     where servers reach this node (default: --listen if it
                      names an address, else this host's address on its route
                      to the --join server, at --listen's port)
  --on-stop WHAT      what stopping the agent does with its sandboxes: drain
                      (default: the cluster moves them to other nodes), keep
                      (a restart within 10 s takes them over) or kill
  --node-opts STR     more `aenv node` flags, kept in AENV_NODE_OPTS
                      (e.g. "--store s3://bucket/aenv --node-id worker-1")

The join token goes to DATA_DIR/secrets/join-token (mode 0600) for the
agent's first start, and is removed once the node has joined: the node
keeps the certificate it was given in DATA_DIR/secrets (node.crt, node.key)
and renews it itself, so restarts need no token. A node that was down
longer than its certificate lasts (7 days) joins again with a new token:
run this command again with one. While the node runs with a certificate, a
token given again is not used. With --no-start the token stays in its file
until the first start; run this command again without --no-start to start
the agent, wait for the join and remove it.

--listen, --data-dir, --run-dir, --server-opts and the node's --join,
--ca-hash, --advertise, --on-stop and --node-opts only apply when the
settings file is written, i.e. on the first install; afterwards edit
/etc/default/NAME and restart the service. scripts/uninstall.sh undoes it
(--node, or --unit-name NAME, for a node agent).
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

prefix=${PREFIX:-/usr/local}
bin_dir=""
listen=""
data_dir=/var/lib/aenv
run_dir=/run/aenv
unit=""
server_opts=""
node=0
join=""
token=""
token_from=""
ca_hash=""
advertise=""
on_stop=drain
node_opts=""
skip_deps=0
start=1
declare -A given=()

die() { echo "install: $*" >&2; exit 1; }
say() { echo "install: $*"; }

while [ $# -gt 0 ]; do
  opt=$1
  val=""
  case $opt in
    --*=*) val=${opt#*=}; opt=${opt%%=*} ;;
    --prefix | --bin-dir | --listen | --data-dir | --run-dir | --unit-name | --server-opts | \
      --join | --token | --token-file | --ca-hash | --advertise | --on-stop | --node-opts)
      [ $# -ge 2 ] || die "$opt needs a value (see --help)"
      val=$2
      shift
      ;;
  esac
  case $opt in
    --prefix) prefix=$val ;;
    --bin-dir) bin_dir=$val ;;
    --listen) listen=$val ;;
    --data-dir) data_dir=$val ;;
    --run-dir) run_dir=$val ;;
    --unit-name) unit=${val%.service} ;;
    --server-opts) server_opts=$val ;;
    --node) node=1 ;;
    --join) join=$val ;;
    --token) token=$val ;;
    --token-file) token_from=$val ;;
    --ca-hash) ca_hash=$val ;;
    --advertise) advertise=$val ;;
    --on-stop) on_stop=$val ;;
    --node-opts) node_opts=$val ;;
    --skip-deps) skip_deps=1 ;;
    --no-start) start=0 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  given[$opt]=1
  shift
done

[ "$(id -u)" = 0 ] || die "run as root (sandboxes need namespaces, cgroups and nftables)"
if [ "$node" = 1 ]; then
  [ -z "${given[--server-opts]:-}" ] || die "--server-opts is the server's: a node agent's flags go in --node-opts"
  unit=${unit:-aenv-node}
  listen=${listen:-:8100}
  what="node agent"
else
  for opt in --join --token --token-file --ca-hash --advertise --on-stop --node-opts; do
    [ -z "${given[$opt]:-}" ] || die "$opt is for a node agent: add --node (a server joins another with --server-opts)"
  done
  unit=${unit:-aenv}
  listen=${listen:-127.0.0.1:8000}
  what="server"
fi
[[ $unit =~ ^[A-Za-z0-9_.@-]+$ ]] || die "--unit-name $unit: letters, digits and _ . @ - only"
for d in "$prefix" "$data_dir" "$run_dir"; do
  [[ $d == /* ]] || die "$d: give an absolute path"
  [[ $d =~ [[:space:]] ]] && die "$d: paths with spaces are not supported"
done
[[ $listen == *:* ]] || die "--listen $listen: give HOST:PORT or :PORT"

unit_file=/etc/systemd/system/$unit.service
env_file=/etc/default/$unit
pid_file=/run/$unit.pid
log_file=/var/log/$unit.log
cache=${AENV_CACHE:-/var/cache/aenv}
bin=$prefix/bin/aenv

have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

# envval KEY FILE prints KEY's value in a KEY=value file (the last one wins,
# like systemd), without evaluating anything.
envval() {
  sed -n "s/^[[:space:]]*$1=//p" "$2" | tail -1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}

# A settings file of the other kind (a server's for --node, or a node's
# without it) is another service's: never take it over.
if [ -e "$env_file" ]; then
  if grep -q '^[[:space:]]*AENV_JOIN=' "$env_file"; then
    [ "$node" = 1 ] || die "$env_file is a node agent's settings: add --node, or give another --unit-name"
  elif [ "$node" = 1 ]; then
    die "$env_file is a server's settings, not a node agent's: give another --unit-name"
  fi
fi

# --- the node's join, checked before anything is installed --------------------

if [ "$node" = 1 ]; then
  case $on_stop in keep | drain | kill) ;; *) die "--on-stop $on_stop: keep, drain or kill" ;; esac
  [ -z "$join" ] || [[ $join == https://* ]] ||
    die "--join $join: install.sh joins over https, with the line 'aenv cluster join-command' prints on a server"
  [ -z "$ca_hash" ] || [[ $ca_hash =~ ^sha256:[0-9a-fA-F]{64}$ ]] || die "--ca-hash $ca_hash: want sha256: and 64 hex digits"
  [ -z "$advertise" ] || [[ $advertise == *:* ]] || die "--advertise $advertise: give HOST:PORT"
  if [ -n "$token_from" ]; then
    [ -z "${given[--token]:-}" ] || die "give --token or --token-file, not both"
    [ -r "$token_from" ] || die "--token-file $token_from: cannot read it"
    token=$(cat "$token_from")
  elif [ -z "${given[--token]:-}" ]; then
    token=${AENV_JOIN_TOKEN:-}
  fi
  token=${token//[[:space:]]/}
  if [ -e "$env_file" ]; then
    node_data=$(envval AENV_DATA_DIR "$env_file")
    node_data=${node_data:-/var/lib/aenv}
  else
    node_data=$data_dir
    [ -n "$join" ] || die "--join URL is needed (the first install writes it to $env_file): 'aenv cluster join-command' on a server prints it"
    [ -n "$ca_hash" ] || die "--ca-hash sha256:... is needed: 'aenv cluster join-command' on a server prints it"
  fi
  cert_file=$node_data/secrets/node.crt
  # A token left by an install with --no-start counts.
  waiting_token=$node_data/secrets/join-token
  [ ! -e "$env_file" ] || waiting_token=$(envval AENV_TOKEN_FILE "$env_file")
  if [ -z "$token" ] && [ ! -e "$cert_file" ] && [ ! -s "${waiting_token:-/nonexistent}" ]; then
    die "give the join token (--token TOKEN, --token-file FILE or \$AENV_JOIN_TOKEN): this node has not joined yet (no $cert_file)"
  fi
fi

# alive PID: a running process, not a zombie.
alive() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# ours PID: the process runs this install's aenv binary (even if replaced).
ours() {
  alive "$1" || return 1
  local exe want
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  want=$(readlink -f "$prefix/bin")/aenv
  [ "$exe" = "$want" ]
}

# nohup_pid prints the pid of this install's background service, if running.
nohup_pid() {
  local pid
  pid=$(cat "$pid_file" 2>/dev/null) || return 1
  ours "$pid" || return 1
  echo "$pid"
}

# stop_pid PID stops the background service; a draining node agent may
# take as long as the unit gives it (TimeoutStopSec).
stop_pid() {
  local pid=$1 half_secs=120
  [ "$node" = 1 ] && [ "$(envval AENV_ON_STOP "$env_file")" != keep ] && half_secs=1320
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 "$half_secs"); do
    alive "$pid" || return 0
    sleep 0.5
  done
  say "$what $pid still running after $((half_secs / 2))s: killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

# --- prerequisites and binaries ---------------------------------------------

if [ "$skip_deps" = 0 ]; then
  "$here/scripts/install-deps.sh"
fi
command -v runsc >/dev/null || die "runsc is not on PATH (run scripts/install-deps.sh)"

if [ -z "$bin_dir" ]; then
  say "building aenv and envd (make build)"
  make -C "$here" --no-print-directory build
  bin_dir=$here/bin
fi
for b in aenv envd; do
  [ -x "$bin_dir/$b" ] || die "$bin_dir/$b is missing or not executable"
done

changed=0
mkdir -p "$prefix/bin"
for b in aenv envd; do
  if ! cmp -s "$bin_dir/$b" "$prefix/bin/$b"; then
    # Replace by rename: a running server keeps its (old) binary.
    cp "$bin_dir/$b" "$prefix/bin/.$b.new.$$"
    chmod 0755 "$prefix/bin/.$b.new.$$"
    mv -f "$prefix/bin/.$b.new.$$" "$prefix/bin/$b"
    say "installed $prefix/bin/$b"
    changed=1
  fi
done

# --- settings and unit -------------------------------------------------------

# esc makes a value safe on the right of a sed s|||.
esc() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }

# derive_advertise prints HOST:PORT of this host's address on its route to
# the --join server, at --listen's port (where servers will reach the node).
derive_advertise() {
  local host=${join#https://} ip src
  host=${host%%/*}
  case $host in
    \[*) host=${host#\[}; host=${host%%]*} ;;
    *) host=${host%:*} ;;
  esac
  if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then
    ip=$host
  else
    ip=$(getent ahosts "$host" 2>/dev/null | awk 'NR == 1 { print $1 }')
  fi
  [ -n "$ip" ] || return 1
  src=$(ip -o route get "$ip" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p')
  [ -n "$src" ] || return 1
  case $src in
    *:*) echo "[$src]:${listen##*:}" ;;
    *) echo "$src:${listen##*:}" ;;
  esac
}

if [ ! -e "$env_file" ]; then
  if [ "$node" = 1 ]; then
    case ${listen%:*} in
      "" | 0.0.0.0 | "[::]" | "::")
        if [ -z "$advertise" ]; then
          advertise=$(derive_advertise) ||
            die "--listen $listen names every address, and no route to $join tells this host's: give --advertise HOST:PORT (where servers reach this node)"
          say "servers will reach this node at $advertise (its address on the route to $join; --advertise to change)"
        fi
        ;;
    esac
    sed -e "s|^AENV_JOIN=.*|AENV_JOIN=$(esc "$join")|" \
      -e "s|^AENV_CA_HASH=.*|AENV_CA_HASH=$(esc "$ca_hash")|" \
      -e "s|^AENV_TOKEN_FILE=.*|AENV_TOKEN_FILE=$(esc "$data_dir")/secrets/join-token|" \
      -e "s|^AENV_LISTEN=.*|AENV_LISTEN=$(esc "$listen")|" \
      -e "s|^AENV_ADVERTISE=.*|AENV_ADVERTISE=$(esc "$advertise")|" \
      -e "s|^AENV_DATA_DIR=.*|AENV_DATA_DIR=$(esc "$data_dir")|" \
      -e "s|^AENV_RUN_DIR=.*|AENV_RUN_DIR=$(esc "$run_dir")|" \
      -e "s|^AENV_ON_STOP=.*|AENV_ON_STOP=$(esc "$on_stop")|" \
      -e "s|^AENV_BASE_ROOTFS=.*|AENV_BASE_ROOTFS=$(esc "$data_dir")/base-rootfs|" \
      -e "s|^AENV_NODE_OPTS=.*|AENV_NODE_OPTS=$(esc "$node_opts")|" \
      -e "s|systemctl restart aenv-node|systemctl restart $unit|" \
      "$here/deploy/aenv-node.default" >"$env_file.new.$$"
  else
    sed -e "s|^AENV_LISTEN=.*|AENV_LISTEN=$(esc "$listen")|" \
      -e "s|^AENV_DATA_DIR=.*|AENV_DATA_DIR=$(esc "$data_dir")|" \
      -e "s|^AENV_RUN_DIR=.*|AENV_RUN_DIR=$(esc "$run_dir")|" \
      -e "s|^AENV_BASE_ROOTFS=.*|AENV_BASE_ROOTFS=$(esc "$data_dir")/base-rootfs|" \
      -e "s|^AENV_OPTS=.*|AENV_OPTS=$(esc "$server_opts")|" \
      -e "s|systemctl restart aenv|systemctl restart $unit|" \
      "$here/deploy/aenv.default" >"$env_file.new.$$"
  fi
  chmod 0600 "$env_file.new.$$" # it may come to hold AENV_API_KEY or a store's keys
  mv -f "$env_file.new.$$" "$env_file"
  say "wrote $env_file"
  changed=1
else
  # Options the file has other values for: the file wins.
  declare -A key_of=([--listen]=AENV_LISTEN [--data-dir]=AENV_DATA_DIR [--run-dir]=AENV_RUN_DIR
    [--server-opts]=AENV_OPTS [--join]=AENV_JOIN [--ca-hash]=AENV_CA_HASH [--advertise]=AENV_ADVERTISE
    [--on-stop]=AENV_ON_STOP [--node-opts]=AENV_NODE_OPTS)
  declare -A val_of=([--listen]=$listen [--data-dir]=$data_dir [--run-dir]=$run_dir [--server-opts]=$server_opts
    [--join]=$join [--ca-hash]=$ca_hash [--advertise]=$advertise [--on-stop]=$on_stop [--node-opts]=$node_opts)
  for opt in "${!key_of[@]}"; do
    if [ -n "${given[$opt]:-}" ] && [ "$(envval "${key_of[$opt]}" "$env_file")" != "${val_of[$opt]}" ]; then
      say "keeping $env_file as it is (ignoring $opt ${val_of[$opt]}): edit it, then restart the $what"
    fi
  done
fi

# The settings in effect, with the unit's defaults for missing ones.
setting() {
  local v
  v=$(envval "$1" "$env_file")
  echo "${v:-$2}"
}
listen=$(setting AENV_LISTEN "$([ "$node" = 1 ] && echo :8100 || echo 127.0.0.1:8000)")
data_dir=$(setting AENV_DATA_DIR /var/lib/aenv)
run_dir=$(setting AENV_RUN_DIR /run/aenv)
base=$(envval AENV_BASE_ROOTFS "$env_file")
if [ "$node" = 1 ]; then
  join=$(setting AENV_JOIN "")
  ca_hash=$(setting AENV_CA_HASH "")
  token_file=$(setting AENV_TOKEN_FILE /var/lib/aenv/secrets/join-token)
  advertise=$(setting AENV_ADVERTISE "")
  on_stop=$(setting AENV_ON_STOP drain)
  node_opts=$(setting AENV_NODE_OPTS "")
  template=$here/deploy/aenv-node.service
  default_unit=aenv-node
else
  server_opts=$(envval AENV_OPTS "$env_file")
  api_key_override=$(envval AENV_API_KEY "$env_file")
  template=$here/deploy/aenv.service
  default_unit=aenv
fi

unit_text=$(sed -e "s|^ExecStart=/usr/local/bin/aenv |ExecStart=$(esc "$bin") |" \
  -e "s|/etc/default/$default_unit\\b|$env_file|g" \
  -e "s|/etc/systemd/system/$default_unit.service|$unit_file|g" \
  -e "s|systemctl restart $default_unit\\b|systemctl restart $unit|g" \
  "$template")
unit_changed=0
if [ "$(cat "$unit_file" 2>/dev/null)" != "$unit_text" ]; then
  mkdir -p "$(dirname "$unit_file")"
  printf '%s\n' "$unit_text" >"$unit_file.new.$$"
  chmod 0644 "$unit_file.new.$$"
  mv -f "$unit_file.new.$$" "$unit_file"
  say "wrote $unit_file"
  unit_changed=1
  changed=1
fi

mkdir -p "$data_dir"
chmod 0700 "$data_dir"

# --- the base template -------------------------------------------------------

if [ -n "$base" ] && [ ! -x "$base/bin/bash" ]; then
  rm -rf "$base.copying"
  if [ -x "$cache/base-rootfs/bin/bash" ] && [ "$(readlink -f "$cache/base-rootfs")" != "$(readlink -f "$base")" ]; then
    say "copying the base template from $cache/base-rootfs"
    mkdir -p "$(dirname "$base")"
    cp -a "$cache/base-rootfs" "$base.copying"
    rm -rf "$base"
    mv "$base.copying" "$base"
  else
    say "building the base template into $base (Debian packages; a few minutes, once)"
    "$bin" template build-base "$base"
  fi
  changed=1
fi

# --- kernel settings -----------------------------------------------------------

# Every task in a sandbox is a host task too (gVisor's systrap runs some of
# its own per guest thread): the kernel's default of 32768 pids is a few
# busy sandboxes' worth. The server keeps its sandboxes to 3/4 of it.
pid_max_want=4194304
if [ "$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0)" -lt "$pid_max_want" ]; then
  if sysctl -qw kernel.pid_max="$pid_max_want" 2>/dev/null; then
    say "raised kernel.pid_max to $pid_max_want (room for the sandboxes' tasks)"
  else
    say "could not raise kernel.pid_max (a container without sysctl rights?); sandboxes get 3/4 of $(cat /proc/sys/kernel/pid_max)"
  fi
fi
# Kept across reboots for the host's main install only (not for scratch
# installs under another unit name, such as the install test's).
if [ "$unit" = "$default_unit" ] && [ -d /etc/sysctl.d ] && [ ! -f /etc/sysctl.d/90-aenv.conf ]; then
  echo "# aenv: room for the tasks of many sandboxes (scripts/install.sh)" >/etc/sysctl.d/90-aenv.conf
  echo "kernel.pid_max = $pid_max_want" >>/etc/sysctl.d/90-aenv.conf
fi

# --- the join token ------------------------------------------------------------

# The token is written for a start that may join: never while the node runs
# with its certificate (it renews that), and removed again once it joined
# or the install failed (with --no-start: at the join, by the next run).
wrote_token=0
if [ "$node" = 1 ] && [ -n "$token" ]; then
  cert_file=$data_dir/secrets/node.crt
  running=0
  if have_systemd; then
    systemctl is-active --quiet "$unit" && running=1
  elif nohup_pid >/dev/null; then
    running=1
  fi
  if [ "$running" = 1 ] && [ -e "$cert_file" ]; then
    say "the node agent runs and holds its certificate ($cert_file): the join token is not needed, and not kept"
  else
    mkdir -p "$(dirname "$token_file")"
    chmod 0700 "$(dirname "$token_file")"
    (umask 077 && printf '%s\n' "$token" >"$token_file.new.$$")
    mv -f "$token_file.new.$$" "$token_file"
    wrote_token=1
    [ "$start" = 0 ] || trap 'rm -f "$token_file"' EXIT
  fi
fi

# --- start -------------------------------------------------------------------

# The server speaks plain HTTP on loopback and HTTPS beyond it, with a
# certificate of the cluster's CA (<data-dir>/secrets/ca.crt).
url_of() {
  local host=${1%:*} port=${1##*:} scheme=https
  case $host in 127.* | localhost | "[::1]") scheme=http ;; esac
  case $host in "" | 0.0.0.0 | "[::]" | "::") host=localhost ;; esac
  echo "$scheme://$host:$port"
}
url=$(url_of "$listen")
ca_file=$data_dir/secrets/ca.crt
healthy() {
  [ "$node" = 0 ] || return 1 # a node agent's API is the cluster's servers' only (mutual TLS)
  case $url in
    https:*) [ -r "$ca_file" ] && curl -fsS -m 5 --cacert "$ca_file" -o /dev/null "$url/health" 2>/dev/null ;;
    *) curl -fsS -m 5 -o /dev/null "$url/health" 2>/dev/null ;;
  esac
}

# The agent logs this line once it has joined and registered with the
# cluster (agent.Start), when the servers' `GET /nodes` lists it.
ready_line='msg="aenv node ready"'

# start_log prints what the service logged since it last started.
start_log() {
  if [ "$mode" = systemd ]; then
    local inv
    inv=$(systemctl show -p InvocationID --value "$unit" 2>/dev/null)
    [ -n "$inv" ] && journalctl -o cat --no-pager "_SYSTEMD_INVOCATION_ID=$inv" 2>/dev/null
  else
    awk '/^--- .* starting / { n = 0; delete l } { l[++n] = $0 } END { for (i = 1; i <= n; i++) print l[i] }' "$log_file" 2>/dev/null
  fi
}
node_ready() { start_log | grep -qF "$ready_line"; }

start_nohup() {
  mkdir -p "$(dirname "$log_file")" "$(dirname "$pid_file")"
  local envs=()
  mapfile -t envs < <(grep -E '^[[:space:]]*[A-Za-z_][A-Za-z0-9_]*=' "$env_file" |
    sed -e 's/^[[:space:]]*//' -e 's/^\([^=]*\)="\(.*\)"$/\1=\2/' -e "s/^\\([^=]*\\)='\\(.*\\)'\$/\\1=\\2/")
  local opts=() cmd=()
  set -f
  # shellcheck disable=SC2206 # split like systemd splits $AENV_OPTS
  if [ "$node" = 1 ]; then opts=($node_opts); else opts=($server_opts); fi
  set +f
  # The unit's ExecStart, as systemd would run it (an empty setting is an
  # empty argument).
  if [ "$node" = 1 ]; then
    cmd=("$bin" node --join "$join" --ca-hash "$ca_hash" --token-file "$token_file" --listen "$listen"
      --advertise "$advertise" --data-dir "$data_dir" --run-dir "$run_dir" --on-stop "$on_stop" "${opts[@]}")
  else
    cmd=("$bin" server --listen "$listen" --data-dir "$data_dir" --run-dir "$run_dir" "${opts[@]}")
  fi
  echo "--- $(date -Is) starting $bin ${cmd[1]}" >>"$log_file"
  # The child writes its own pid, then becomes the service: in a session of
  # its own, so that nothing the installer's terminal does reaches it.
  # shellcheck disable=SC2016 # $$ and $@ are the child shell's
  (cd / && exec env "${envs[@]}" nohup setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pid_file" "${cmd[@]}") \
    </dev/null >>"$log_file" 2>&1 &
  for _ in $(seq 1 50); do
    [ -s "$pid_file" ] && ours "$(cat "$pid_file")" && return 0
    sleep 0.1
  done
  return 0 # the wait below reports a service that died
}

mode=systemd
if [ "$start" = 0 ]; then
  mode=none
  if have_systemd; then
    systemctl daemon-reload
    systemctl enable --quiet "$unit"
  fi
  say "not starting the $what (--no-start)"
elif have_systemd; then
  [ "$unit_changed" = 1 ] && systemctl daemon-reload
  systemctl enable --quiet "$unit"
  if systemctl is-active --quiet "$unit"; then
    if [ "$changed" = 1 ]; then
      say "restarting $unit (binaries or settings changed)"
      systemctl restart "$unit"
    else
      say "nothing changed; $unit keeps running"
    fi
  else
    healthy && die "something else answers on $url (another aenv server?): stop it or install with --listen"
    say "starting $unit"
    systemctl start "$unit"
  fi
else
  mode="nohup"
  say "systemd is not running here (no /run/systemd/system): starting the $what with nohup"
  say "  (pid in $pid_file, log in $log_file; it will not start again at boot)"
  if pid=$(nohup_pid); then
    if [ "$changed" = 1 ]; then
      say "restarting the $what (pid $pid; binaries or settings changed)"
      stop_pid "$pid"
      start_nohup
    else
      say "nothing changed; the $what keeps running (pid $pid)"
    fi
  else
    if [ -e "$pid_file" ]; then rm -f "$pid_file"; fi
    if healthy; then
      die "something else answers on $url (another aenv server?): stop it or install with --listen"
    fi
    start_nohup
  fi
fi

if [ "$mode" = none ]; then
  if have_systemd; then
    say "start it with: systemctl start $unit"
  else
    say "start it by running this install.sh command again without --no-start"
  fi
  if [ "$wrote_token" = 1 ]; then
    say "the join token waits in $token_file (mode 0600) for the first start; remove it once the node has joined"
  fi
  exit 0
fi

# up reports whether the service is up: the server answers /health, the node
# agent logged its join since its start.
up() {
  if [ "$node" = 1 ]; then node_ready; else healthy; fi
}
# failed_log prints the end of the service's log, for a failure.
failed_log() {
  if [ "$mode" = nohup ]; then
    start_log | tail -n 30 >&2
  else
    journalctl -u "$unit" -n 30 --no-pager >&2 || true
  fi
}
# join_failed stops an agent that never joined: it would retry with no
# token (removed below), over and over.
join_failed() {
  [ "$node" = 1 ] && [ ! -e "$data_dir/secrets/node.crt" ] || return 0
  if [ "$mode" = systemd ]; then
    systemctl stop "$unit" || true
  elif pid=$(nohup_pid); then
    stop_pid "$pid"
  fi
}

if [ "$node" = 1 ]; then
  say "waiting until the node agent has joined $join (the first start may build the base template: up to 10 minutes)"
else
  say "waiting for $url/health (the first start may build the base template: up to 10 minutes)"
fi
restarts=0
[ "$mode" = systemd ] && restarts=$(systemctl show -p NRestarts --value "$unit" 2>/dev/null || echo 0)
for _ in $(seq 1 600); do
  up && break
  if [ "$mode" = nohup ]; then
    if ! nohup_pid >/dev/null; then
      echo "install: the $what exited; the end of $log_file:" >&2
      failed_log
      join_failed
      exit 1
    fi
  elif systemctl is-failed --quiet "$unit" ||
    [ "$(systemctl show -p NRestarts --value "$unit" 2>/dev/null || echo 0)" != "$restarts" ]; then
    echo "install: $unit failed:" >&2
    failed_log
    join_failed
    exit 1
  fi
  sleep 1
done
if ! up; then
  failed_log
  join_failed
  if [ "$node" = 1 ]; then die "the node agent did not join within 10 minutes"; fi
  die "$url/health did not answer within 10 minutes"
fi

if [ "$mode" = systemd ]; then
  manage="systemctl status|restart|stop $unit; logs: journalctl -u $unit"
else
  uninstall_flags=""
  if [ "$unit" != "$default_unit" ]; then
    uninstall_flags=" --unit-name $unit"
  elif [ "$node" = 1 ]; then
    uninstall_flags=" --node"
  fi
  manage="log: $log_file; stop: sudo $here/scripts/uninstall.sh$uninstall_flags"
fi

if [ "$node" = 1 ]; then
  if [ -e "$token_file" ]; then
    rm -f "$token_file"
    say "removed the join token ($token_file): the node renews its certificate without it"
  fi
  line=$(start_log | grep -F "$ready_line" | tail -1)
  node_id=$(printf '%s\n' "$line" | sed -n 's/.* node_id=\([^ ]*\).*/\1/p')
  at=$(printf '%s\n' "$line" | sed -n 's/.* advertise=\([^ ]*\).*/\1/p')
  cat <<EOF

aenv node ${node_id:-agent} has joined the cluster of $join
  servers reach it at: ${at:-$advertise}
  certificate:         $data_dir/secrets/node.crt (renewed by the node)
  settings:            $env_file
  manage:              $manage
  on a server:         aenv nodes; aenv node drain ${node_id:-ID}; aenv node rm ${node_id:-ID}
EOF
  exit 0
fi

key_file=$data_dir/secrets/api-key
if [ -n "$api_key_override" ]; then
  key_where="AENV_API_KEY in $env_file"
  key_cmd="sudo sed -n 's/^AENV_API_KEY=//p' $env_file"
else
  key_where=$key_file
  key_cmd="sudo cat $key_file"
fi
cli_flags="" cli_env="" sdk_ca=""
[ "$url" = http://localhost:8000 ] || [ "$url" = http://127.0.0.1:8000 ] || cli_flags=" --url $url"
[ "$key_file" = /var/lib/aenv/secrets/api-key ] && [ -z "$api_key_override" ] || cli_env="AENV_API_KEY=\$($key_cmd) "
case $url in
  https:*)
    cli_flags="$cli_flags --ca-file $ca_file"
    sdk_ca="
  export NODE_EXTRA_CA_CERTS=$ca_file SSL_CERT_FILE=$ca_file   # the cluster's CA ('aenv cluster ca' prints it)" ;;
esac
cat <<EOF

aenv is running at $url
  API key:   $key_where
  settings:  $env_file
  manage:    $manage
  try it:    $cli_env$bin$cli_flags create base

Use the E2B SDK with:
  export E2B_API_URL=$url E2B_SANDBOX_URL=$url
  export E2B_API_KEY=\$($key_cmd)$sdk_ca
EOF
