#!/usr/bin/env bash
# Set up the anchor for bench_graft.py: mergekit 0.1.5 in its own venv, benchmarks/.venv-mergekit.
#
# Separate from the project's .venv so that mergekit's pins (peft, accelerate, datasets, ...) never
# touch graftkit's environment. Idempotent: a stamp file records what was installed, and a second run
# with the same pins does nothing. Offline at run time: mergekit only reads local folders here.
#
#   bash benchmarks/setup_mergekit.sh            # PYTHON=python3.11 TORCH=torch==2.13.0 to override
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${MERGEKIT_VENV:-$HERE/.venv-mergekit}"
PYTHON="${PYTHON:-python3}"
# torch first, from the local CPU build: a bare torch requirement would pull a multi-GB CUDA build.
TORCH="${TORCH:-torch==2.13.0}"
MERGEKIT="mergekit==0.1.5"
# mergekit 0.1.5 declares transformers>=5.0,<6.0; pin one release inside that range so runs repeat.
TRANSFORMERS="${MERGEKIT_TRANSFORMERS:-transformers==5.24.0}"
STAMP="$VENV/.installed"
WANT="$TORCH $MERGEKIT $TRANSFORMERS"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/mergekit-yaml" ]]; then
    echo "mergekit venv up to date: $VENV"
    exit 0
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# numpy beside torch, so torch finds it from its first import on.
"$VENV/bin/pip" install -q "$TORCH" numpy
# Keep the torch just installed: constrain it so no dependency resolves to another build.
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$VENV/bin/pip" install -q "$MERGEKIT" "$TRANSFORMERS" "torch==$TORCH_VERSION"

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$VENV/bin/mergekit-yaml" --help >/dev/null
echo "$WANT" > "$STAMP"
echo "mergekit installed: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print("mergekit", m.version("mergekit"), "transformers", m.version("transformers"), "torch", m.version("torch"))'))"
