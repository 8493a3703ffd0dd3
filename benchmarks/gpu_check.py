"""GPU check: graftkit's model-running paths on a CUDA device in bfloat16, against the CPU in float32.

    python benchmarks/gpu_check.py [--device cuda] [--out DIR]      # the ~1B model, on one GPU
    python benchmarks/gpu_check.py --device cpu --small             # a tiny model, the CPU on both sides

What it does, on ``--device`` in bfloat16 and on the CPU in float32 (the reference):

1. builds a random Llama (``hidden 2048, intermediate 8192, 16 layers, 16 heads / 8 KV heads``, ≈1.0 B
   parameters; the vocabulary of graftkit's task tokenizer, ``agent.tiny_tokenizer(task_words())``, so
   every web-task token exists), saves it as an HF folder in bfloat16, and an "RL" child: base + a planted
   delta (N(0, 0.002²)) on the late third's attention and MLP matrices;
2. eval: the base on identical episodes (``run_eval``) on the device and on the CPU — success rates within
   ``EVAL_MARGIN``; episodes/s of a larger device evaluation (every task);
   eval-sft: the embedded SFT policy (a policy that succeeds, so the comparison means something; the random
   model fails nearly everything on both sides) — success within ``SFT_MARGIN``, per-episode agreement ≥
   ``SFT_AGREEMENT``;
3. grpo: ``GRPO_STEPS`` steps on the device from the 1B base (s/step; finite losses; precision recorded;
   checkpoint in bfloat16), and 2 steps of the SFT policy on the device and on the CPU — first-batch
   success within ``GRPO_MARGIN`` (the batches are sampled from per-episode generators, so they differ only
   where the two precisions pick different tokens);
4. graft-inplace: grafts of attn+mlp at α = 1 and α = 0.5 written in place into the base loaded on the
   device in bfloat16 equal, bit for bit, the exported graft (``export_graft``) loaded there;
   graft-sweep: the factorial sweep over attn, mlp (5 configurations, in place, ``run_graft_experiments``)
   on the device; its base configuration's success within ``EVAL_MARGIN`` of the CPU's evaluation of base;
5. rank-activations: per-layer effective rank of the hidden states on probe prompts (every token) on the
   device in bf16 and on the CPU in float32 — within ``RANK_RTOL`` relative.

Then a summary block: episodes/s, GRPO s/step, peak GPU memory (``torch.cuda.max_memory_allocated``), and
PASS/FAIL per check; the exit status is 1 if any check fails.

Budget (≤ 8 minutes on one H200, 16 CPU cores): building the 1B model on the CPU and writing base and RL
(2 × 2 GB) ≈ 40 s; the CPU float32 side runs only small work on the 1B model — 6 episodes (2 tasks × 3
seeds, ≤ 3 turns of ≤ 32 tokens: decoding is memory-bound, ≈ 4 GB of weights per token step) ≈ 30 s,
16 probe prompts of activations ≈ 15 s — and the tiny SFT policy's evaluation and 2 GRPO steps ≈ 20 s;
no CPU GRPO or sweep of the 1B model (a float32 backward of 1 B parameters on 16 cores takes minutes).
The GPU side: the throughput evaluation (15 tasks × 4 seeds = 60 episodes, batch 64) ≈ 30 s, 10 GRPO steps
of 2 prompts × 4 samples ≈ 40 s, two graft exports (2 GB each) and loads ≈ 30 s, the 5-configuration
sweep over the 6 episodes ≈ 20 s. Model loads ≈ 5 s each. Expected total ≈ 4–5 minutes.

It needs only what the GPU machine has (torch, transformers, safetensors, h5py, numpy, scipy, typer,
rich); ``import graftkit`` loads no plotly (the report figures are imported on first use). Where graftkit
is not installed, the repository root is made importable as ``graftkit``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: |success rate difference| allowed between the device (bf16) and the CPU (float32) on identical episodes.
EVAL_MARGIN = 0.34
SFT_MARGIN = 0.10
SFT_AGREEMENT = 0.85
GRPO_MARGIN = 0.25
RANK_RTOL = 0.02

FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
            num_key_value_heads=8)
SMALL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2)
COMPARE_TASKS = "click-button,click-tab"


def _importable() -> list[str]:
    """Make ``import graftkit`` work here: the repository root as the package where it is not installed."""
    notes = []
    if importlib.util.find_spec("graftkit") is None:
        shim = Path(tempfile.mkdtemp(prefix="graftkit-shim-"))
        (shim / "graftkit").symlink_to(ROOT, target_is_directory=True)
        sys.path.insert(0, str(shim))
        notes.append(f"graftkit imported from {ROOT}")
    return notes


class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[bool, str, str]] = []
        self.figures: dict[str, str] = {}

    def add(self, ok: bool, name: str, detail: str) -> None:
        self.rows.append((bool(ok), name, detail))
        print(f"  {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def build_pair(out: Path, size: dict, seed: int = 0):
    """A random Llama over the task tokenizer, saved in bfloat16, and base + a planted late-layer delta."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from graftkit.agent import task_words, tiny_tokenizer
    from graftkit.weights import describe, open_checkpoint, save_model

    tok = tiny_tokenizer(task_words())
    cfg = LlamaConfig(vocab_size=len(tok), max_position_embeddings=1024, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      head_dim=size["hidden_size"] // size["num_attention_heads"], **size)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in model.parameters())
    base = save_model(out / "base", model, tok, provenance={"producer": "gpu_check (random Llama)"}, force=True,
                      dtype=torch.bfloat16)
    n = cfg.num_hidden_layers
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
            if layer >= 2 * n // 3 and p.dim() == 2 and (".self_attn." in name or ".mlp." in name):
                p.add_(0.002 * torch.randn(p.shape, generator=g))
    d = describe(open_checkpoint(base))
    rl = save_model(out / "rl", model, tok, inputs=[base], force=True, dtype=torch.bfloat16,
                    provenance={"producer": "gpu_check (planted late attn+mlp delta)",
                                "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    del model
    return base, rl, n_params


def _eval(model: Path, out: Path, device: str, dtype: str, tasks: str, seeds: int, name: str):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    cfg = EvalConfig(model=model, tasks=tasks, seeds=seeds, episodes=1, device=device, dtype=dtype, run=out,
                     save=out / "results" / f"eval-{name}.h5")
    return run_eval(cfg).results["model"]


def check_eval(c: Checks, base: Path, out: Path, dev: str, seeds: int, throughput_seeds: int, sft: Path) -> dict:
    from graftkit.webenv.tasks import TASKS

    got = _eval(base, out, dev, "bfloat16", COMPARE_TASKS, seeds, "base-dev")
    ref = _eval(base, out, "cpu", "float32", COMPARE_TASKS, seeds, "base-cpu")
    a, b = float(got.success.mean()), float(ref.success.mean())
    c.add(got.attrs["placement"]["dtype"] == "bfloat16" and abs(a - b) <= EVAL_MARGIN, "eval",
          f"base success {dev} bf16 {a:.3f} vs cpu f32 {b:.3f} over {got.success.size} episodes (margin {EVAL_MARGIN})")
    wide = _eval(base, out, dev, "bfloat16", ",".join(TASKS), throughput_seeds, "base-wide")
    c.figures["episodes/s"] = (f"{wide.success.size / wide.seconds:.1f} ({dev} bf16, the random base model, "
                               f"{wide.success.size} episodes); cpu f32 {ref.success.size / ref.seconds:.2f} "
                               f"({ref.success.size} episodes)")
    sft_tasks = "mastered,headroom"
    s_dev = _eval(sft, out, dev, "bfloat16", sft_tasks, 10, "sft-dev")
    s_cpu = _eval(sft, out, "cpu", "float32", sft_tasks, 10, "sft-cpu")
    x, y = float(s_dev.success.mean()), float(s_cpu.success.mean())
    agree = float((s_dev.success == s_cpu.success).mean())
    c.add(abs(x - y) <= SFT_MARGIN and agree >= SFT_AGREEMENT, "eval-sft",
          f"SFT policy success {dev} bf16 {x:.3f} vs cpu f32 {y:.3f}, same outcome on {agree:.0%} of "
          f"{s_dev.success.size} episodes (margin {SFT_MARGIN}, agreement ≥ {SFT_AGREEMENT:.0%})")
    return {"base_cpu_success": b, "cpu_seeds": seeds}


def _grpo(init: Path, out: Path, device: str, dtype: str, steps: int, threads: int):
    from graftkit.train.grpo import GRPOConfig, run_grpo

    cfg = GRPOConfig(init=str(init), out=str(out), tasks=("click-button", "click-tab"), steps=steps, prompts_per_step=2,
                     group_size=4, max_new_tokens=8, lr=1e-5, device=device, dtype=dtype, save_dtype="bfloat16",
                     threads=threads, seed=0)
    folder = run_grpo(cfg, force=True)
    log = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines()]
    return folder, log


def check_grpo(c: Checks, base: Path, sft: Path, out: Path, dev: str, steps: int, threads: int) -> None:
    import math

    from graftkit.weights import open_checkpoint

    folder, log = _grpo(base, out / "grpo-1b", dev, "bfloat16", steps, threads)
    prec = json.loads((folder / "graftkit.json").read_text())["precision"]
    ck = open_checkpoint(folder)
    import torch

    ok = (len(log) == steps and all(math.isfinite(m["loss"]) for m in log) and prec["compute_dtype"] == "bfloat16"
          and {ck.metas[n].dtype for n in ck.names} == {torch.bfloat16})
    # the first step carries warm-up (kernels, allocator); s/step is over the rest where there is a rest
    per = (log[-1]["seconds"] - log[0]["seconds"]) / (steps - 1) if steps > 1 else log[0]["seconds"]
    c.figures["GRPO s/step"] = f"{per:.2f} ({dev} bf16 autocast, float32 masters; 2 prompts × 4 samples, {steps} steps)"
    c.add(ok, "grpo", f"{steps} steps on {dev}: losses finite, compute {prec['compute_dtype']}, saved bfloat16")
    _, a = _grpo(sft, out / "grpo-sft-dev", dev, "bfloat16", 2, threads)
    _, b = _grpo(sft, out / "grpo-sft-cpu", "cpu", "float32", 2, threads)
    c.add(abs(a[0]["success"] - b[0]["success"]) <= GRPO_MARGIN and all(math.isfinite(m["loss"]) for m in a + b),
          "grpo-vs-cpu", f"SFT policy first-batch success {dev} bf16 {a[0]['success']:.3f} vs cpu f32 "
          f"{b[0]['success']:.3f} (margin {GRPO_MARGIN})")


def check_grafts(c: Checks, base: Path, rl: Path, out: Path, dev: str, seeds: int, base_cpu_success: float) -> None:
    import torch

    from graftkit.agent import load_policy
    from graftkit.graft import GraftSpec, InPlaceGraft, export_graft, plan_graft
    from graftkit.graft.commands import GraftConfig, run_graft_experiments
    from graftkit.graft.experiments import BASE_LABEL
    from graftkit.results.store import read_result
    from graftkit.weights import load_model, open_checkpoint

    b, r = open_checkpoint(base), open_checkpoint(rl)
    tax = b.taxonomy()
    policy = load_policy(base, device=dev, dtype="bfloat16")
    model = policy.model
    worst, checked = 0, 0
    with InPlaceGraft(model, b, r) as session:
        for alpha in (1.0, 0.5):
            plan = plan_graft(tax, GraftSpec(("attn", "mlp"), alpha=alpha))
            session.apply(plan)
            exported = export_graft(b, r, plan, out / f"graft-{alpha:g}", force=True)
            want, _ = load_model(exported, dtype=torch.bfloat16, need_tokenizer=False)
            want = want.to(model.device)
            got_sd, want_sd = model.state_dict(), want.state_dict()
            for n, t in want_sd.items():
                checked += 1
                worst += not (got_sd[n].dtype == t.dtype and torch.equal(got_sd[n].view(torch.int16), t.view(torch.int16)))
            del want, want_sd
    c.add(worst == 0, "graft-inplace", f"{checked - worst}/{checked} tensors bit-exact vs the exported graft loaded on "
          f"{model.device} (attn+mlp, α = 1 and 0.5)")
    del policy, model
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()
    cfg = GraftConfig(rl=rl, base=base, sweep="factorial", groups="attn,mlp", tasks=COMPARE_TASKS, seeds=seeds,
                      episodes=1, device=dev, dtype="bfloat16", results=out / "results", run=out)
    got = run_graft_experiments(cfg)
    res = read_result(got.files["A"])
    labels = list(res.coords["config"])
    base_rate = float(res["success"][labels.index(BASE_LABEL)].mean())
    ok = (res.attrs["placement"]["dtype"] == "bfloat16" and len(labels) == 5 and bool(res.attrs["complete"])
          and abs(base_rate - base_cpu_success) <= EVAL_MARGIN)
    c.add(ok, "graft-sweep", f"factorial attn×mlp, {len(labels)} configurations on {dev} in {got.seconds:.1f} s; base "
          f"config success {base_rate:.3f} vs cpu f32 eval {base_cpu_success:.3f} (margin {EVAL_MARGIN})")


def check_ranks(c: Checks, base: Path, dev: str, probes: int) -> None:
    import numpy as np

    from graftkit.agent import load_policy
    from graftkit.rank.activations import METRICS, activation_ranks, probe_prompts

    prompts = probe_prompts("all", probes)
    k = list(METRICS).index("erank")
    vals = {}
    for where, dtype in ((dev, "bfloat16"), ("cpu", "float32")):
        res = activation_ranks(load_policy(base, device=where, dtype=dtype), None, prompts, "all", tokens="all")
        vals[dtype] = np.asarray(res["value"])[:, k]
    a, b = vals["bfloat16"], vals["float32"]
    rel = float(np.max(np.abs(a - b) / np.abs(b))) if np.isfinite(a).all() and np.isfinite(b).all() else float("inf")
    c.add(rel <= RANK_RTOL, "rank-activations", f"per-layer erank {dev} bf16 vs cpu f32: max relative difference "
          f"{rel:.2e} over {len(a)} layers (tolerance {RANK_RTOL})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="the device under test (cuda, cuda:N, or cpu)")
    ap.add_argument("--small", action="store_true", help="a tiny model and a few episodes (a CPU smoke run)")
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a temporary one)")
    args = ap.parse_args(argv)
    for note in _importable():
        print(f"note: {note}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch

    from graftkit.core.devices import resolve_device

    dev = str(resolve_device(args.device))
    out = (args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    size, seeds, wide_seeds, steps, probes = ((SMALL, 2, 1, 2, 6) if args.small else (FULL, 3, 4, 10, 16))
    threads = 1 if args.small else min(16, os.cpu_count() or 1)
    torch.set_num_threads(threads)
    print(f"gpu_check: device {dev} ({torch.cuda.get_device_name(dev) if dev.startswith('cuda') else 'cpu'}), "
          f"torch {torch.__version__}, {'small' if args.small else 'full'} sizes, out {out}", flush=True)
    if dev.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(dev)
    c, t0 = Checks(), time.perf_counter()
    stages = []

    def stage(name, fn, *a):
        t = time.perf_counter()
        print(f"[{name}]", flush=True)
        r = fn(*a)
        stages.append(f"{name} {time.perf_counter() - t:.0f} s")
        return r

    base, rl, n_params = stage("build", build_pair, out, size)
    print(f"  random Llama, {n_params / 1e9:.3f} B parameters, saved in bfloat16", flush=True)
    sft = ROOT / "assets" / "sft"
    info = stage("eval", check_eval, c, base, out, dev, seeds, wide_seeds, sft)
    stage("grpo", check_grpo, c, base, sft, out, dev, steps, threads)
    stage("graft", check_grafts, c, base, rl, out, dev, seeds, info["base_cpu_success"])
    stage("rank", check_ranks, c, base, dev, probes)
    peak = (f"{torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB" if dev.startswith("cuda")
            else "n/a (no CUDA device under test)")
    print("== summary ==")
    print(f"episodes/s: {c.figures.get('episodes/s', 'n/a')}")
    print(f"GRPO s/step: {c.figures.get('GRPO s/step', 'n/a')}")
    print(f"peak GPU memory: {peak}")
    print(f"time: {time.perf_counter() - t0:.0f} s ({', '.join(stages)})")
    for ok, name, detail in c.rows:
        print(f"{'PASS' if ok else 'FAIL'} {name} {detail}")
    return 0 if all(ok for ok, _, _ in c.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
