"""Activation-rank memory against the number of probe prompts: P and 10·P prompts, same model.

The moments are a d×d float64 matrix per layer, so memory should not grow with the prompt count; an
implementation that kept the hidden states would grow by the bytes of the stacked activations (printed
as the "stored" column for comparison). Measured three ways, each run in a fresh process so peaks do
not mix:

- heap: peak over batches of glibc's bytes in use (``mallinfo2``: arena + mmapped chunks), sampled
  after every batch, minus the value before the run — torch's CPU tensors live here;
- tracemalloc: Python-level peak (numpy arrays, prompt strings, token ids) during the run;
- RSS: the process's peak resident set (``ru_maxrss``), which includes imports and the model.

Run: ``.venv/bin/python benchmarks/bench_activation_memory.py [--prompts 64] [--hidden 256] [--layers 4]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_in_use() -> int:
    """Bytes glibc malloc has handed out and not taken back (small chunks + mmapped chunks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    mi = libc.mallinfo2()
    return int(mi.uordblks + mi.hblkhd)


def measure(n_prompts: int, hidden: int, layers: int, tokens: str, batch_size: int) -> dict:
    import tracemalloc

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from graftkit.agent import tiny_tokenizer
    from graftkit.rank.activations import activation_ranks, encode_prompt, probe_prompts

    torch.set_num_threads(1)
    prompts = probe_prompts("all", n_prompts, seed=0)
    words = sorted({w for p in prompts for w in p.replace('"', " ").split()})
    tok = tiny_tokenizer(words)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    n_tok = sum(len(encode_prompt(tok, p)) - 1 for p in prompts) if tokens == "all" else n_prompts
    stored = n_tok * hidden * 4 * (layers + 1)  # float32 hidden states of every selected layer
    peak = [0]
    base = heap_in_use()

    def on_batch(n: int) -> None:
        peak[0] = max(peak[0], heap_in_use() - base)

    tracemalloc.start()
    t0 = time.perf_counter()
    res = activation_ranks(model, tok, prompts, tokens=tokens, batch_size=batch_size, on_batch=on_batch)
    seconds = time.perf_counter() - t0
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"prompts": n_prompts, "tokens_ranked": int(res["n_tokens"][0]), "heap_peak_mb": peak[0] / 2**20,
            "tracemalloc_peak_mb": py_peak / 2**20,
            "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "stored_activations_mb": stored / 2**20, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64, help="P; the second run takes 10·P")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", default="all", choices=["all", "last"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child process: measure this many prompts
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a.hidden, a.layers, a.tokens, a.batch_size)))
        return
    rows = []
    for n in (a.prompts, 10 * a.prompts):
        cmd = [sys.executable, __file__, "--one", str(n), "--hidden", str(a.hidden), "--layers", str(a.layers),
               "--tokens", a.tokens, "--batch-size", str(a.batch_size)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
                               .splitlines()[-1]))
    print(f"activation ranks, tiny Qwen3 hidden {a.hidden} x {a.layers} layers, tokens={a.tokens}, "
          f"batch {a.batch_size}, all {a.layers + 1} hidden states")
    print(f"{'prompts':>8} {'tokens':>8} {'heap peak MB':>13} {'tracemalloc MB':>15} {'RSS peak MB':>12} "
          f"{'stored would be MB':>19} {'s':>6}")
    for r in rows:
        print(f"{r['prompts']:>8} {r['tokens_ranked']:>8} {r['heap_peak_mb']:>13.2f} {r['tracemalloc_peak_mb']:>15.2f} "
              f"{r['rss_peak_mb']:>12.1f} {r['stored_activations_mb']:>19.2f} {r['seconds']:>6.2f}")
    p, q = rows
    print(f"ratio 10P/P: heap {q['heap_peak_mb'] / p['heap_peak_mb']:.2f}, tracemalloc "
          f"{q['tracemalloc_peak_mb'] / p['tracemalloc_peak_mb']:.2f}, RSS {q['rss_peak_mb'] / p['rss_peak_mb']:.2f}; "
          f"stored activations would grow {q['stored_activations_mb'] / p['stored_activations_mb']:.1f}x")


if __name__ == "__main__":
    main()
