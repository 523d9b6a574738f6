#!/usr/bin/env bash
# tests/registry.sh start DIR PORT | stop DIR | status DIR: the CNCF distribution registry (Debian's
# docker-registry package) on 127.0.0.1:PORT, plain HTTP, its blobs and its pid under DIR. One copy for
# the test cluster (up.sh starts it on 5000 for the kubelet to pull from) and the release tests (a
# fixture starts one on a free port). Idempotent: starting a running one, or stopping a stopped one, is fine.
#
# Loopback only and without TLS or authentication: it is a test registry, reachable from this machine alone.
set -euo pipefail
REGISTRY_BIN=${REGISTRY_BIN:-/usr/bin/docker-registry}
usage() { echo "usage: $0 start DIR PORT | stop DIR | status DIR" >&2; exit 2; }
die() { printf '[registry] error: %s\n' "$*" >&2; exit 1; }

[ $# -ge 2 ] || usage
action=$1 dir=$2
pidfile="$dir/registry.pid"
running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case $action in
  start)
    [ $# = 3 ] || usage
    port=$3
    [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "port '$port' is not a TCP port"
    [ -x "$REGISTRY_BIN" ] || die "$REGISTRY_BIN missing: run make setup (Debian's docker-registry package)"
    if running; then
      grep -x "  addr: 127.0.0.1:$port" "$dir/config.yml" >/dev/null \
        || die "a registry from $dir already runs on another port (see $dir/config.yml)"
      exit 0
    fi
    mkdir -p "$dir/storage"
    # delete enabled: a test can remove what it pushed; the health check of the storage driver is the
    # registry's own, so /v2/ answers only once the storage is usable.
    cat > "$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog: {disabled: true}
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  headers:
    X-Content-Type-Options: [nosniff]
health:
  storagedriver: {enabled: true, interval: 10s, threshold: 3}
EOF
    setsid "$REGISTRY_BIN" serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
    echo $! > "$pidfile"
    for _ in $(seq 1 100); do
      if curl -sf -o /dev/null "http://127.0.0.1:$port/v2/"; then exit 0; fi
      running || { tail -5 "$dir/registry.log" >&2; die "the registry exited (log: $dir/registry.log)"; }
      sleep 0.1
    done
    tail -5 "$dir/registry.log" >&2
    die "the registry did not answer on 127.0.0.1:$port within 10 s (log: $dir/registry.log)"
    ;;
  stop)
    if running; then
      pid=$(cat "$pidfile")
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    ;;
  status)
    running || { echo "not running"; exit 1; }
    echo "running: $(sed -n 's/^  addr: //p' "$dir/config.yml") (pid $(cat "$pidfile"))"
    ;;
  *) usage ;;
esac
