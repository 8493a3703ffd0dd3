"""In-place grafting: write a graft into an already loaded model, and restore it exactly on exit.

A sweep evaluates many grafts of one base/RL pair. Loading a model per graft costs a full read and
initialisation each time; here the model is loaded once (from the base) and each graft writes only the
tensors whose coefficient c changes (θ = θ_base + c · (θ_rl − θ_base), see :mod:`graftkit.graft.plan`):

- c = 1 copies the RL tensor's values, c = 0 the base tensor's, bit for bit; any other c is computed by
  :func:`graftkit.graft.splice.splice`, row chunk by row chunk, exactly as :func:`export_graft` computes
  the tensor it writes (a top-fraction graft's tensor that moves in part by
  :func:`graftkit.graft.sparse.masked_value`, as the export does). The value is formed in the checkpoint's dtype and then cast to the parameter's
  dtype by ``copy_`` — the cast ``from_pretrained(dtype=...)`` applies when it loads an exported graft —
  so the grafted model equals ``from_pretrained(export_graft(...))`` bit for bit.
- Before a tensor is first overwritten, with ``verify`` (the default), its bits are checked to equal
  the base checkpoint's tensor (after the same cast): a model that is not the base would make every
  "graft" silently wrong. Its original is then kept (``keep``): ``"base"`` (the default when verifying)
  keeps nothing in memory — the verified bits are the base checkpoint's, so restoring re-reads them from
  the memory-mapped file; ``"copy"`` (the default without verification) saves a copy of only the tensors
  a graft overwrites.
- On any device: values are formed on the CPU exactly as above and copied to the parameter's device, so a
  model on a GPU holds the same bits as the exported graft loaded there.
- With a generation engine as ``mirror`` (``--engine vllm``), every tensor written — by a switch or a restore —
  is sent on to the engine with the parameter's bits (its own weight-reload path; the engine resets its prefix
  cache), so the engine generates from exactly the graft the model holds.
- On exit — normal or by an exception — every tensor not at its original is put back: the model is bit
  for bit what it was. The checkpoints are only read.
- Base and RL must store each tensor in one dtype; an RL checkpoint in another dtype is read through
  :func:`graftkit.weights.cast_like` (``graftkit graft --cast``), so "RL" is RL cast to base's dtype.

Names: a checkpoint tensor is bound to the model's parameter or persistent buffer of the same
``state_dict`` name, else by the first rule of :data:`STATE_DICT_RENAMES` that gives an existing name
(checkpoints written before transformers 5 store vision-language models under older prefixes). Several
checkpoint tensors bound to one storage (a tied output head stored beside the embedding) are written
once, from the parameter's own name; their coefficients must agree. A checkpoint tensor with no
parameter (e.g. per-expert weights that transformers fuses at load time) cannot be grafted in place:
moving one is an error that names it and says to export the graft instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.errors import GraftkitError
from ..weights import Checkpoint, check_pair, storage_key
from .plan import GraftPlan
from .sparse import Cut, masked_value
from .splice import row_chunks, splice

if TYPE_CHECKING:
    import torch

#: Checkpoint name → ``state_dict`` name, tried in order when the checkpoint's own name is not one of
#: the model's. (regex, replacement) as for ``re.sub``, applied once at the start of the name.
STATE_DICT_RENAMES: tuple[tuple[str, str], ...] = (
    # Qwen2-VL / Qwen2.5-VL checkpoints saved before transformers 5: the vision tower at top level and
    # the language model directly under ``model.``.
    (r"^visual\.", "model.visual."),
    (r"^model\.(?!language_model\.|visual\.)", "model.language_model."),
)


def _state_tensors(model) -> dict[str, "torch.Tensor"]:
    """Every parameter and persistent buffer of ``model`` by ``state_dict`` name (aliases included)."""
    out = dict(model.named_parameters(remove_duplicate=False))
    persistent = set(model.state_dict().keys())
    for n, b in model.named_buffers(remove_duplicate=False):
        if n in persistent:
            out[n] = b
    return out


def bind_names(model, names) -> tuple[dict[str, str], list[str]]:
    """Checkpoint tensor names → the model's ``state_dict`` names (see the module docstring), and the
    names no parameter or buffer takes."""
    targets = _state_tensors(model)
    bound, missing = {}, []
    for n in names:
        if n in targets:
            bound[n] = n
            continue
        for rx, repl in STATE_DICT_RENAMES:
            alt = re.sub(rx, repl, n, count=1)
            if alt != n and alt in targets:
                bound[n] = alt
                break
        else:
            missing.append(n)
    return bound, missing


@dataclass
class SwitchStats:
    """What one :meth:`InPlaceGraft.apply` did."""

    written: int = 0
    """Tensors written (their coefficient changed)."""
    bytes: int = 0
    """Bytes of parameter memory written."""
    saved: int = 0
    """Tensors whose original was saved for the first time (and verified against base)."""


@dataclass
class InPlaceGraft:
    """A loaded model bound to its base and RL checkpoints; :meth:`apply` switches it between grafts,
    :meth:`restore` (or leaving the ``with`` block) puts back every tensor it changed.

    The model must hold the base's weights: checked tensor by tensor on first touch when ``verify``,
    and shape always. Use :func:`grafted` for one graft; keep one session for a sweep.
    """

    model: object
    base: Checkpoint
    rl: Checkpoint
    verify: bool = True
    unknown: str = "keep-base"
    keep: str = "auto"
    """Where originals come from on restore: base (the verified base checkpoint), copy (saved copies of
    the overwritten tensors), auto (base when verifying, else copy)."""
    mirror: object | None = None
    """A generation engine over the same weights (:class:`graftkit.agent.engine.VLLMEngine`): after each
    :meth:`apply` and :meth:`restore`, the tensors written are sent to it (``mirror.update``), by ``state_dict``
    name and with the parameter's bits, so the engine holds exactly the model's graft."""
    coef: dict[str, float] = field(default_factory=dict, init=False)
    cuts: dict[str, Cut] = field(default_factory=dict, init=False)
    """The tensors a top-fraction graft holds in part (see :mod:`graftkit.graft.sparse`), with their cuts."""
    _saved: dict[str, "torch.Tensor"] = field(default_factory=dict, init=False, repr=False)
    _touched: set = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.keep == "auto":
            self.keep = "base" if self.verify else "copy"
        if self.keep not in ("base", "copy") or (self.keep == "base" and not self.verify):
            raise GraftkitError(f"keep={self.keep!r}", "use copy, or base together with verify=True")
        # one dtype per tensor in both: an RL stored in another dtype is cast to base's first (cast_like)
        check_pair(self.base, self.rl, self.base.taxonomy(self.unknown), dtypes="same")
        self._targets = _state_tensors(self.model)
        self.bound, self.missing = bind_names(self.model, self.base.metas)
        # One writer per storage: the parameter's own (first) name wins over aliases (tied heads).
        primary = {}
        for n, p in self.model.named_parameters():
            primary.setdefault(storage_key(p), n)
        by_storage: dict[tuple, list[str]] = {}
        for ck_name, sd_name in self.bound.items():
            t = self._targets[sd_name]
            meta = self.base.metas[ck_name]
            if tuple(t.shape) != tuple(meta.shape):
                raise GraftkitError(
                    f"tensor {ck_name} is {list(meta.shape)} in {self.base.path} but the loaded model's "
                    f"{sd_name} is {list(t.shape)}",
                    "load the model from the base checkpoint (--base) before grafting in place",
                )
            if meta.dtype.is_floating_point != t.dtype.is_floating_point:
                raise GraftkitError(
                    f"tensor {ck_name} is {meta.dtype} in {self.base.path} but the loaded model holds {t.dtype}",
                    "load the model from the base checkpoint",
                )
            by_storage.setdefault(storage_key(t), []).append(ck_name)
        self.aliases: dict[str, str] = {}  # checkpoint name → the checkpoint name that writes its storage
        for key, names in by_storage.items():
            owner = next((n for n in names if self.bound[n] == primary.get(key)), names[0])
            for n in names:
                if n != owner:
                    self.aliases[n] = owner
        self.coef = {n: 0.0 for n in self.base.metas}

    # --------------------------------------------------------------------------------------- switch

    def _param(self, name: str):
        return self._targets[self.bound[name]]

    def _same_bits(self, name: str, t) -> bool:
        """Whether parameter ``t`` holds exactly the bits of base tensor ``name`` (cast to its dtype)."""
        import numpy as np

        from ..weights import code_of, tensor_bits

        have = tensor_bits(t)
        want = self.base.array(name) if code_of(t.dtype) == self.base.metas[name].code else \
            tensor_bits(self.base.read(name).to(t.dtype))
        return have.shape == want.shape and np.array_equal(have.view(f"u{have.itemsize}"),
                                                           want.view(f"u{want.itemsize}"))

    def _save(self, name: str) -> None:
        t = self._param(name)
        if self.verify and not self._same_bits(name, t.detach()):
            raise GraftkitError(
                f"the loaded model's {self.bound[name]} differs from tensor {name} of base {self.base.path}",
                "load the model from that base checkpoint (or pass verify=False if it was deliberately changed)",
            )
        if self.keep == "copy":
            self._saved[name] = t.detach().clone()
        self._touched.add(name)

    def _write(self, name: str, c: float, cut: Cut | None = None, neutral: float = 0.0) -> None:
        import torch

        from ..weights import code_of, tensor_bits

        t = self._param(name)
        with torch.no_grad():
            if cut is not None:  # part of the tensor moves: formed whole, as export_graft writes it
                t.copy_(masked_value(self.base.read(name), self.rl.read(name), c, neutral, cut, name))
            elif c == 0 and name in self._saved:
                t.copy_(self._saved[name])
            elif c in (0, 1):
                src = self.base if c == 0 else self.rl
                # same dtype on the CPU: the stored bytes straight into the parameter (a pread, no mapping
                # faults); on a GPU (tensor_bits would be a host copy) the tensor goes over as read
                if not (t.device.type == "cpu" and code_of(t.dtype) == src.metas[name].code and t.is_contiguous()
                        and src.readinto(name, tensor_bits(t))):
                    t.copy_(src.read(name))
            else:
                b, r = self.base.read(name), self.rl.read(name)
                if t.dim() == 0:
                    t.copy_(splice(b, r, c))
                for s in row_chunks(b) if t.dim() else ():
                    t[s].copy_(splice(b[s], r[s], c))

    def apply(self, plan: GraftPlan) -> SwitchStats:
        """Make the model the graft ``plan`` describes, writing only the tensors whose coefficient differs
        from the current graft's (the first call starts from base, c = 0 everywhere)."""
        if plan.needs_cuts:
            raise ValueError("a top-fraction plan must be sparsified (graftkit.graft.plan.sparsify) first")
        stats = SwitchStats()
        missing = sorted(n for n in self.missing if plan.coef.get(n, 0.0) != 0.0 or n in plan.cuts)
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise GraftkitError(
                f"tensor {missing[0]}{more} has no parameter or buffer in the loaded "
                f"{type(self.model).__name__}, so it cannot be grafted in place",
                "export the graft (graftkit graft --out) and load it, or leave that group out",
            )
        for alias, owner in self.aliases.items():
            if (plan.coef.get(alias, 0.0), plan.cuts.get(alias)) != (plan.coef.get(owner, 0.0), plan.cuts.get(owner)):
                raise GraftkitError(
                    f"tensors {owner} and {alias} share one parameter in the loaded model but the graft "
                    f"gives them coefficients {plan.coef.get(owner, 0.0):g} and {plan.coef.get(alias, 0.0):g}",
                    "select both or neither (on a tied model, graft embed)",
                )
        written = []
        for name in self.bound:
            if name in self.aliases:
                continue
            new, cut = float(plan.coef.get(name, 0.0)), plan.cuts.get(name)
            if new == self.coef[name] and cut == self.cuts.get(name):
                continue
            if name not in self._touched:
                self._save(name)
                stats.saved += 1
            self._write(name, new, cut, plan.spec.neutral)
            self.coef[name] = new
            if cut is None:
                self.cuts.pop(name, None)
            else:
                self.cuts[name] = cut
            written.append(name)
            stats.written += 1
            t = self._param(name)
            stats.bytes += t.numel() * t.element_size()
        self._mirror(written)
        return stats

    def _mirror(self, names: list[str]) -> None:
        if self.mirror is not None and names:
            self.mirror.update({self.bound[n]: self._param(n) for n in names})

    def restore(self) -> None:
        """Put every tensor not at its original back (bit-exact) and forget the saved copies."""
        written = [name for name in self._touched if self.coef[name] != 0 or name in self.cuts]
        for name in written:
            self._write(name, 0.0)
        self._mirror(written)
        self._saved.clear()
        self._touched.clear()
        self.cuts.clear()
        self.coef = {n: 0.0 for n in self.base.metas}

    @property
    def saved_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._saved.values())

    def __enter__(self) -> "InPlaceGraft":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


class grafted:
    """``with grafted(model, base, rl, plan):`` — the model is the graft inside the block and exactly
    itself again after it, also when the block raises. Yields the :class:`InPlaceGraft` session."""

    def __init__(self, model, base: Checkpoint, rl: Checkpoint, plan: GraftPlan, *, verify: bool = True,
                 unknown: str = "keep-base", keep: str = "auto", mirror: object | None = None):
        self.session = InPlaceGraft(model, base, rl, verify=verify, unknown=unknown, keep=keep, mirror=mirror)
        self.plan = plan

    def __enter__(self) -> InPlaceGraft:
        try:
            self.session.apply(self.plan)
        except BaseException:
            self.session.restore()
            raise
        return self.session

    def __exit__(self, *exc) -> None:
        self.session.restore()


__all__ = ["InPlaceGraft", "STATE_DICT_RENAMES", "SwitchStats", "bind_names", "grafted"]
