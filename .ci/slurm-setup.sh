#!/usr/bin/env bash
# Install what the Slurm tests run for real (idempotent): Debian 12's Slurm 22.05 controller, node daemon and client
# commands, and munge, its authentication. Nothing is started or configured here: each test session starts its own
# cluster (munged, slurmctld, two slurmd) in a temporary folder (tests/slurm/cluster.py), so the packages' own
# services are stopped again where the install started them.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
log() { printf '[slurm-setup] %s\n' "$*"; }

missing=()
for program in slurmctld slurmd munged; do [ -x "/usr/sbin/$program" ] || missing+=("$program"); done
command -v sbatch >/dev/null || missing+=(sbatch)
if [ "${#missing[@]}" -eq 0 ]; then log "Slurm and munge are installed"; exit 0; fi
log "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
  slurmctld slurmd slurm-client munge
# Where systemd runs, the packages start their services on the system's /etc/slurm (not ours): stop them.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true
fi
log "done: $(slurmctld -V)"
