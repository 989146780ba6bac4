#!/usr/bin/env bash
# Undoes scripts/install.sh, idempotently: stops the server or node agent
# (the systemd service, or the background process by its pid file), ends
# the sandboxes it left, removes the unit and the binaries. Keeps the data
# directory (API key or node certificate, templates, snapshots) and
# /etc/default/NAME unless --purge. Run as root.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sudo scripts/uninstall.sh [OPTIONS]

Stops the aenv server (or, with --node, the node agent install.sh --node
installed), kills the sandboxes it left running, and removes its systemd
unit and the aenv and envd binaries. The data directory (API key or the
node's certificate, templates, snapshots) and /etc/default/NAME are kept
unless --purge. A node agent's join token, if one is still waiting in its
file, is always removed.

Options:
  --node             the node agent: unit aenv-node unless --unit-name (also
                     taken when only aenv-node is installed, or when the unit
                     or settings named are a node agent's)
  --prefix DIR       where the binaries were installed (default: from the
                     unit's ExecStart, else $PREFIX or /usr/local)
  --unit-name NAME   the unit install.sh was given (default aenv, or aenv-node)
  --purge            also remove /etc/default/NAME, the data and run
                     directories, the log and /usr/local/bin/runsc
  --keep-runsc       with --purge: leave /usr/local/bin/runsc (other servers)
  -h, --help         this help

A node agent stops the way its settings say (AENV_ON_STOP; drain by
default: the cluster moves its sandboxes to other nodes first, which may
take minutes) and leaves the cluster. Its certificate stays valid until it
expires unless a server removes the node: `aenv node rm ID` there.
EOF
}

export PATH=$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
prefix=""
unit=""
node=0
purge=0
keep_runsc=0
left_running=""

die() { echo "uninstall: $*" >&2; exit 1; }
say() { echo "uninstall: $*"; }

while [ $# -gt 0 ]; do
  opt=$1
  val=""
  case $opt in
    --*=*) val=${opt#*=}; opt=${opt%%=*} ;;
    --prefix | --unit-name)
      [ $# -ge 2 ] || die "$opt needs a value (see --help)"
      val=$2
      shift
      ;;
  esac
  case $opt in
    --prefix) prefix=$val ;;
    --unit-name) unit=${val%.service} ;;
    --node) node=1 ;;
    --purge) purge=1 ;;
    --keep-runsc) keep_runsc=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done

[ "$(id -u)" = 0 ] || die "run as root"

# installed NAME: something of install.sh's under unit name NAME is here.
installed() { [ -e "/etc/systemd/system/$1.service" ] || [ -e "/etc/default/$1" ] || [ -e "/run/$1.pid" ]; }
if [ -z "$unit" ]; then
  if [ "$node" = 1 ]; then
    unit=aenv-node
  elif ! installed aenv && installed aenv-node; then
    say "no aenv server here, but a node agent (aenv-node): removing that"
    unit=aenv-node
  else
    unit=aenv
  fi
fi
[[ $unit =~ ^[A-Za-z0-9_.@-]+$ ]] || die "--unit-name $unit: letters, digits and _ . @ - only"

unit_file=/etc/systemd/system/$unit.service
env_file=/etc/default/$unit
pid_file=/run/$unit.pid
log_file=/var/log/$unit.log

# What was installed under this name tells its kind.
if grep -qs '^ExecStart=.*/bin/aenv node ' "$unit_file" || grep -qs '^[[:space:]]*AENV_JOIN=' "$env_file"; then
  node=1
elif [ -e "$unit_file" ] || [ -e "$env_file" ]; then
  [ "$node" = 0 ] || die "$unit is a server's install, not a node agent's (drop --node)"
fi
what=server
[ "$node" = 0 ] || what="node agent"

if [ -z "$prefix" ] && [ -f "$unit_file" ]; then
  prefix=$(sed -n 's#^ExecStart=\(/.*\)/bin/aenv \(server\|node\) .*#\1#p' "$unit_file" | tail -1)
fi
prefix=${prefix:-${PREFIX:-/usr/local}}

envval() {
  [ -f "$2" ] || return 0
  sed -n "s/^[[:space:]]*$1=//p" "$2" | tail -1 | sed -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}
data_dir=$(envval AENV_DATA_DIR "$env_file")
data_dir=${data_dir:-/var/lib/aenv}
run_dir=$(envval AENV_RUN_DIR "$env_file")
run_dir=${run_dir:-/run/aenv}
base=$(envval AENV_BASE_ROOTFS "$env_file")
if [ "$node" = 1 ]; then
  opts=$(envval AENV_NODE_OPTS "$env_file")
  token_file=$(envval AENV_TOKEN_FILE "$env_file")
  on_stop=$(envval AENV_ON_STOP "$env_file")
else
  opts=$(envval AENV_OPTS "$env_file")
  token_file=""
  on_stop=keep
fi

have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null; }

