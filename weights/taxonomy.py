"""What every tensor of a checkpoint is: its parameter group and its layer.

Architecture knowledge lives in data, one JSON table per family under ``weights/architectures/``:
``{"family": ..., "model_types": [...], "groups": {group: [pattern, ...]}}``. A pattern is a tensor
name with four kinds of placeholder, so tables read like the names they match:

- ``{layer}``        a decoder layer index (digits), recorded as the tensor's layer;
- ``{vision_layer}`` a vision-tower block index, recorded as its layer in the ``vision`` stack;
- ``{a,b,c}``        one of the alternatives (an alternative may be empty or contain dots);
- ``*``              one name segment (no dots); ``**`` anything, dots included.

A table may also set ``"fallback_priority"`` (default 10; lower wins, see below), ``"generic": true``
(the one table of no family, below) and ``"notes"`` (why its tensors sit in the groups they do).

Which table classifies a checkpoint, recorded as :attr:`Taxonomy.matched_by` (one of ``MATCHED_BY``):

1. ``"model_type"``: the table that lists the config's ``model_type``; it is authoritative, so a tensor
   it does not claim is an error even if another table would claim it;
2. ``"names"``: else (no model type, or one no table lists) the family table that claims every tensor,
   the lowest ``fallback_priority`` first, then the one that leaves the fewest of its patterns unused.
   Tables with no model types (``mistral_consolidated``: files without a config.json) are found only so;
3. ``"generic"``: else ``generic.json``, the decoder conventions most families share
   (``model.layers.{layer}.self_attn.**``, ``.mlp.**``, ``*norm``, ``embed_tokens``, ``lm_head``), if
   it claims every tensor. A checkpoint it does not claim fully is refused.

Every tensor must be matched by exactly one pattern of its table: none is an :class:`UnknownTensors`
error that lists the names, more than one is a bug in the table (the tests prove the partition on a
tiny model of every covered architecture).

Conventions every table keeps (so tables that claim the same name agree, as the tests check):
everything under a layer's attention module is ``attn``, its norms included (``q_norm``/``k_norm``,
DeepSeek's MLA ``q_a_layernorm``/``kv_a_layernorm`` between the latent down- and up-projections);
experts, shared experts and the router (``gate``, ``e_score_correction_bias``) are ``mlp``; the norms
around the sublayers and the final norm are ``norm``; a vision tower is ``vision`` whole (its
embeddings, norms and pooling head included; its blocks are the vision stack) and the multimodal
projector is ``projector`` whole (its norms, LLaVA-NeXT's ``image_newline``).

Layer bands: for a stack of ``n`` layers, layer ``i`` is in band ``⌊3i/n⌋`` (0 = early, 1 = mid,
2 = late), so the thirds differ in size by at most one and ``late`` is never larger than ``early``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

from ..core.errors import GraftkitError

GROUPS: tuple[str, ...] = ("embed", "attn", "mlp", "norm", "lm_head", "vision", "projector")
BANDS: tuple[str, ...] = ("early", "mid", "late")
DECODER, VISION = "decoder", "vision"
MATCHED_BY: tuple[str, ...] = ("model_type", "names", "generic")
_TABLE_DIR = Path(__file__).parent / "architectures"


class UnknownTensors(GraftkitError):
    """Tensors that no rule of the architecture's table claims."""

    def __init__(self, family: str, names: list[str]):
        self.names = names
        shown = ", ".join(names[:8]) + (f", … ({len(names) - 8} more)" if len(names) > 8 else "")
        super().__init__(
            f"{len(names)} tensor(s) not claimed by the '{family}' taxonomy table: {shown}",
            "pass --unknown keep-base to keep them from the base model, "
            f"or add patterns to weights/architectures/{family}.json",
        )


