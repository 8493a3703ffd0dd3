"""``graftkit delta`` on distributed trainers' checkpoint layouts read directly, against converting them first.

An RL checkpoint saved by a distributed trainer is not a Hugging Face folder. graftkit reads two such layouts
itself (``weights/trainers/dcp.py``, ``weights/trainers/verl.py``); the alternative is the route a user takes
without that: run the trainer library's converter, then point graftkit at what it wrote. This measures both
routes, in one run, on the same synthetic model, each command in its own process:

1. **torch.distributed.checkpoint (DCP) folder**, as FSDP2 + ``dcp.save`` writes it: ``.metadata`` and
   ``__0_0.distcp``, HF tensor names, fp32 (written by ``dcp.save(state_dict, no_dist=True)``).

   - converter route: ``python -m torch.distributed.checkpoint.format_utils dcp_to_torch DCP OUT.pt``
     (torch's ``dcp_to_torch_save``: the whole state dict in memory, then one ``torch.save`` file), then
     ``graftkit delta --base BASE --from OUT.pt --allow-pickle``;
   - direct route: ``graftkit delta --base BASE --from DCP --allow-pickle``.

2. **verl FSDP actor folder**: ``global_step_N/actor/model_world_size_2_rank_{0,1}.pt``, each a ``torch.save``d
   dict name → ``DTensor`` holding that rank's ``Shard(0)`` chunk (``torch.chunk(t, 2, 0)[rank]``) of the fp32
   tensor on a 1-D ``("fsdp",)`` CPU mesh of 2 ranks, plus ``actor/huggingface/config.json`` and
   ``actor/fsdp_config.json`` (``{"FSDP_version": 2, "world_size": 2}``). Written by two gloo processes, as
   verl's ``FSDPCheckpointManager`` lays it out (see tests/fixtures/trainers/verl/README.md).

   - converter route: verl's own merger (``python -m verl.model_merger merge --backend fsdp``) is not
     installed here, so this script re-implements what it does (``--merge-verl``, :func:`merge_verl`, after
     verl's ``FSDPModelMerger.merge_and_save`` and ``BaseModelMerger.save_hf_model_and_tokenizer``): load rank 0
     whole for the mesh, load every rank file whole (``torch.load(weights_only=False)``, a thread per file),
     take each DTensor's local shard ``.bfloat16()``, ``torch.cat`` along the placement's dim, build the model
     empty in bf16 from ``actor/huggingface`` and ``save_pretrained(target, state_dict=...)``. Like verl's, its
     output is **bf16**. Then ``graftkit delta --base BASE --from MERGED``;
   - direct route: ``graftkit delta --base BASE --from global_step_N --allow-pickle`` (fp32 shards joined).

For each route: wall time (a converter route's is the sum of its two commands), CPU time, peak RSS of the
command's process tree (a converter route's is the larger of its two commands'; benchmarks/measure.py polls
/proc and takes the kernel's high-water marks, per command) and peak anonymous memory (RSS less mapped file
pages, which the kernel can drop). Each route runs ``--repeats`` times (3; 1 with ``--quick``), the two routes
of a layout alternating which goes first; printed are the minimum and median wall, the minimum CPU time and
the largest peaks, and the ratios direct / converter route of each. Before every command, untimed,
its inputs are read into the page cache and ``os.sync()`` is called; after it, its outputs are dropped from
the page cache, so that every command times the tool, not the disk. ``GRAFTKIT_RUNS`` and a fresh
``GRAFTKIT_CACHE`` per command point into the work folder.

Checked: each route's total ‖Δ‖_F (``runs[label]["total"]["fro_delta"]`` of ``--json``) against the truth
computed while writing (Σ (rl − base)² in float64 over the fp32 values; graftkit sums float32 blocks of 1024,
so agreement to 1e-5 relative is asked); the DCP routes must agree with each other to 1e-12 relative (both
read the same fp32 values) and the direct verl route with the direct DCP route likewise. The verl converter
route's figure is printed beside them: its bf16 output moves it off the truth.

The model: a synthetic Llama (benchmarks/synth.py's shape: hidden 2048, 16 layers, intermediate 5632, vocab
32,000, 16 heads, untied lm_head, 0.95 B parameters, 3.8 GB in fp32); ``--quick``: hidden 512, 6 layers,
intermediate 1408 (52 M parameters). Base: an HF folder (``config.json`` + fp32 ``model.safetensors``), values
``0.02·randn`` (norms ``1 + 0.02·randn``), seeded per tensor; RL = base + ``1e-4·randn`` on every tensor.
Tensors are generated one at a time and streamed into the files (the DCP and verl writers read the RL
values memory-mapped), so no writer holds more than one model's worth. Everything goes under ``--workdir``
(default /tmp/bench-trainer-layouts), deleted at the end unless ``--keep``; the run needs about 5.5 models'
worth of free disk there (base, RL scratch, DCP, verl shards, the .pt and the bf16 folder) and refuses to
start without it. Exit status 1 when a command fails or a check fails, 2 when the run cannot start.

    python benchmarks/bench_trainer_layouts.py [--quick] [--repeats 3] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import socket
import statistics
import sys
import tempfile
import time
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from measure import Measurement, evict_page_cache, gb, run_measured, warm_page_cache  # noqa: E402
from synth import PairSpec, llama_config_dict  # noqa: E402

GRAFTKIT_EXE = REPO / ".venv" / "bin" / "graftkit"
WORKDIR = Path("/tmp/bench-trainer-layouts")
MARKER = ".bench-trainer-layouts"
FULL = PairSpec(hidden=2048, layers=16, vocab=32000, intermediate=5632, heads=16, kv_heads=16, dtype="float32")
QUICK = PairSpec(hidden=512, layers=6, vocab=32000, intermediate=1408, heads=8, kv_heads=8, dtype="float32")
WEIGHT_STD = 0.02
NORM_STD = 0.02
STEP_STD = 1e-4
STEP = 100  # the verl step folder: global_step_100
WORLD = 2  # verl ranks
RTOL_SAME = 1e-12  # two routes reading the same fp32 values
RTOL_TRUTH = 1e-5  # graftkit against the float64 truth (graftkit sums float32 blocks of 1024)
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1"}


# ------------------------------------------------------------------------------------------- writers

def _generator(seed: int, name: str, stream: int):
    import torch

    return torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode()) * 4 + stream) % (1 << 63))


def _safetensors_header(shapes: Sequence[tuple[str, tuple[int, ...]]]) -> bytes:
    """The 8-byte length and JSON header of an fp32 safetensors file holding `shapes` in this order."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        end = offset + 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text


