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

# In worker processes, one per core up to four: the 2-core CI machine ran
# the suite in 4 m 8 s so, against 5 m 16 s in one process.
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4

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
