"""What a graft moves: a mask over tensors, chosen by group and layer band.

θ_graft = θ_base + α · M ⊙ (θ_rl − θ_base), M selecting whole tensors by group × layer. Each tensor gets
one coefficient ``c`` in θ = θ_base + c · (θ_rl − θ_base):

- forward graft: c = α for selected tensors, 0 for the rest;
- ``reverse`` (ablation: revert the selection in the RL model to base): c = 1 − α for selected tensors,
  1 for the rest. With α = 1 this is exactly the forward graft of the complement.

Tensors with c = 0 or c = 1 are copied bit for bit from base or RL. With ``top_frac`` F, M selects entries
instead of whole tensors: the ⌈F·n⌉ of the selected tensors' entries that moved the most
(:mod:`graftkit.graft.sparse`); the rest keep the neutral coefficient (0 forward, 1 reverse). ``--layers`` selects decoder layers
(bands by the rule of :func:`graftkit.weights.band_rule`); tensors outside the decoder stack (embeddings,
the final norm, the head, the vision tower) are selected only with ``--layers all``. On a model with tied
embeddings, selecting ``embed`` also moves a stored ``lm_head`` copy, and the plan says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Mapping

from ..core.errors import GraftkitError
from ..weights import GROUPS, Taxonomy, band_rule, parse_layers
from ..weights.taxonomy import DECODER
from .sparse import Cut, check_fraction, delta_key, sparsity_summary, top_fraction

if TYPE_CHECKING:
    from ..weights import Checkpoint


@dataclass(frozen=True)
class GraftSpec:
    """One graft, as a user states it."""

    groups: tuple[str, ...]
    """Parameter groups to move (embed, attn, mlp, norm, lm_head, vision, projector); empty moves none,
    all seven (``--groups all``) move every group the model has."""
    layers: str = "all"
    """Decoder layers: all | early | mid | late | explicit indices and ranges such as 0-3,10."""
    alpha: float = 1.0
    """Scale of the selected delta: 1 copies RL's tensors exactly, 0.5 is the midpoint."""
    reverse: bool = False
    """Start from RL and revert the selection to base (an ablation) instead of grafting into base."""
    top_frac: float | None = None
    """Move only this fraction of the selected tensors' entries: those of largest |Δ| (None: every entry)."""
    top_scope: str = "tensor"
    """Where ``top_frac`` counts: each tensor's own entries (tensor) or all selected entries together (global)."""

    def __post_init__(self) -> None:
        bad = [g for g in self.groups if g not in GROUPS]
        if bad:
            raise GraftkitError(f"unknown group(s) {', '.join(bad)}", f"choose from {', '.join(GROUPS)}")
        if not math.isfinite(self.alpha):
            raise GraftkitError(f"--alpha {self.alpha} is not a finite number", "pass e.g. --alpha 0.5")
        if self.top_frac is not None:
            check_fraction(self.top_frac, self.top_scope)

    @property
    def neutral(self) -> float:
        """The coefficient of what the graft leaves alone: 0 (base) forward, 1 (RL) reverse."""
        return 1.0 if self.reverse else 0.0

    @classmethod
    def parse(cls, groups: str, layers: str = "all", alpha: float = 1.0, reverse: bool = False,
              top_frac: float | None = None, top_scope: str = "tensor") -> "GraftSpec":
        parts = [g.strip() for g in groups.split(",") if g.strip()]
        if parts == ["all"]:
            parts = list(GROUPS)
        if parts == ["none"]:
            parts = []
        return cls(tuple(dict.fromkeys(parts)), layers, float(alpha), bool(reverse),
                   None if top_frac is None else float(top_frac), top_scope)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GraftPlan:
    """Per-tensor coefficients c of θ = θ_base + c · (θ_rl − θ_base), and what the user should know."""

    spec: GraftSpec
    coef: Mapping[str, float]
    selected: tuple[str, ...]
    notes: tuple[str, ...]
    cuts: Mapping[str, Cut] = field(default_factory=dict)
    """A top-fraction graft's tensors that move in part: ``coef`` on the entries the cut selects, the spec's
    neutral coefficient on the rest (:func:`sparsify` fills it from the checkpoints)."""
    sparsity: Mapping | None = None
    """What a top-fraction graft selected (:func:`graftkit.graft.sparse.sparsity_summary`); None before
    :func:`sparsify` and for a whole-tensor graft."""

    def moved(self) -> list[str]:
        """Tensors that will not be a bit-exact copy of base."""
        return [n for n, c in self.coef.items() if c != 0 or (n in self.cuts and self.spec.neutral != 0)]

    @property
    def needs_cuts(self) -> bool:
        """A top-fraction graft whose entries are not chosen yet (they depend on the checkpoints' values)."""
        return self.spec.top_frac is not None and self.sparsity is None