def mapped_tensors(path: Path) -> dict:
    """name → fp32 tensor memory-mapped (copy-on-write) from the safetensors file `path`: no copy in memory."""
    import numpy as np
    import torch

    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        start = 8 + n + info["data_offsets"][0]
        arr = np.memmap(path, dtype=np.float32, mode="c", offset=start, shape=tuple(info["shape"]) or (1,))
        out[name] = torch.from_numpy(arr).reshape(info["shape"])
    return out


def write_hf_pair(spec: PairSpec, base_dir: Path, rl_dir: Path, truth_file: Path) -> None:
    """Stream base and RL (fp32 HF folders: config.json + model.safetensors) one tensor at a time, and record
    the truth: ‖rl − base‖_F over the fp32 values, summed in float64."""
    import torch

    shapes = spec.tensor_shapes()
    config = llama_config_dict(spec)
    sumsq = 0.0
    params = 0
    files = []
    for d in (base_dir, rl_dir):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        f = open(d / "model.safetensors", "wb")
        f.write(_safetensors_header(shapes))
        files.append(f)
    try:
        for name, shape in shapes:
            is_norm = len(shape) == 1
            base = torch.randn(shape, generator=_generator(spec.seed, name, 0))
            base.mul_(NORM_STD if is_norm else WEIGHT_STD)
            if is_norm:
                base.add_(1.0)
            rl = torch.randn(shape, generator=_generator(spec.seed, name, 1)).mul_(STEP_STD).add_(base)
            d = (rl - base).reshape(-1).double()
            sumsq += float(torch.dot(d, d))
            params += base.numel()
            del d
            for f, t in zip(files, (base, rl)):
                f.write(t.numpy().data)
    finally:
        for f in files:
            f.close()
    truth_file.write_text(json.dumps({"fro_delta": math.sqrt(sumsq), "params": params}) + "\n")


def write_dcp(rl_file: Path, out_dir: Path) -> None:
    """One DCP folder, as FSDP2 + ``dcp.save`` writes it on one rank: ``.metadata`` + ``__0_0.distcp``."""
    import torch.distributed.checkpoint as dcp

    state = mapped_tensors(rl_file)
    with warnings.catch_warnings():  # "torch.distributed is disabled …, assuming … a single process": intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, checkpoint_id=str(out_dir), no_dist=True)


