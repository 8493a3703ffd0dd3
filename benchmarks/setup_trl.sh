#!/usr/bin/env bash
# Set up the anchor for bench_grpo.py: TRL 1.16 in its own venv, benchmarks/.venv-trl.
#
# Separate from the project's .venv so that TRL's requirements (accelerate, datasets, pandas, pyarrow,
# ...) never touch graftkit's environment. graftkit itself is installed editable without its
# dependencies (they are listed here, beside torch), so the TRL side builds the same tiny policy,
# prompts and reward from the same source. Idempotent: a stamp file records what was installed, and a
# second run with the same pins does nothing. Offline at run time: nothing is downloaded from the Hub.
#
#   bash benchmarks/setup_trl.sh            # PYTHON=python3.11 TORCH=torch==2.13.0 to override
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="${TRL_VENV:-$HERE/.venv-trl}"
PYTHON="${PYTHON:-python3}"
# torch first, from the local CPU build: a bare torch requirement would pull a multi-GB CUDA build.
TORCH="${TORCH:-torch==2.13.0}"
TRL="trl==1.16.0"
# TRL 1.16.0 declares transformers>=4.56.2 (and accelerate>=1.10.1, datasets>=4.7.0); pin the
# transformers release graftkit's own venv runs, so both sides load the model with the same code.
TRANSFORMERS="${TRL_TRANSFORMERS:-transformers==5.24.0}"
# graftkit's own requirements, read from pyproject.toml (torch and transformers are pinned above), so a
# requirement added to the project (plotly, for the report) reaches this venv too.
GRAFTKIT_DEPS="$("$PYTHON" - "$REPO/pyproject.toml" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print(" ".join(d for d in deps if re.split(r"[<>=!~ \[]", d)[0] not in ("torch", "transformers")))
PY
)"
STAMP="$VENV/.installed"
WANT="$TORCH $TRL $TRANSFORMERS accelerate datasets peft $GRAFTKIT_DEPS graftkit-editable($REPO)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]] \
    && "$VENV/bin/python" -c 'import trl, graftkit' 2>/dev/null; then
    echo "TRL venv up to date: $VENV"
    exit 0
fi

test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# numpy beside torch, so torch finds it from its first import on.
"$VENV/bin/pip" install -q "$TORCH" numpy
# Keep the torch just installed: constrain it so no dependency resolves to another build.
TORCH_VERSION="$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')"
# shellcheck disable=SC2086  # GRAFTKIT_DEPS is a list of requirements
"$VENV/bin/pip" install -q "$TRL" "$TRANSFORMERS" "accelerate>=1.10.1" "datasets>=4.7.0" peft \
    $GRAFTKIT_DEPS "torch==$TORCH_VERSION"
"$VENV/bin/pip" install -q --no-deps -e "$REPO"

HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_DISABLED=true \
    "$VENV/bin/python" -c 'from trl import GRPOConfig, GRPOTrainer; import graftkit, graftkit.agent, graftkit.webenv'
echo "$WANT" > "$STAMP"
echo "TRL installed: $VENV ($("$VENV/bin/python" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("trl", "transformers", "accelerate", "datasets", "torch")))'))"
