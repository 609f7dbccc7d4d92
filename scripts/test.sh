#!/usr/bin/env bash
# Set up and run the whole test suite: the venv, a Docker engine (installed from Debian's packages and
# started when none answers), the registry-free local base image, a one-node Slurm cluster, then `nox -s tests`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
  fi
  if ! docker info >/dev/null 2>&1; then
    nohup dockerd >/tmp/opcollect-dockerd.log 2>&1 &
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  fi
fi
command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
.venv/bin/nox -s base-image
bash scripts/slurm_up.sh  # a one-node Slurm cluster (slurm-wlm, munge) for tests/test_slurm.py
.venv/bin/nox -s lint
.venv/bin/nox -s contract-vllm  # the vLLM runners' symbols against the pinned wheel (downloaded once)
.venv/bin/nox -s contract-sglang  # SGLang's, against its wheel and sglang-kernel's
.venv/bin/nox -s tests -- -q --require-docker --require-slurm "$@"
