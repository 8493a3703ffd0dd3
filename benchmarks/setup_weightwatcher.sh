#!/usr/bin/env bash
# Set up the anchor for bench_rank.py: WeightWatcher 0.7.7 in its own venv, benchmarks/.venv-ww.
#
# Separate from the project's .venv so that WeightWatcher's requirements (pandas, matplotlib,
# powerlaw, scikit-learn, ...) never touch graftkit's environment. transformers is installed beside it
# (the same release graftkit's venv runs) so the anchor loads the benchmark's saved folder with the
# same code. Idempotent: a stamp file records what was installed, and a second run with the same pins
# does nothing. Offline at run time: WeightWatcher only reads the local folder.
#
#   bash benchmarks/setup_weightwatcher.sh      # PYTHON=python3.11 TORCH=torch==2.13.0 to override
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${WW_VENV:-$HERE/.venv-ww}"
PYTHON="${PYTHON:-python3}"
# torch first, from the local CPU build: a bare torch requirement would pull a multi-GB CUDA build.
TORCH="${TORCH:-torch==2.13.0}"
WW="weightwatcher==0.7.7"
TRANSFORMERS="${WW_TRANSFORMERS:-transformers==5.24.0}"
STAMP="$VENV/.installed"
WANT="$TORCH $WW $TRANSFORMERS safetensors"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]] \
    && "$VENV/bin/python" -c 'import weightwatcher' 2>/dev/null; then
    echo "WeightWatcher venv up to date: $VENV"
    exit 0
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# numpy beside torch, so torch finds it from its first import on.
"$VENV/bin/pip" install -q "$TORCH" numpy
# Keep the torch just installed: constrain it so no dependency resolves to another build.
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
"$VENV/bin/pip" install -q "$WW" "$TRANSFORMERS" safetensors "torch==$TORCH_VERSION"

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg "$VENV/bin/python" -c 'import weightwatcher, transformers'
echo "$WANT" > "$STAMP"
echo "WeightWatcher installed: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("weightwatcher", "transformers", "torch", "numpy", "scipy")))'))"
