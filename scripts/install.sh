#!/usr/bin/env bash
# Installs aenv as a service on a Debian 12 host, idempotently: the
# prerequisites (scripts/install-deps.sh), the aenv and envd binaries, the
# base template's root filesystem, a systemd unit and its settings file, then
# starts the server and waits until it answers. Running it again with the
# same binaries changes nothing and keeps the server (and its API key).
# Run as root from the repository (or an unpacked copy of it).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: sudo scripts/install.sh [OPTIONS]

Installs the aenv server as a service: Debian packages and runsc
(scripts/install-deps.sh), aenv and envd into PREFIX/bin, the base template
into DATA_DIR/base-rootfs, /etc/systemd/system/aenv.service and
/etc/default/aenv (written once, never overwritten), then starts the server
and waits until it answers. Without a running systemd (containers, some CI
machines) the server is started in the background with nohup instead.

Options:
  --prefix DIR        install binaries into DIR/bin (default: $PREFIX or /usr/local)
  --bin-dir DIR       take prebuilt aenv and envd from DIR instead of `make build`
  --listen ADDR       address of the API and sandbox proxy (default 127.0.0.1:8000,
                      plain HTTP; beyond loopback, e.g. :8000, it serves HTTPS
                      with a certificate of the cluster's own CA)
  --data-dir DIR      durable state: API key, templates (default /var/lib/aenv)
  --run-dir DIR       state that dies with the host (default /run/aenv)
  --unit-name NAME    systemd unit NAME.service, settings /etc/default/NAME,
                      pid file /run/NAME.pid, log /var/log/NAME.log (default aenv)
  --server-opts STR   more `aenv server` flags, kept in AENV_OPTS
                      (e.g. "--domain sbx.example.com --warm-pool 4")
  --skip-deps         do not run scripts/install-deps.sh (already done)
  --no-start          install everything but do not start the server
  -h, --help          this help

--listen, --data-dir, --run-dir and --server-opts only apply when the
settings file is written, i.e. on the first install; afterwards edit
/etc/default/aenv and restart the service.
EOF
}

here=$(cd "$(dirname "$0")/.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

prefix=${PREFIX:-/usr/local}
bin_dir=""
listen="127.0.0.1:8000"
data_dir=/var/lib/aenv
run_dir=/run/aenv
unit=aenv
server_opts=""
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
    --prefix | --bin-dir | --listen | --data-dir | --run-dir | --unit-name | --server-opts)
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
    --skip-deps) skip_deps=1 ;;
    --no-start) start=0 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  given[$opt]=1
  shift
done

[ "$(id -u)" = 0 ] || die "run as root (sandboxes need namespaces, cgroups and nftables)"
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

# nohup_pid prints the pid of this install's background server, if running.
nohup_pid() {
  local pid
  pid=$(cat "$pid_file" 2>/dev/null) || return 1
  ours "$pid" || return 1
  echo "$pid"
}

stop_pid() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 120); do
    alive "$pid" || return 0
    sleep 0.5
  done
  say "server $pid still running after 60s: killing it"
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

if [ ! -e "$env_file" ]; then
  sed -e "s|^AENV_LISTEN=.*|AENV_LISTEN=$(esc "$listen")|" \
    -e "s|^AENV_DATA_DIR=.*|AENV_DATA_DIR=$(esc "$data_dir")|" \
    -e "s|^AENV_RUN_DIR=.*|AENV_RUN_DIR=$(esc "$run_dir")|" \
    -e "s|^AENV_BASE_ROOTFS=.*|AENV_BASE_ROOTFS=$(esc "$data_dir")/base-rootfs|" \
    -e "s|^AENV_OPTS=.*|AENV_OPTS=$(esc "$server_opts")|" \
    -e "s|systemctl restart aenv|systemctl restart $unit|" \
    "$here/deploy/aenv.default" >"$env_file.new.$$"
  chmod 0600 "$env_file.new.$$" # it may come to hold AENV_API_KEY
  mv -f "$env_file.new.$$" "$env_file"
  say "wrote $env_file"
  changed=1
else
  for opt in --listen --data-dir --run-dir --server-opts; do
    if [ -n "${given[$opt]:-}" ]; then
      say "keeping $env_file as it is (ignoring $opt): edit it, then restart the server"
      break
    fi
  done
fi

