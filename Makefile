# Two entry points do all set-up by themselves: `make train` and `make test`.
# Each creates or updates the virtualenv in $(VENV) first (re-installing when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= experiments/tiny_dit.yaml
OUT ?= runs/$(basename $(notdir $(CONFIG)))
PYTEST_ARGS ?=
# Test processes (pytest-xdist): two on the 2-core CI machine (34.2 min on two with other work on the
# machine, against 35.4 min on one on a quiet one: docs/measurements.md); one thread each (tests/conftest.py).
# A module's tests stay on one worker (--dist loadscope, in collection order: tests/conftest.py says why).
TEST_WORKERS ?= 2

.PHONY: venv train test bench gpu-check clean sky-venv lock

venv: $(STAMP)

$(STAMP): pyproject.toml cloud/fleet.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# torch first, the build this machine needs (CPU without an NVIDIA GPU; SPOTLIGHT_TORCH=cpu|cuda forces one):
	@# a bare `torch` requirement with no torch present pulls several GB of CUDA wheels even without a GPU.
	$(PY) spotlight/install_torch.py
	@# The lock as constraints: the tests run on the versions a launched fleet's nodes install.
	@# Not --quiet: pip's bars (installing N/M packages) keep a minute of unpacking from looking hung.
	$(PY) -m pip install -c cloud/fleet.lock -e '.[dev]'
	touch $(STAMP)

# After changing a dependency: pin the fleet's environment to what this virtualenv has.
lock: $(STAMP)
	$(PY) -m cloud.fleet_lock

train: $(STAMP)
	$(VENV)/bin/spotlight train $(CONFIG) --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/spotlight bench throughput

# The GPU path end to end (experiments/gpu_check.py): Qwen-Image-sized iterations on one GPU, timed by
# phase, with the peak GPU memory against the estimate; without CUDA, the tiny CPU version. Builds its
# random-weight pipeline folder first (~43 GB, in ~/.cache/spotlight/check-real) unless it is there.
GPU_CHECK_OUT ?= runs/gpu-check-$(shell date +%Y%m%d-%H%M%S)
gpu-check: $(STAMP)
	$(PY) -m experiments.gpu_check --out $(GPU_CHECK_OUT)

# SkyPilot in its own virtualenv: it pins click<8.2, which the Hugging Face stack does not accept.
# `spotlight launch` runs its Python ($(SKY_VENV)/bin/python, or $SPOTLIGHT_SKY_PYTHON) as a subprocess.
SKY_VENV ?= .venv-sky
SKYPILOT_VERSION := 0.14.1

sky-venv: $(SKY_VENV)/.installed

$(SKY_VENV)/.installed:
	python3 -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install --quiet skypilot==$(SKYPILOT_VERSION)
	touch $@

clean:
	rm -rf $(VENV) runs .pytest_cache