alive() {
  [ -n "$1" ] && [ -r "/proc/$1/stat" ] || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# ours PID: the process runs PREFIX/bin/aenv (or did, before it was replaced).
ours() {
  alive "$1" || return 1
  local exe want
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  exe=${exe% (deleted)}
  want=$(readlink -f "$prefix/bin" 2>/dev/null || echo "$prefix/bin")/aenv
  [ "$exe" = "$want" ]
}

# --- stop --------------------------------------------------------------------

if have_systemd && { [ -f "$unit_file" ] || systemctl cat "$unit" >/dev/null 2>&1; }; then
  if systemctl is-active --quiet "$unit"; then
    say "stopping $unit"
  fi
  systemctl disable --now --quiet "$unit" 2>/dev/null || systemctl stop "$unit" 2>/dev/null || true
fi

if [ -f "$pid_file" ]; then
  pid=$(cat "$pid_file" 2>/dev/null || true)
  if ours "$pid"; then
    # As long as the unit's TimeoutStopSec: a draining node agent moves
    # its sandboxes to other nodes first.
    half_secs=120
    [ "$node" = 1 ] && [ "${on_stop:-drain}" != keep ] && half_secs=1320
    say "stopping the $what (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 "$half_secs"); do
      alive "$pid" || break
      sleep 0.5
    done
    if alive "$pid"; then
      say "$what $pid still running after $((half_secs / 2))s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  elif [ -n "$pid" ] && alive "$pid"; then
    say "$pid_file names pid $pid, which is not $prefix/bin/aenv: leaving it alone (give --prefix if it is this $what)"
    left_running=$pid
  fi
  rm -f "$pid_file"
fi

# Sandboxes outlive a stopped server or node agent (the next start takes
# them over); uninstalling ends them, with its own settings.
if [ -x "$prefix/bin/aenv" ]; then
  cmd=server
  [ "$node" = 0 ] || cmd=node
  # shellcheck disable=SC2086 # the options are a list of flags, as in the unit
  if ! "$prefix/bin/aenv" "$cmd" --cleanup --data-dir "$data_dir" --run-dir "$run_dir" $opts >"$run_dir.cleanup.log" 2>&1; then
    say "removing the $what's leftover sandboxes failed:"
    tail -n 5 "$run_dir.cleanup.log" >&2
  fi
  rm -f "$run_dir.cleanup.log"
fi

# --- remove ------------------------------------------------------------------

if [ -e "$unit_file" ]; then
  rm -f "$unit_file"
  say "removed $unit_file"
  if have_systemd; then
    systemctl daemon-reload
    systemctl reset-failed "$unit" 2>/dev/null || true
  fi
fi

for b in aenv envd; do
  if [ -e "$prefix/bin/$b" ]; then
    rm -f "$prefix/bin/$b"
    say "removed $prefix/bin/$b"
  fi
done

# A join token never outlives the install that was given it.
if [ -n "$token_file" ] && [ -e "$token_file" ]; then
  rm -f "$token_file"
  say "removed the join token $token_file"
fi

# rmtree DIR removes DIR unless it is not a sensible thing to remove.
rmtree() {
  case $1 in
    "" | / | /bin | /boot | /dev | /etc | /home | /lib* | /proc | /root | /run | /sbin | /sys | /tmp | /usr | /usr/* | /var | /var/lib | /var/cache)
      say "not removing $1"
      return 0
      ;;
  esac
  [[ $1 == /* ]] || { say "not removing $1 (not an absolute path)"; return 0; }
  if [ -e "$1" ]; then
    # Never into a mount a killed server may have left behind.
    if rm -rf --one-file-system "$1" 2>/dev/null; then
      say "removed $1"
    else
      say "could not remove all of $1 (something is mounted in it?)"
    fi
  fi
}

if [ "$purge" = 1 ]; then
  [ -e "$env_file" ] && rm -f "$env_file" && say "removed $env_file"
  if [ -n "$base" ] && [[ $base != "$data_dir"/* ]] && [ -e "$base" ]; then
    say "keeping $base (the base template, outside $data_dir): remove it yourself if nothing else uses it"
  fi
  if [ -n "$left_running" ]; then
    # Its data may be a running service's: never pull it from under it.
    say "not removing $data_dir and $run_dir: pid $left_running, named by the pid file, still runs"
  else
    rmtree "$data_dir"
    rmtree "$run_dir"
  fi
  [ -e "$log_file" ] && rm -f "$log_file" && say "removed $log_file"
  if [ "$keep_runsc" = 0 ] && [ -e /usr/local/bin/runsc ]; then
    rm -f /usr/local/bin/runsc
    say "removed /usr/local/bin/runsc"
  fi
  if [ -d "${AENV_CACHE:-/var/cache/aenv}" ]; then
    say "keeping the build cache ${AENV_CACHE:-/var/cache/aenv} (runsc, base template): remove it yourself to reclaim the space"
  fi
else
  kept=()
  if [ -e "$data_dir" ]; then
    if [ "$node" = 1 ]; then kept+=("$data_dir (node certificate, templates)"); else kept+=("$data_dir (API key, templates)"); fi
  fi
  [ -e "$env_file" ] && kept+=("$env_file")
  [ ${#kept[@]} -eq 0 ] || say "kept ${kept[*]}; --purge removes them"
fi
if [ "$node" = 1 ]; then
  say "on a server of the cluster, 'aenv node rm ID' removes this node and refuses its certificate"
fi
say "done"
