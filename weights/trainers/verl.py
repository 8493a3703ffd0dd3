"""verl FSDP actor checkpoints (``global_step_N/actor/``), the ranks' shards joined in fp32.

verl's ``FSDPCheckpointManager.save_checkpoint`` writes, per step, ``actor/model_world_size_W_rank_R.pt`` (each
rank's sharded state dict: name → DTensor, its local shard of the fp32 parameter, for FSDP1 with verl's device mesh
and for FSDP2), ``optim_world_size_W_rank_R.pt``, ``extra_state_world_size_W_rank_R.pt``, ``fsdp_config.json``
(FSDP version, world size) and ``huggingface/`` (config, tokenizer, generation config). A run folder
(``checkpoints/<project>/<experiment>/``) holds ``global_step_N/`` folders and ``latest_checkpointed_iteration.txt``.

A tensor is read by joining its local shards in mesh order along each placement's dimension (``Shard(d)``:
concatenated along ``d``, the chunks ``torch.chunk`` cut; ``Replicate``: the first replica's), in the dtype the
shards hold — where verl's own merger (``python -m verl.model_merger merge``) casts every tensor to bf16. The rank
files are memory-mapped and loaded with ``torch.load(weights_only=True)`` with DTensor's own classes admitted; the
optimizer and extra-state files are never opened.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...core.errors import GraftkitError
from ..reader import Checkpoint, Found, Reader, TensorMeta, _read_json
from ..safetensors_file import code_of
from .common import Remapped, dtype_words, load_mapped, with_tensors

CONVERT = ("python -m verl.model_merger merge --backend fsdp --local_dir STEP/actor --target_dir HF_DIR "
           "(it writes bf16: the fp32 shards are read here directly)")
RANK_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt\Z")
LATEST = "latest_checkpointed_iteration.txt"


def _rank_files(folder: Path) -> dict[int, Path]:
    out: dict[int, Path] = {}
    for p in folder.glob("model_world_size_*_rank_*.pt"):
        m = RANK_FILE.match(p.name)
        if m:
            out[int(m[2])] = p
    return out


def _actor(path: Path) -> Path | None:
    """The ``actor/`` folder ``path`` is, holds (a ``global_step_N/``), or points at (a run folder's latest), else
    None."""
    if not path.is_dir():
        return None
    if _rank_files(path):
        return path
    if _rank_files(path / "actor"):
        return path / "actor"
    latest = path / LATEST
    if latest.is_file():
        try:
            step = int(latest.read_text().strip())
        except (OSError, ValueError):
            return None
        return _actor(path / f"global_step_{step}")
    return None


def recognise(path: Path) -> Found | None:
    """The verl actor checkpoint ``path`` is, holds or points at, else None."""
    actor = _actor(path)
    if actor is None:
        return None
    step = actor.parent.name if actor.name == "actor" else actor.name
    where = f"{step}/actor/, the latest step of run {path.name}/" if actor.parent.parent == path else f"{step}/actor/"
    return Found(actor, f"a verl FSDP actor checkpoint ({where})")


def _safe_globals():
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    import torch.distributed.tensor._dtensor_spec as spec

    extra = [getattr(spec, "ShardOrderEntry")] if hasattr(spec, "ShardOrderEntry") else []  # newer torch pickles it
    return [DTensor, DTensorSpec, TensorMeta, DeviceMesh, Shard, Replicate, Partial, torch.Size, *extra]


def _load(file: Path):
    # DeviceMesh warns on unpickling that no process group exists: none is needed
    return load_mapped(file, _safe_globals(), "DTensor's classes", f"convert it with verl: {CONVERT}",
                       quiet="torch.distributed.device_mesh")


def _ranks(actor: Path) -> tuple[int, tuple[dict, ...]]:
    files = _rank_files(actor)
    worlds = {int(RANK_FILE.match(p.name)[1]) for p in files.values()}
    if len(worlds) != 1:
        raise GraftkitError(f"{actor}: rank files of several world sizes ({', '.join(map(str, sorted(worlds)))})",
                            "keep the files of one save only")
    world = worlds.pop()
    missing = [r for r in range(world) if r not in files]
    if missing:
        raise GraftkitError(f"{actor}: world size {world} but no model file for rank(s) {', '.join(map(str, missing))}",
                            "copy every model_world_size_*_rank_*.pt of the checkpoint")
    states = []
    for r in range(world):
        sd = _load(files[r])
        if not isinstance(sd, dict):
            raise GraftkitError(f"{files[r]}: not a state dict", f"convert it with verl: {CONVERT}")
        states.append(sd)
    return world, tuple(states)


def _coords(t, rank: int) -> tuple[int, ...]:
    mesh = t.device_mesh.mesh
    hit = (mesh == rank).nonzero()
    return tuple(int(x) for x in hit[0]) if len(hit) else ()


def join(name: str, shards: list, actor: Path):
    """One tensor from its ranks' values: a plain tensor is the same on every rank; DTensor shards are joined."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard

    first = shards[0]
    if not isinstance(first, DTensor):
        return first.clone()
    placements = first.placements
    if any(not isinstance(p, (Shard, Replicate)) for p in placements):
        raise GraftkitError(f"{actor}: tensor {name} has placements {placements}, not Shard/Replicate",
                            f"convert it with verl: {CONVERT}")
    sharded = [(k, p.dim) for k, p in enumerate(placements) if isinstance(p, Shard)]
    if len({d for _, d in sharded}) < len(sharded):
        raise GraftkitError(f"{actor}: tensor {name} is sharded twice along one dimension ({placements})",
                            f"convert it with verl: {CONVERT}")
    replicated = [k for k, p in enumerate(placements) if isinstance(p, Replicate)]
    pieces: dict[tuple, object] = {}
    for rank, t in enumerate(shards):
        c = _coords(t, rank)
        if not c or any(c[k] for k in replicated):
            continue
        pieces[tuple(c[k] for k, _ in sharded)] = t.to_local()
    out = None
    # join the innermost sharded mesh dimension first
    for level in reversed(range(len(sharded))):
        dim = sharded[level][1]
        grouped: dict[tuple, list] = {}
        for key in sorted(pieces):
            grouped.setdefault(key[:level], []).append(pieces[key])
        pieces = {k: torch.cat(v, dim=dim) for k, v in grouped.items()}
    out = next(iter(pieces.values())) if pieces else None
    shape = tuple(first.shape)
    if out is None or tuple(out.shape) != shape:
        got = list(out.shape) if out is not None else None
        raise GraftkitError(f"{actor}: tensor {name}'s shards join to {got}, not its global shape {list(shape)}",
                            f"the checkpoint is incomplete: {CONVERT}")
    return out.clone() if len(sharded) == 0 else out


def _fsdp_version(actor: Path) -> str:
    f = actor / "fsdp_config.json"
    if f.is_file():
        try:
            return f"FSDP{json.loads(f.read_text()).get('FSDP_version', '?')}"
        except (OSError, ValueError):
            pass
    return "FSDP"


def open_verl(found: Found, path: Path) -> Checkpoint:
    """The :class:`~..reader.Checkpoint` of the verl actor folder ``found.where``."""
    actor = found.where
    mapped = Remapped(lambda: _ranks(actor))
    world, states = mapped.state
    metas = {}
    for name, t in states[0].items():
        if not hasattr(t, "dtype"):
            continue
        try:
            metas[name] = TensorMeta(name, code_of(t.dtype), tuple(t.shape))
        except KeyError:
            raise GraftkitError(f"{actor}: tensor {name} has dtype {t.dtype}", f"convert it with verl: {CONVERT}") from None
    hf = actor / "huggingface"
    config = _read_json(hf / "config.json") if (hf / "config.json").is_file() else None
    source = (f"{dtype_words(m.code for m in metas.values())} shards of verl's {_fsdp_version(actor)} actor "
              f"({world} ranks), joined as saved")
    files = tuple(p for _, p in sorted(_rank_files(actor).items()))
    return with_tensors(Checkpoint(path=Path(path), kind="verl", metas=metas,
                                   reader=lambda n: mapped.read(lambda st: join(n, [s[n] for s in st[1]], actor)),
                                   config=config, config_from=hf if config is not None else None, weight_files=files,
                                   notes=(f"{Path(path).name}: {found.name}: {source}",), foreign_names=True,
                                   source=source), found, CONVERT)


READER = Reader("verl", recognise, open_verl, pickled=True, layout=True, convert=CONVERT)

__all__ = ["CONVERT", "LATEST", "READER", "join", "open_verl", "recognise"]
