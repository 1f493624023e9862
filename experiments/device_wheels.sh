#!/usr/bin/env bash
# Wheels for running the GPU check (experiments/gpu_check.py) on a machine that cannot reach a
# package registry but already holds PyTorch, transformers, peft, onnxruntime, tensorboard, numpy,
# scipy, opencv and PyYAML (an NVIDIA PyTorch image): what `spotlight train` on the local runtime
# imports beyond those, at cloud/fleet.lock's versions, downloaded here for that machine's Python
# (PY, default 3.12) into .whl/ (39 MB). There:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site python3 -m experiments.gpu_check --out runs/gpu-check
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-3.12}
NEEDED="diffusers pydantic pydantic-core annotated-types typing-inspection rapidocr pyclipper shapely omegaconf
        colorlog importlib-metadata zipp"
pins=()
for name in $NEEDED; do
    pin=$(grep -i "^${name}==" cloud/fleet.lock) || { echo "device_wheels: $name is not in cloud/fleet.lock" >&2; exit 2; }
    pins+=("$pin")
done
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${pins[@]}"
du -sh .whl
