"""What every tensor of a checkpoint is: its parameter group and its layer.

Architecture knowledge lives in data, one JSON table per family under ``weights/architectures/``:
``{"family": ..., "model_types": [...], "groups": {group: [pattern, ...]}}``. A pattern is a tensor
name with four kinds of placeholder, so tables read like the names they match:

- ``{layer}``        a decoder layer index (digits), recorded as the tensor's layer;
- ``{vision_layer}`` a vision-tower block index, recorded as its layer in the ``vision`` stack;
- ``{a,b,c}``        one of the alternatives (an alternative may be empty or contain dots);
- ``*``              one name segment (no dots); ``**`` anything, dots included.

A table may set ``"fallback_priority"`` (default 10; lower wins) to decide between tables that all
claim a checkpoint whose config names no model type. Every tensor must be matched by exactly one pattern of its family's table: none is an
:class:`UnknownTensors` error that lists the names, more than one is a bug in the table (the tests prove
the partition on a tiny model of every covered architecture).

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

from ..errors import GraftkitError

GROUPS: tuple[str, ...] = ("embed", "attn", "mlp", "norm", "lm_head", "vision", "projector")
BANDS: tuple[str, ...] = ("early", "mid", "late")
DECODER, VISION = "decoder", "vision"
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

    def matches(self, name: str) -> list[tuple[str, str, re.Match[str]]]:
        return [(g, p, m) for g, p, rx in self.rules if (m := rx.match(name))]

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
        rules = tuple(
            (group, p, compile_pattern(p)) for group, patterns in raw["groups"].items() for p in patterns
        )
        out.append(Table(raw["family"], tuple(raw["model_types"]), rules, int(raw.get("fallback_priority", 10))))
    return tuple(out)


def table_for(model_type: str | None, names: Iterable[str]) -> Table:
    """The table listing ``model_type``; without one, the best-fitting table that claims every name."""
    if model_type:
        for t in tables():
            if model_type in t.model_types:
                return t
    names = list(names)
    complete = [t for t in tables() if all(t.matches(n) for n in names)]
    if complete:
        # Several tables may claim every name (their groups agree, as the tests prove): the family
        # is the one with the lowest "fallback_priority" (Llama's, the most common), then the one
        # that leaves the fewest of its patterns unused.
        def fit(t: Table) -> tuple[int, int]:
            return t.priority, sum(1 for _, _, rx in t.rules if not any(rx.match(n) for n in names))

        return min(complete, key=fit)
    known = sorted({mt for t in tables() for mt in t.model_types})
    raise GraftkitError(
        f"no taxonomy table covers model_type '{model_type}' and no table claims all its tensors",
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
    table = table_for(model_type, names)
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
        table.family, roles, tied if tied is not None else not has_head, tuple(missing), n_layers
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
