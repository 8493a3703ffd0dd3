# `make demo` and `make test` each set up .venv (and the Debian packages they need), then run.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PIP := $(VENV)/bin/pip
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/graftkit demo

test: setup
	$(PY) -m pytest -q -n 2 tests

bench: setup
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) runs build *.egg-info
