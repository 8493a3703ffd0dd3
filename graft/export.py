"""Export a graft as a new HF folder, streaming tensor by tensor.

Each output tensor is decided by its coefficient c (see :mod:`graftkit.graft.plan`): c = 0 copies the
base tensor's bytes and c = 1 the RL tensor's, in the kernel where the bytes lie unchanged in a file;
other c splice in row chunks. Memory is bounded by one chunk, whatever the model's size.

The output keeps the base's dtype, so both sides must store every tensor in one dtype: an RL checkpoint
in another dtype is cast to base's first (:func:`graftkit.weights.cast_like`, ``graftkit graft --cast``),
and graft(all groups) is then RL cast to base's dtype, bit for bit.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Callable, Sequence

from .._version import __version__
from ..weights import Checkpoint, OutSpec, check_pair, describe_later, write_checkpoint
from .plan import GraftPlan
from .sparse import masked_value
from .splice import splice_chunks


def _source(ck: Checkpoint, name: str):
    entry = ck.raw.get(name)
    return entry if entry is not None else (lambda: [ck.read(name).contiguous()])


def graft_specs(base: Checkpoint, rl: Checkpoint, plan: GraftPlan) -> list[OutSpec]:
    """What to write, in the base's on-disk order (sequential reads); a top-fraction plan has its cuts
    (:func:`graftkit.graft.plan.sparsify`)."""
    if plan.needs_cuts:
        raise ValueError("a top-fraction plan must be sparsified (graftkit.graft.plan.sparsify) first")
    # else a mismatched pair could export silently (dtypes: the output is base's, so RL must be cast first)
    check_pair(base, rl, base.taxonomy("keep-base"), dtypes="same")

    def order(name: str):
        e = base.raw.get(name)
        return (str(e.file), e.start) if e is not None else ("", 0)

    specs = []
    for name in sorted(base.metas, key=order):
        m, c = base.metas[name], plan.coef[name]
        if name in plan.cuts:  # a top-fraction graft moves part of this tensor (its entries in flat order)
            src = (lambda n=name, c=c: [masked_value(base.read(n), rl.read(n), c, plan.spec.neutral, plan.cuts[n], n)])
        elif c == 0:
            src = _source(base, name)
        elif c == 1:
            src = _source(rl, name)
        else:
            src = (lambda n=name, c=c: splice_chunks(base.read(n), rl.read(n), c))
        specs.append(OutSpec(name, m.code, m.shape, src))
    return specs


def export_graft(
    base: Checkpoint,
    rl: Checkpoint,
    plan: GraftPlan,
    out: Path,
    *,
    force: bool = False,
    max_shard_size: int | str = "5GB",
    command: dict | None = None,
    on_tensor: Callable[[OutSpec], None] = lambda s: None,
    notes: Sequence[str] | Callable[[], Sequence[str]] = (),
) -> Path:
    """Write base ⊕ plan ⊕ RL to ``out`` with provenance; inputs are only read. ``notes`` join the
    checkpoints' and the plan's notes in ``graftkit.json``; a function there is called once the weights are
    written (a check that ran beside the export: its error, raised there, leaves no output)."""
    # the inputs' fingerprints are hashed in background threads while the export reads and writes the
    # same files, and are needed only for graftkit.json, written last
    base_later, rl_later = describe_later(base), describe_later(rl)
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def provenance() -> dict:
        base_desc, rl_desc = base_later(), rl_later()
        return {
            "producer": "graftkit graft",
            "graftkit_version": __version__,
            "created": created,
            "config": {**plan.spec.as_dict(), **(command or {})},
            "parents": [{"role": "base", **base_desc}, {"role": "rl", **rl_desc}],
            "base_model": {"path": base_desc["path"], "fingerprint": base_desc["fingerprint"]},
            "moved_tensors": len(plan.moved()),
            **({"sparsity": dict(plan.sparsity)} if plan.sparsity is not None else {}),
            "selected_tensors": list(plan.selected),
            "notes": [*base.notes, *rl.notes, *plan.notes, *(notes() if callable(notes) else notes)],
        }

    # a single-file checkpoint (rl.ckpt) stands alone: an output beside it is no output inside a model folder
    alone = [c.path for c in (base, rl) if c.loose]
    inputs = [c.path for c in (base, rl) if not c.loose] + [p.parent for p in rl.weight_files if not rl.loose]
    return write_checkpoint(
        out, graft_specs(base, rl, plan), provenance=provenance, inputs=inputs, input_files=alone,
        aux_from=base.folder if base.path.is_dir() else base.config_from, force=force,
        max_shard_size=max_shard_size, on_tensor=on_tensor,
    )