# The settings in effect, with the unit's defaults for missing ones.
listen=$(envval AENV_LISTEN "$env_file")
listen=${listen:-127.0.0.1:8000}
data_dir=$(envval AENV_DATA_DIR "$env_file")
data_dir=${data_dir:-/var/lib/aenv}
run_dir=$(envval AENV_RUN_DIR "$env_file")
run_dir=${run_dir:-/run/aenv}
server_opts=$(envval AENV_OPTS "$env_file")
base=$(envval AENV_BASE_ROOTFS "$env_file")
api_key_override=$(envval AENV_API_KEY "$env_file")

unit_text=$(sed -e "s|^ExecStart=/usr/local/bin/aenv |ExecStart=$(esc "$bin") |" \
  -e "s|/etc/default/aenv\\b|$env_file|g" \
  -e "s|/etc/systemd/system/aenv.service|$unit_file|g" \
  -e "s|systemctl restart aenv\\b|systemctl restart $unit|g" \
  "$here/deploy/aenv.service")
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
if [ "$unit" = aenv ] && [ -d /etc/sysctl.d ] && [ ! -f /etc/sysctl.d/90-aenv.conf ]; then
  echo "# aenv: room for the tasks of many sandboxes (scripts/install.sh)" >/etc/sysctl.d/90-aenv.conf
  echo "kernel.pid_max = $pid_max_want" >>/etc/sysctl.d/90-aenv.conf
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
  case $url in
    https:*) [ -r "$ca_file" ] && curl -fsS -m 5 --cacert "$ca_file" -o /dev/null "$url/health" 2>/dev/null ;;
    *) curl -fsS -m 5 -o /dev/null "$url/health" 2>/dev/null ;;
  esac
}

start_nohup() {
  mkdir -p "$(dirname "$log_file")" "$(dirname "$pid_file")"
  local envs=()
  mapfile -t envs < <(grep -E '^[[:space:]]*[A-Za-z_][A-Za-z0-9_]*=' "$env_file" |
    sed -e 's/^[[:space:]]*//' -e 's/^\([^=]*\)="\(.*\)"$/\1=\2/' -e "s/^\\([^=]*\\)='\\(.*\\)'\$/\\1=\\2/")
  local opts=()
  set -f
  # shellcheck disable=SC2206 # split like systemd splits $AENV_OPTS
  opts=($server_opts)
  set +f
  echo "--- $(date -Is) starting $bin server" >>"$log_file"
  # The child writes its own pid, then becomes the server: in a session of
  # its own, so that nothing the installer's terminal does reaches it.
  # shellcheck disable=SC2016 # $$ and $@ are the child shell's
  (cd / && exec env "${envs[@]}" nohup setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pid_file" \
    "$bin" server --listen "$listen" --data-dir "$data_dir" --run-dir "$run_dir" "${opts[@]}") \
    </dev/null >>"$log_file" 2>&1 &
  for _ in $(seq 1 50); do
    [ -s "$pid_file" ] && ours "$(cat "$pid_file")" && return 0
    sleep 0.1
  done
  return 0 # the wait for /health below reports a server that died
}

mode=systemd
if [ "$start" = 0 ]; then
  mode=none
  if have_systemd; then
    systemctl daemon-reload
    systemctl enable --quiet "$unit"
  fi
  say "not starting the server (--no-start)"
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
  say "systemd is not running here (no /run/systemd/system): starting the server with nohup"
  say "  (pid in $pid_file, log in $log_file; it will not start again at boot)"
  if pid=$(nohup_pid); then
    if [ "$changed" = 1 ]; then
      say "restarting the server (pid $pid; binaries or settings changed)"
      stop_pid "$pid"
      start_nohup
    else
      say "nothing changed; the server keeps running (pid $pid)"
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
  exit 0
fi

say "waiting for $url/health (the first start may build the base template: up to 10 minutes)"
for _ in $(seq 1 600); do
  healthy && break
  if [ "$mode" = nohup ]; then
    if ! nohup_pid >/dev/null; then
      echo "install: the server exited; the end of $log_file:" >&2
      tail -n 30 "$log_file" >&2
      exit 1
    fi
  elif systemctl is-failed --quiet "$unit"; then
    echo "install: $unit failed:" >&2
    journalctl -u "$unit" -n 30 --no-pager >&2 || true
    exit 1
  fi
  sleep 1
done
if ! healthy; then
  if [ "$mode" = nohup ]; then tail -n 30 "$log_file" >&2; else journalctl -u "$unit" -n 30 --no-pager >&2 || true; fi
  die "$url/health did not answer within 10 minutes"
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
if [ "$mode" = systemd ]; then
  manage="systemctl status|restart|stop $unit; logs: journalctl -u $unit"
else
  manage="log: $log_file; stop: sudo $here/scripts/uninstall.sh$([ "$unit" = aenv ] || echo " --unit-name $unit")"
fi
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