def plan_graft(tax: Taxonomy, spec: GraftSpec) -> GraftPlan:
    """The coefficients for ``spec`` over the tensors of ``tax`` (see the module docstring)."""
    n_dec = tax.n_layers.get(DECODER, 0)
    layer_set = parse_layers(spec.layers, n_dec)
    groups = set(spec.groups)
    # `--groups all` names every group graftkit knows; it means every group this model has.
    everything = groups == set(GROUPS)
    notes: list[str] = []
    heads = [n for n, r in tax.roles.items() if r.group == "lm_head"]
    if tax.tied and "lm_head" in groups and not everything:
        raise GraftkitError(
            "this model ties its output head to the token embedding, so lm_head cannot move alone",
            "select embed (which moves both)",
        )
    if layer_set is not None:
        notes.append(band_rule(n_dec) + "; --layers selects decoder layers only")

    def chosen(name: str) -> bool:
        r = tax.roles[name]
        if r.group not in groups:
            return tax.tied and "embed" in groups and r.group == "lm_head" and layer_set is None
        return layer_set is None or (r.stack == DECODER and r.layer in layer_set)

    selected = [n for n in tax.roles if chosen(n)]
    if tax.tied and "embed" in groups and layer_set is None:
        notes.append(
            "tied embeddings: grafting embed also moves the output head"
            + (f" (and its stored copy {', '.join(heads)})" if heads else "")
        )
    for g in () if everything else spec.groups:
        if not any(tax.roles[n].group == g for n in selected):
            present = sorted({r.group for r in tax.roles.values() if r.group in GROUPS})
            where = f" in decoder layers {spec.layers}" if layer_set is not None else ""
            raise GraftkitError(
                f"group '{g}' has no tensors{where} in this {tax.family} model",
                f"groups present: {', '.join(present)}"
                + ("; --layers applies to decoder layers only, use --layers all" if layer_set is not None else ""),
            )
    if tax.unknown:
        notes.append(f"{len(tax.unknown)} tensor(s) no table claims are kept from base: {', '.join(tax.unknown[:5])}")
    sel = set(selected)
    a = spec.alpha
    coef: dict[str, float] = {}
    for n, r in tax.roles.items():
        if r.group == "unknown":
            coef[n] = 0.0
        elif spec.reverse:
            coef[n] = 1.0 - a if n in sel else 1.0
        else:
            coef[n] = a if n in sel else 0.0
    return GraftPlan(spec, coef, tuple(selected), tuple(notes))


def sparsify(plan: GraftPlan, base: Checkpoint, rl: Checkpoint) -> GraftPlan:
    """``plan`` with its top-fraction cuts chosen from the two checkpoints (a plan without ``top_frac`` as it is):
    a selected tensor whose every entry is chosen keeps its coefficient, one with none chosen takes the neutral
    coefficient, and the rest move in part (``plan.cuts``). Reads each selected tensor of both once per pass."""
    spec = plan.spec
    if spec.top_frac is None or not plan.needs_cuts:
        return plan
    chosen = set(plan.selected)
    sizes = {n: base.metas[n].numel for n in base.metas if n in chosen}
    cuts = top_fraction(lambda n: delta_key(base.read(n), rl.read(n), n), sizes, spec.top_frac, spec.top_scope)
    coef, partial = dict(plan.coef), {}
    for n, c in cuts.items():
        if c.selected == 0:
            coef[n] = spec.neutral
        elif c.selected < sizes[n]:
            partial[n] = c
    return replace(plan, coef=coef, cuts=partial,
                   sparsity=sparsity_summary(cuts, sizes, spec.top_frac, spec.top_scope))