def _verl_rank(rank: int, rl_file: Path, actor: Path, port: int, hf_config: dict) -> None:
    """One of the two gloo ranks: save this rank's ``Shard(0)`` DTensors as verl's FSDPCheckpointManager does."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
        state = {}
        for name, full in mapped_tensors(rl_file).items():
            local = torch.chunk(full, WORLD, dim=0)[rank].clone()  # a copy: a view would pickle the whole storage
            state[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=full.shape,
                                             stride=full.stride())
        torch.save(state, actor / f"model_world_size_{WORLD}_rank_{rank}.pt")
        del state
        if rank == 0:
            (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": WORLD}, indent=4))
            hf = actor / "huggingface"
            hf.mkdir()
            (hf / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_verl(spec: PairSpec, rl_file: Path, step_dir: Path) -> None:
    import torch.multiprocessing as mp

    actor = step_dir / "actor"
    actor.mkdir(parents=True)
    mp.spawn(_verl_rank, args=(rl_file, actor, _free_port(), llama_config_dict(spec)), nprocs=WORLD, join=True)


def _in_child(fn, *args) -> None:
    """Run ``fn(*args)`` in a fresh (spawned) process, so that this one stays small: its peak memory is folded
    into the ``ru_maxrss`` of the measured commands it starts (benchmarks/measure.py)."""
    import multiprocessing

    p = multiprocessing.get_context("spawn").Process(target=fn, args=args)
    p.start()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"{fn.__name__} failed (exit status {p.exitcode})")


# ---------------------------------------------------------------------------- verl's merger, re-implemented

def merge_verl(local_dir: Path, target_dir: Path) -> None:
    """What ``python -m verl.model_merger merge --backend fsdp --local_dir ACTOR --target_dir OUT`` does for an
    FSDP actor without TP or LoRA (verl/model_merger/fsdp_model_merger.py ``merge_and_save`` and
    base_model_merger.py ``save_hf_model_and_tokenizer``), step for step; only the tokenizer and processor
    save (there is none here) and the hub upload are left out."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch
    from accelerate import init_empty_weights
    from torch.distributed.tensor import DTensor
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    local_dir, target_dir = Path(local_dir), Path(target_dir)
    hf_config_path = local_dir / "huggingface"
    model_config = AutoConfig.from_pretrained(hf_config_path)
    target_dir.mkdir(parents=True, exist_ok=True)
    world_size = next(int(m[1]) for f in os.listdir(local_dir)
                      if (m := re.match(r"model_world_size_(\d+)_rank_0\.pt", f)))
    # _load_rank_zero_state_dict: rank 0 whole, for the mesh (kept until the end, as verl keeps it)
    rank_zero = torch.load(local_dir / f"model_world_size_{world_size}_rank_0.pt", map_location="cpu",
                           weights_only=False)
    pivot = rank_zero[sorted(rank_zero)[0]]
    if isinstance(pivot, DTensor):
        mesh, mesh_dim_names = pivot.device_mesh.mesh, pivot.device_mesh.mesh_dim_names
    else:
        mesh, mesh_dim_names = np.array([world_size], dtype=np.int64), ("fsdp",)
    assert mesh_dim_names in (("fsdp",), ("ddp", "fsdp")), f"Unsupported mesh_dim_names {mesh_dim_names}"
    total_shards = mesh.shape[-1]

    # _load_and_merge_state_dicts
    shards: list = [None] * total_shards

    def load(rank: int, into: list) -> None:
        path = local_dir / f"model_world_size_{world_size}_rank_{rank}.pt"
        into[rank] = torch.load(path, map_location="cpu", weights_only=False)

    with ThreadPoolExecutor(max_workers=min(32, os.cpu_count() or 1)) as pool:
        for future in [pool.submit(load, rank, shards) for rank in range(total_shards)]:
            future.result()
    state_dict: dict = {}
    param_placements: dict = {}
    for key in set(shards[0].keys()):
        state_dict[key] = []
        for shard in shards:
            tensor = shard.pop(key)
            if isinstance(tensor, DTensor):
                state_dict[key].append(tensor._local_tensor.bfloat16())
                placements = tuple(tensor.placements)
                if mesh_dim_names[0] in ("dp", "ddp"):
                    placements = placements[1:]
                assert param_placements.setdefault(key, placements) == placements
            else:
                state_dict[key].append(tensor.bfloat16())
    del shards
    for key in sorted(state_dict):
        if key in param_placements:
            (placement,) = param_placements[key]
            if placement.is_replicate():
                state_dict[key] = state_dict[key][0]
            elif placement.is_shard():
                state_dict[key] = torch.cat(state_dict[key], dim=placement.dim).contiguous()
            else:
                raise NotImplementedError(f"Unsupported placement: {placement}")
        else:
            state_dict[key] = torch.cat(state_dict[key], dim=0)

    # save_hf_model_and_tokenizer
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    if model.can_generate():
        try:
            model.generation_config = GenerationConfig.from_pretrained(hf_config_path)
        except OSError:
            pass
    model.save_pretrained(target_dir, state_dict=state_dict)
    del state_dict, model, rank_zero


