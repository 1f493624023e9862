#!/usr/bin/env bash
# The GPU check in one command on a machine with the repository (experiments/gpu_check.py says what
# it does): sets up the virtualenv as `make` does, then runs the check. Arguments go to the check
# (--out, --folder, --steps, --size).
set -euo pipefail
cd "$(dirname "$0")/.."
make venv
exec .venv/bin/python -m experiments.gpu_check "$@"
