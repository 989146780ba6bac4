#!/usr/bin/env bash
# One command from a fresh Debian 12 host to a command's output from inside a
# sandbox: installs the prerequisites, builds aenv, starts the server on its
# embedded defaults (if none is running), creates a sandbox from `base`, runs
# a command in it and prints the output. Run as root from the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

scripts/install-deps.sh
make build
# The base template's root filesystem, built once from Debian packages.
make base
base=${AENV_CACHE:-/var/cache/aenv}/base-rootfs

# Every task in a sandbox is a host task too: the kernel's default of 32768
# pids is a few busy sandboxes' worth (scripts/install.sh raises it too, and
# keeps it across reboots).
pid_max_want=4194304
if [ "$(cat /proc/sys/kernel/pid_max)" -lt "$pid_max_want" ]; then
  if sysctl -qw kernel.pid_max="$pid_max_want" 2>/dev/null; then
    echo "quickstart: raised kernel.pid_max to $pid_max_want (room for the sandboxes' tasks)"
  else
    echo "quickstart: could not raise kernel.pid_max; sandboxes get 3/4 of $(cat /proc/sys/kernel/pid_max)"
  fi
fi

url=http://localhost:8000
if ! curl -fsS "$url/health" >/dev/null 2>&1; then
  mkdir -p /var/log
  echo "quickstart: starting 'aenv server' (log: /var/log/aenv.log)"
  nohup bin/aenv server --base-rootfs "$base" >/var/log/aenv.log 2>&1 &
  echo $! >/run/aenv-quickstart.pid
  for _ in $(seq 1 600); do
    curl -fsS "$url/health" >/dev/null 2>&1 && break
    if ! kill -0 $! 2>/dev/null; then echo "quickstart: server exited:"; tail -20 /var/log/aenv.log; exit 1; fi
    sleep 1
  done
fi

id=$(bin/aenv create base --timeout 120)
echo "quickstart: created sandbox $id"
bin/aenv exec "$id" -- 'echo "hello from $(hostname) as $(whoami)"; python3 --version; uname -a'
bin/aenv rm "$id" >/dev/null
echo "quickstart: done. The server keeps running (API key: /var/lib/aenv/secrets/api-key); stop it with: kill \$(cat /run/aenv-quickstart.pid)"
