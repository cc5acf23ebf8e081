# Two commands set everything up on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck bench gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/asyncrt run

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy asyncrt devices scheduler

bench: $(STAMP)
	$(PY) bench/run_all.py

# On a machine with an NVIDIA GPU and cupy: the cuda tests, the copy matrix,
# ONNX's node tests on cuda:0 and the models beside ONNX Runtime (no venv:
# the GPU image's python, with wheels from .whl/ where it lacks a package).
gpu-check:
	bash bench/gpu_session.sh

clean:
	rm -rf $(VENV) build *.egg-info