@dataclass(frozen=True)
class TensorRole:
    """The group of one tensor and, for per-layer tensors, its stack and layer index."""

    name: str
    group: str  # one of GROUPS, or "unknown" (kept from base when --unknown keep-base)
    layer: int | None = None
    stack: str | None = None  # DECODER or VISION for per-layer tensors


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Translate a table pattern (see the module docstring) into an anchored regular expression."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "{":
            j = pattern.index("}", i)
            body = pattern[i + 1 : j]
            if body == "layer":
                out.append(r"(?P<layer>\d+)")
            elif body == "vision_layer":
                out.append(r"(?P<vision_layer>\d+)")
            else:
                out.append("(?:" + "|".join(re.escape(a) for a in body.split(",")) + ")")
            i = j + 1
        elif pattern.startswith("**", i):
            out.append(r".+")
            i += 2
        elif c == "*":
            out.append(r"[^.]+")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


@dataclass(frozen=True)
class Table:
    """One architecture family's patterns, compiled."""

    family: str
    model_types: tuple[str, ...]
    rules: tuple[tuple[str, str, re.Pattern[str]], ...]  # (group, pattern, regex)
    priority: int = 10  # "fallback_priority": which table wins when names alone must decide
    generic: bool = False  # the table of no family, tried last (see the module docstring)

    def matches(self, name: str) -> list[tuple[str, str, re.Match[str]]]:
        return [(g, p, m) for g, p, rx in self.rules if (m := rx.match(name))]

    def unclaimed(self, names: Iterable[str]) -> list[str]:
        """The names no pattern of this table matches."""
        return [n for n in names if not self.matches(n)]

    def role(self, name: str) -> TensorRole | None:
        hits = self.matches(name)
        if not hits:
            return None
        if len(hits) > 1:
            raise GraftkitError(
                f"tensor {name} matches {len(hits)} patterns of the '{self.family}' table "
                f"({'; '.join(f'{g}: {p}' for g, p, _ in hits)})",
                f"make the patterns of weights/architectures/{self.family}.json disjoint",
            )
        group, _, m = hits[0]
        found = m.groupdict()
        if found.get("layer") is not None:
            return TensorRole(name, group, int(found["layer"]), DECODER)
        if found.get("vision_layer") is not None:
            return TensorRole(name, group, int(found["vision_layer"]), VISION)
        return TensorRole(name, group)


@lru_cache(maxsize=None)
def tables() -> tuple[Table, ...]:
    """Every architecture table shipped in ``weights/architectures/``, in file-name order."""
    out = []
    for path in sorted(_TABLE_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        bad = set(raw["groups"]) - set(GROUPS)
        if bad:
            raise GraftkitError(f"{path}: unknown group(s) {sorted(bad)}", f"use one of {GROUPS}")
        generic = bool(raw.get("generic", False))
        if generic and raw["model_types"]:
            raise GraftkitError(
                f"{path}: a generic table lists model types {raw['model_types']}",
                "list them in a family table; the generic one applies only to model types no table lists",
            )
        rules = tuple(
            (group, p, compile_pattern(p)) for group, patterns in raw["groups"].items() for p in patterns
        )
        out.append(Table(raw["family"], tuple(raw["model_types"]), rules,
                         int(raw.get("fallback_priority", 10)), generic))
    return tuple(out)


def table_for(model_type: str | None, names: Iterable[str]) -> tuple[Table, str]:
    """The table that classifies a checkpoint, and how it was found (one of ``MATCHED_BY``): the table
    listing ``model_type``; else the best-fitting family table that claims every name; else the generic
    table if it claims every name (the order of the module docstring)."""
    if model_type:
        for t in tables():
            if model_type in t.model_types:
                return t, "model_type"
    names = list(names)
    complete = [t for t in tables() if not t.generic and not t.unclaimed(names)]
    if complete:
        # Several tables may claim every name (their groups agree, as the tests prove): the family
        # is the one with the lowest "fallback_priority" (Llama's, the most common), then the one
        # that leaves the fewest of its patterns unused.
        def fit(t: Table) -> tuple[int, int]:
            return t.priority, sum(1 for _, _, rx in t.rules if not any(rx.match(n) for n in names))

        return min(complete, key=fit), "names"
    generic = sorted((t for t in tables() if t.generic), key=lambda t: t.priority)
    for t in generic:
        if not t.unclaimed(names):
            return t, "generic"
    known = sorted({mt for t in tables() for mt in t.model_types})
    left = ""
    if generic:
        missing = generic[0].unclaimed(names)
        shown = ", ".join(missing[:5]) + (f", … ({len(missing) - 5} more)" if len(missing) > 5 else "")
        left = f"; the generic table leaves {len(missing)} of {len(names)} unclaimed: {shown}"
    subject = f"model_type '{model_type}'" if model_type else "this checkpoint (no model_type)"
    raise GraftkitError(
        f"no taxonomy table covers {subject} and no table claims all its tensors{left}",
        f"add weights/architectures/<family>.json (known model types: {', '.join(known)})",
    )


@dataclass(frozen=True)
class Taxonomy:
    """Every tensor's role in one checkpoint, plus the facts a selection needs."""

    family: str
    roles: Mapping[str, TensorRole]
    tied: bool
    unknown: tuple[str, ...] = ()
    n_layers: Mapping[str, int] = field(default_factory=dict)  # per stack: max index + 1
    matched_by: str = "model_type"  # how the table was found: one of MATCHED_BY

    def group_names(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {g: [] for g in GROUPS}
        for r in self.roles.values():
            if r.group in out:
                out[r.group].append(r.name)
        return {g: v for g, v in out.items() if v}


def classify(
    names: Iterable[str],
    model_type: str | None = None,
    tied: bool | None = None,
    unknown: str = "error",
) -> Taxonomy:
    """Assign every tensor name a :class:`TensorRole`.

    ``tied``: whether the output head shares the embedding (from the config); ``None`` infers it from
    the names (no ``lm_head`` tensor means tied). ``unknown``: ``"error"`` raises
    :class:`UnknownTensors`; ``"keep-base"`` records them with group ``"unknown"``.
    """
    if unknown not in ("error", "keep-base"):
        raise GraftkitError(f"--unknown {unknown!r} is not an option", "use 'error' or 'keep-base'")
    names = list(names)
    table, matched_by = table_for(model_type, names)
    roles: dict[str, TensorRole] = {}
    missing: list[str] = []
    for n in names:
        role = table.role(n)
        if role is None:
            missing.append(n)
            role = TensorRole(n, "unknown")
        roles[n] = role
    if missing and unknown == "error":
        raise UnknownTensors(table.family, missing)
    n_layers: dict[str, int] = {}
    for r in roles.values():
        if r.stack is not None:
            n_layers[r.stack] = max(n_layers.get(r.stack, 0), r.layer + 1)
    has_head = any(r.group == "lm_head" for r in roles.values())
    return Taxonomy(
        table.family, roles, tied if tied is not None else not has_head, tuple(missing), n_layers, matched_by
    )


# ----------------------------------------------------------------------------------------- layers


def band_of(layer: int, n_layers: int) -> str:
    """The band (early/mid/late) of ``layer`` in a stack of ``n_layers``: ⌊3i/n⌋."""
    return BANDS[(3 * layer) // n_layers]


def band_rule(n_layers: int) -> str:
    """The band rule, spelled out for a stack of ``n_layers`` (printed by the commands)."""
    parts = []
    for b in BANDS:
        members = [i for i in range(n_layers) if band_of(i, n_layers) == b]
        span = f"{members[0]}–{members[-1]}" if members else "none"
        parts.append(f"{b} {span}")
    return f"band(i) = ⌊3i/n⌋ with n = {n_layers}: " + ", ".join(parts)


def parse_layers(spec: str, n_layers: int) -> frozenset[int] | None:
    """Parse ``all | early | mid | late | 0-3,10`` (comma lists mix bands, indices and ranges).

    Returns ``None`` for ``all`` (every tensor, per-layer or not) and otherwise the set of decoder
    layer indices.
    """
    spec = spec.strip().lower()
    if spec in ("", "all"):
        return None
    if n_layers <= 0:
        raise GraftkitError(f"--layers {spec}: this model has no decoder layers", "use --layers all")
    out: set[int] = set()
    for tok in (t.strip() for t in spec.split(",")):
        if tok in BANDS:
            out.update(i for i in range(n_layers) if band_of(i, n_layers) == tok)
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", tok)
        if not m:
            raise GraftkitError(
                f"--layers: cannot read '{tok}'", "use all, early, mid, late, or indices like 0-3,10"
            )
        lo, hi = int(m[1]), int(m[2] or m[1])
        if lo > hi or hi >= n_layers:
            raise GraftkitError(
                f"--layers: '{tok}' is outside the model's decoder layers 0–{n_layers - 1}",
                "pick indices inside that range",
            )
        out.update(range(lo, hi + 1))
    return frozenset(out)
