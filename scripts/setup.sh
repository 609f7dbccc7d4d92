#!/usr/bin/env bash
# Create .venv and install opcollect with its test dependencies, plus torch for the torch backend's
# local runs. Idempotent; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch 2.13.0: on this project's machines pip takes the CPU wheel that lies on disk (find-links);
# elsewhere it comes from PyPI. Planning never needs it; `run` and `collect` on this host do.
"${pip[@]}" 'torch==2.13.0' 'numpy>=1.26'
"${pip[@]}" -e '.[test]'
