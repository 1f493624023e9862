# Two entry points do all set-up by themselves: `make train` and `make test`.
# Each creates or updates the virtualenv in $(VENV) first (re-installing when pyproject.toml changes).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= experiments/tiny_dit.yaml
OUT ?= runs/$(basename $(notdir $(CONFIG)))
PYTEST_ARGS ?=

.PHONY: venv train test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# The CPU build first: a bare `torch` requirement with no torch present pulls several GB of CUDA wheels.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

train: $(STAMP)
	$(VENV)/bin/spotlight train $(CONFIG) --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/spotlight bench throughput

clean:
	rm -rf $(VENV) runs .pytest_cache
