"""``graftkit graft --sweep factorial`` with ``--executor ray`` (2 CPU workers) against the serial executor.

The sweep: a tiny nano policy as the SFT base and an RL child moved in every group (planted), a factorial
over four groups (embed, attn, mlp, norm: the 2^4 = 16 subsets, ∅ being the base, plus the RL reference,
17 configurations), each evaluated greedily on the same tasks × seeds × episodes, sized so that one
configuration takes a few seconds serially. Both executors run in this process, one after the other; the
results' data (every configuration's outcomes, the paired comparisons, the attribution) must be identical.

The Ray cluster is started once (a local one with 2 CPUs) and its start time reported apart: a researcher's
cluster is usually already up. The ray run's wall time includes starting the two workers (each imports
torch and loads the base policy once). Printed: serial and ray wall times, the cluster start, and the
speed-up serial / ray without and with the start. Target: ≥ 1.6× (without the start) on 2 cores.

    python benchmarks/bench_ray_sweep.py [--quick] [--seeds 40] [--episodes 2] [--serial-threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
TARGET = 1.6
GROUPS = "embed,attn,mlp,norm"
TASKS = "click-button,click-link,enter-text"


def make_policies(root: Path) -> dict[str, Path]:
    """A nano SFT policy and an RL child with a planted delta in every 2-D tensor."""
    import torch

    from graftkit.agent import task_words, tiny_policy
    from graftkit.weights import describe, open_checkpoint, save_model

    sft = tiny_policy(task_words(), "nano", seed=0)
    paths = {"sft": save_model(root / "sft", sft.model, sft.tokenizer, provenance={"producer": "bench_ray_sweep"},
                               force=True)}
    d = describe(open_checkpoint(paths["sft"]))
    m = tiny_policy(task_words(), "nano", seed=0).model
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, q in m.named_parameters():
            q.add_(0.3 * q.abs().mean() * torch.randn(q.shape, generator=g))
    paths["rl"] = save_model(root / "rl", m, sft.tokenizer, force=True, provenance={
        "producer": "bench_ray_sweep (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    return paths


def result_data(path) -> dict:
    import numpy as np

    from graftkit.results.store import read_result

    res = read_result(path)
    return {k: np.asarray(res[k]) for k in res.data}


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and (
        a[k].tobytes() == b[k].tobytes() if a[k].dtype.kind == "f" else bool((a[k] == b[k]).all())) for k in a)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer seeds (a smoke run; the ratio means little)")
    ap.add_argument("--seeds", type=int, default=40)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--serial-threads", type=int, default=None,
                    help="torch threads of the serial run (default: torch's own, as users run it; a worker has 1)")
    args = ap.parse_args(argv)
    seeds = 2 if args.quick else args.seeds

    import torch

    if args.serial_threads:
        torch.set_num_threads(args.serial_threads)

    from graftkit.core.executor import ray_cluster
    from graftkit.graft.commands import GraftConfig, run_graft

    WORK.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ray-sweep-", dir=WORK))
    try:
        paths = make_policies(root)
        common = dict(rl=paths["rl"], base=paths["sft"], sweep="factorial", groups=GROUPS, tasks=TASKS, seeds=seeds,
                      episodes=args.episodes, max_new_tokens=args.max_new_tokens)
        t0 = time.perf_counter()
        serial = run_graft(GraftConfig(run=root / "serial", **common))
        t_serial = time.perf_counter() - t0
        n = len(serial.sweeps["A"].configs)
        with ray_cluster("local", workers=2) as cluster:
            t_start = cluster.seconds
            t0 = time.perf_counter()
            ray = run_graft(GraftConfig(run=root / "ray", executor="ray", workers=2, **common))
            t_ray = time.perf_counter() - t0
        identical = same(result_data(serial.files["A"]), result_data(ray.files["A"]))
        ratio, ratio_start = t_serial / t_ray, t_serial / (t_ray + t_start)
        record = {"configurations": n, "groups": GROUPS, "tasks": TASKS, "seeds": seeds, "episodes": args.episodes,
                  "max_new_tokens": args.max_new_tokens, "serial_s": t_serial, "serial_per_config_s": t_serial / n,
                  "serial_torch_threads": torch.get_num_threads(), "ray_s": t_ray, "cluster_start_s": t_start,
                  "speedup": ratio, "speedup_with_start": ratio_start, "identical": identical, "cpus": os.cpu_count()}
        print(f"graft factorial sweep over {GROUPS}: {n} configurations × {len(TASKS.split(','))} tasks × {seeds} "
              f"seeds × {args.episodes} episodes")
        print(f"  serial executor        {t_serial:7.1f} s   ({t_serial / n:.1f} s per configuration, "
              f"torch threads {torch.get_num_threads()})")
        print(f"  ray executor, 2 CPUs   {t_ray:7.1f} s   (workers started and the base loaded inside)")
        print(f"  ray cluster start      {t_start:7.1f} s")
        print(f"  speed-up serial / ray  {ratio:7.2f}×  without the cluster start (target ≥ {TARGET}×: "
              f"{'met' if ratio >= TARGET else 'MISSED'})")
        print(f"                         {ratio_start:7.2f}×  with it")
        print(f"  outcomes identical     {identical}")
        (WORK / "ray_sweep_results.json").write_text(json.dumps(record, indent=2))
        return 0 if identical else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
