#!/usr/bin/env bash
# Make sure a docker engine answers, installing and starting one where none runs (as root).
# Debian packages: docker.io (engine 20.10, legacy builder), debootstrap (stand-in base),
# docker-compose v1 (SageMaker SDK local mode), shellcheck (make lint), docker-registry (a real
# registry server for the push tests, tests/delivery).
set -euo pipefail

log() { printf '[ensure-docker] %s\n' "$*"; }

if docker info >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    log "no docker engine answers and this is not root: start dockerd (or ask an admin), then retry"
    exit 1
fi
missing=()
for tool in dockerd debootstrap docker-compose shellcheck unshare docker-registry; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages for: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        docker.io debootstrap docker-compose shellcheck util-linux docker-registry >/dev/null
fi
log "starting dockerd (log: /var/log/dockerd.log)"
nohup dockerd >/var/log/dockerd.log 2>&1 &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        log "docker engine ready: $(docker version -f '{{.Server.Version}}')"
        exit 0
    fi
    sleep 1
done
log "dockerd did not answer within 60 s; last lines of its log:"
tail -20 /var/log/dockerd.log >&2
exit 1