# ----------------------------------------------------------------------------------------- measuring

@dataclasses.dataclass(frozen=True)
class Command:
    """One measured command: its label and argv, the paths it reads (warmed into the page cache first) and
    writes (removed first, dropped from the page cache after), and whether it is graftkit (fresh cache)."""

    label: str
    argv: list[str]
    inputs: tuple[Path, ...]
    outputs: tuple[Path, ...]
    graftkit: bool = False


@dataclasses.dataclass(frozen=True)
class Route:
    name: str  # "convert" or "direct"
    commands: tuple[Command, ...]


@dataclasses.dataclass
class RouteRun:
    """One run of a route: its commands' measurements and the ``--json`` of its graftkit delta."""

    steps: list[Measurement]
    delta: dict

    @property
    def wall_s(self) -> float:
        return sum(m.wall_s for m in self.steps)

    @property
    def cpu_s(self) -> float:
        return sum(m.cpu_s for m in self.steps)

    @property
    def peak_rss(self) -> int:
        return max(m.peak_rss_bytes for m in self.steps)

    @property
    def peak_anon(self) -> int:
        return max(m.peak_anon_bytes for m in self.steps)


class CommandFailed(RuntimeError):
    pass


def _rm(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def run_command(cmd: Command, work: Path) -> Measurement:
    for out in cmd.outputs:
        _rm(out)
    warm_page_cache(cmd.inputs)
    env = {**ENV, "GRAFTKIT_RUNS": str(work / "runs")}
    cache = None
    if cmd.graftkit:
        cache = Path(tempfile.mkdtemp(prefix="graftkit-cache-", dir=work))
        env["GRAFTKIT_CACHE"] = str(cache)
    os.sync()  # the previous command's dirty pages are not this one's time
    try:
        m = run_measured(cmd.argv, env=env, cwd=work)
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
        evict_page_cache([o for o in cmd.outputs if o.exists()])
    if m.returncode != 0:
        tail = "\n".join(m.stderr.strip().splitlines()[-20:])
        raise CommandFailed(f"{cmd.label} exited with status {m.returncode}: {' '.join(cmd.argv)}\n{tail}")
    missing = [str(o) for o in cmd.outputs if not o.exists()]
    if missing:
        raise CommandFailed(f"{cmd.label} exited 0 but did not write {', '.join(missing)}\n{m.stdout[-2000:]}")
    return m


def _one_run(delta_json: str, label: str) -> dict:
    try:
        doc = json.loads(delta_json[delta_json.index("{"):])
        (run,) = doc["runs"].values()
    except (ValueError, KeyError) as e:
        raise CommandFailed(f"{label}: cannot read one run from its --json output ({type(e).__name__}: {e})") from None
    return run


def run_route(route: Route, work: Path) -> RouteRun:
    steps = [run_command(c, work) for c in route.commands]
    return RouteRun(steps, _one_run(steps[-1].stdout, route.commands[-1].label))


def _delta_argv(exe: Path, base: Path, rl: Path, save: Path, pickle: bool) -> list[str]:
    argv = [str(exe), "delta", "--base", str(base), "--from", str(rl), "--save", str(save), "--json"]
    return argv + (["--allow-pickle"] if pickle else [])


def build_routes(exe: Path, work: Path, base: Path, dcp_dir: Path, step_dir: Path) -> dict[str, list[Route]]:
    conv = work / "convert"
    res = work / "results"
    pt, merged = conv / "dcp.pt", conv / "verl-merged"
    py = sys.executable
    dcp_cmd = [py, "-m", "torch.distributed.checkpoint.format_utils", "dcp_to_torch", str(dcp_dir), str(pt)]
    merge_cmd = [py, str(Path(__file__).resolve()), "--merge-verl", str(step_dir / "actor"), str(merged)]
    return {
        "DCP": [
            Route("convert", (
                Command("dcp_to_torch_save", dcp_cmd, (dcp_dir,), (pt,)),
                Command("graftkit delta --from dcp.pt", _delta_argv(exe, base, pt, res / "dcp-convert.h5", True),
                        (base, pt), (res / "dcp-convert.h5",), graftkit=True),
            )),
            Route("direct", (
                Command("graftkit delta --from DCP", _delta_argv(exe, base, dcp_dir, res / "dcp-direct.h5", True),
                        (base, dcp_dir), (res / "dcp-direct.h5",), graftkit=True),
            )),
        ],
        "verl": [
            Route("convert", (
                Command("verl merger (re-implemented)", merge_cmd, (step_dir / "actor",), (merged,)),
                Command("graftkit delta --from merged", _delta_argv(exe, base, merged, res / "verl-convert.h5", False),
                        (base, merged), (res / "verl-convert.h5",), graftkit=True),
            )),
            Route("direct", (
                Command("graftkit delta --from global_step",
                        _delta_argv(exe, base, step_dir, res / "verl-direct.h5", True),
                        (base, step_dir / "actor"), (res / "verl-direct.h5",), graftkit=True),
            )),
        ],
    }


# ------------------------------------------------------------------------------------------- report

def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else (0.0 if a == b else math.inf)


def _fro(run: RouteRun) -> float:
    return float(run.delta["total"]["fro_delta"])


def _precision(run: RouteRun) -> str:
    p = run.delta.get("precision") or {}
    return str(p.get("dtype", "?"))


def _free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def _mount_type(path: Path) -> str:
    """The file system type of the mount holding `path` (``/proc/mounts``' longest matching mount point)."""
    while not path.exists():
        path = path.parent
    path, best, kind = path.resolve(), -1, "?"
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:
            point = Path(fields[1].replace("\\040", " "))
            if (path == point or point in path.parents) and len(str(point)) > best:
                best, kind = len(str(point)), fields[2]
    return kind


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def disk_needed(spec: PairSpec) -> int:
    """Base, RL scratch, DCP, verl shards and the .pt (fp32), the merged folder (bf16), 2% and 200 MB over."""
    return int(spec.model_bytes() * 5.5 * 1.02) + 200_000_000


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 52 M-parameter model instead of 0.95 B")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of each route, alternating which route goes first (default 3; 1 with --quick)")
    ap.add_argument("--workdir", type=Path, default=WORKDIR, help=f"folder for every file (default {WORKDIR})")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--graftkit", type=Path, default=GRAFTKIT_EXE, help="graftkit executable")
    ap.add_argument("--merge-verl", nargs=2, type=Path, metavar=("ACTOR", "TARGET"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.merge_verl:
        merge_verl(*args.merge_verl)
        return 0
    args.repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    if args.repeats < 1:
        ap.error("--repeats must be ≥ 1")
    if not args.graftkit.exists():
        print(f"graftkit executable missing: {args.graftkit}\n  run `make setup` (or pass --graftkit PATH)")
        return 2
    spec = QUICK if args.quick else FULL
    work: Path = args.workdir.resolve()
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists():
        print(f"{work} exists and is not this benchmark's work folder: pass an empty or new --workdir")
        return 2
    needed, free = disk_needed(spec), _free_bytes(work)
    params = sum(math.prod(s) for _, s in spec.tensor_shapes())
    print(f"model: synthetic Llama, hidden {spec.hidden}, {spec.layers} layers, intermediate {spec.intermediate}, "
          f"vocab {spec.vocab}, {spec.heads} heads: {params / 1e9:.3f} B parameters, {gb(spec.model_bytes())} "
          f"in fp32", flush=True)
    print(f"disk: needs {gb(needed)}, {gb(free)} free on the file system of {work}", flush=True)
    if _mount_type(work) == "tmpfs":
        # tmpfs holds its files in memory: they and the tools' peaks (≈1.6 models) must fit in it together
        avail = _mem_available()
        print(f"{work} is on tmpfs: its files take memory ({gb(avail)} available), and dropping them from the page "
              "cache (between commands) does nothing", flush=True)
        if needed + int(1.6 * spec.model_bytes()) > avail:
            print("NOT ENOUGH MEMORY for a tmpfs work folder: pass --workdir on a disk, or use --quick")
            return 2
    if needed > free:
        print(f"NOT ENOUGH DISK: this run writes about 5.5 models' worth ({gb(needed)}) under {work}, and only "
              f"{gb(free)} are free there.\n  free space, pass --workdir on a larger disk, or use --quick")
        return 2
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / MARKER).write_text("work folder of benchmarks/bench_trainer_layouts.py; deleted at its end\n")
    print(f"load average before: {_loadavg()}", flush=True)
    start = time.perf_counter()
    try:
        return _run(args, spec, work, params, start)
    except CommandFailed as e:
        print(f"\nFAILED: {e}", flush=True)
        return 1
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, spec: PairSpec, work: Path, params: int, start: float) -> int:
    def log(msg: str = "") -> None:
        print(msg, flush=True)

    base, rl32 = work / "base", work / "rl-fp32"
    dcp_dir = work / "dcp" / "fsdp2-model"
    step_dir = work / "verl" / f"global_step_{STEP}"
    truth_file = work / "truth.json"
    (work / "results").mkdir()
    (work / "convert").mkdir()

    t0 = time.perf_counter()
    _in_child(write_hf_pair, spec, base, rl32, truth_file)
    log(f"wrote base and RL (fp32 HF folders) in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    _in_child(write_dcp, rl32 / "model.safetensors", dcp_dir)
    log(f"wrote the DCP folder ({', '.join(sorted(p.name for p in dcp_dir.iterdir()))}) "
        f"in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    write_verl(spec, rl32 / "model.safetensors", step_dir)
    log(f"wrote the verl actor ({WORLD} gloo ranks, DTensor Shard(0)) in {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(rl32)  # the RL values now live in the DCP and verl layouts; the truth is in truth.json
    truth = json.loads(truth_file.read_text())
    assert truth["params"] == params, (truth["params"], params)

    layouts = build_routes(args.graftkit, work, base, dcp_dir, step_dir)
    runs: dict[str, dict[str, list[RouteRun]]] = {k: {r.name: [] for r in v} for k, v in layouts.items()}
    for layout, routes in layouts.items():
        for rep in range(args.repeats):
            order = routes if rep % 2 == 0 else routes[::-1]
            for route in order:
                run = run_route(route, work)
                runs[layout][route.name].append(run)
                steps = ", ".join(f"{c.label} {m.wall_s:.1f} s / {gb(m.peak_rss_bytes)}"
                                  for c, m in zip(route.commands, run.steps))
                log(f"  [{rep + 1}/{args.repeats}] {layout} {route.name}: {steps}")

    problems = report(runs, layouts, truth, spec, params, args.repeats, log)
    log(f"\nload average after: {_loadavg()}; benchmark wall time {time.perf_counter() - start:.0f} s "
        "(writing included)")
    return 1 if problems else 0


@dataclasses.dataclass(frozen=True)
class Figures:
    """One command's or route's figures over its repeated runs: wall min and median, CPU min, the largest peak
    RSS and peak anonymous memory (memory hardly varies between runs; the largest is the safe figure)."""

    wall_min: float
    wall_med: float
    cpu_min: float
    rss: int
    anon: int

    @classmethod
    def of(cls, walls, cpus, rss, anon) -> Figures:
        return cls(min(walls), statistics.median(walls), min(cpus), max(rss), max(anon))

    def row(self) -> str:
        return (f"{self.wall_min:8.1f} {self.wall_med:8.1f} {self.cpu_min:8.1f} {self.rss / 1e9:6.2f} GB "
                f"{self.anon / 1e9:7.2f} GB")


def _route_figures(rs: list[RouteRun]) -> Figures:
    return Figures.of([r.wall_s for r in rs], [r.cpu_s for r in rs], [r.peak_rss for r in rs],
                      [r.peak_anon for r in rs])


def _step_figures(rs: list[RouteRun], i: int) -> Figures:
    ms = [r.steps[i] for r in rs]
    return Figures.of([m.wall_s for m in ms], [m.cpu_s for m in ms], [m.peak_rss_bytes for m in ms],
                      [m.peak_anon_bytes for m in ms])


def report(runs, layouts, truth: dict, spec: PairSpec, params: int, repeats: int, log) -> list[str]:
    """Print the table and the checks; return what failed."""
    fro_truth = truth["fro_delta"]
    log("")
    log(f"graftkit delta on trainer layouts: {params / 1e9:.3f} B parameters ({gb(spec.model_bytes())} fp32), "
        f"{repeats} run(s) per route; a converter route's wall and cpu are the sums of its two commands', its "
        "peaks the larger of the two; peaks are the largest over the runs")
    head = (f"{'layout':<6} {'route':<8} {'command':<34} {'wall min':>8} {'wall med':>8} {'cpu min':>8} "
            f"{'peak RSS':>9} {'peak anon':>10}")
    log(head)
    log("-" * len(head))
    for layout, routes in layouts.items():
        figs = {}
        for route in routes:
            rs = runs[layout][route.name]
            if len(route.commands) > 1:
                for i, c in enumerate(route.commands):
                    log(f"{layout:<6} {route.name:<8} {c.label:<34} {_step_figures(rs, i).row()}")
            figs[route.name] = f = _route_figures(rs)
            label = "route total" if len(route.commands) > 1 else route.commands[0].label
            log(f"{layout:<6} {route.name:<8} {label:<34} {f.row()}")
        d, c = figs["direct"], figs["convert"]
        log(f"{layout:<6} {'ratio':<8} {'direct / convert':<34} {d.wall_min / c.wall_min:7.2f}× "
            f"{d.wall_med / c.wall_med:7.2f}× {d.cpu_min / c.cpu_min:7.2f}× {d.rss / c.rss:8.2f}× "
            f"{d.anon / c.anon:9.2f}×")
        log("")

    log(f"{'layout':<6} {'route':<8} {'dtype read':<11} {'total ‖Δ‖_F':>22} {'rel. to truth':>14}")
    log(f"{'truth':<6} {'':<8} {'fp32':<11} {fro_truth:22.15e} {'':>14}")
    for layout in layouts:
        for name in ("direct", "convert"):
            r = runs[layout][name][0]
            log(f"{layout:<6} {name:<8} {_precision(r):<11} {_fro(r):22.15e} {_rel(_fro(r), fro_truth):14.2e}")
    for layout in layouts:
        p = runs[layout]["direct"][0].delta.get("precision") or {}
        log(f"direct {layout} precision: {p.get('dtype')}, {p.get('source')}")

    problems: list[str] = []
    fro = {(lay, n): _fro(runs[lay][n][0]) for lay in layouts for n in ("direct", "convert")}
    for lay in layouts:
        for n in ("direct", "convert"):
            frs = [_fro(r) for r in runs[lay][n]]
            if max(frs) - min(frs) > RTOL_SAME * abs(fro_truth):
                problems.append(f"{lay} {n}: repeated runs disagree ({frs})")
    checks = [
        ("DCP direct == DCP convert", fro["DCP", "direct"], fro["DCP", "convert"], RTOL_SAME),
        ("verl direct == DCP direct", fro["verl", "direct"], fro["DCP", "direct"], RTOL_SAME),
        ("DCP direct == truth", fro["DCP", "direct"], fro_truth, RTOL_TRUTH),
        ("verl direct == truth", fro["verl", "direct"], fro_truth, RTOL_TRUTH),
    ]
    log("")
    for what, a, b, tol in checks:
        rel = _rel(a, b)
        ok = rel <= tol
        log(f"check {what:<26} rel. difference {rel:.2e} (≤ {tol:.0e}): {'equal' if ok else 'NOT EQUAL'}")
        if not ok:
            problems.append(f"{what}: {a!r} vs {b!r} (rel. {rel:.2e} > {tol:.0e})")
    dtypes = {lay: {n: _precision(runs[lay][n][0]) for n in ("direct", "convert")} for lay in layouts}
    if dtypes["DCP"] != {"direct": "float32", "convert": "float32"} or dtypes["verl"]["direct"] != "float32":
        problems.append(f"unexpected dtypes read: {dtypes}")
    rel_bf16 = _rel(fro["verl", "convert"], fro_truth)
    log(f"verl converter route (bf16, as verl's merger writes): ‖Δ‖_F {rel_bf16:.1%} off the fp32 truth "
        f"(dtype read: {dtypes['verl']['convert']})")
    if problems:
        log("\nCHECKS FAILED:")
        for p in problems:
            log(f"  {p}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
