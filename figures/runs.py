"""Runs as a study groups them: each run's regime, suite and seed, and the one colour a run has in every figure.

A run of ``graftkit demo`` belongs to a regime (study/design.py ``REGIMES``: null, degrade, collapse; the
``VARIANTS`` count in the regime their table names, e.g. "recipe"; the headroom-suite runs in "headroom").
Where a run's regime comes from, most robust first:

1. the study's recorded config (``attrs["config"]`` of the findings result: the ``StudyConfig`` the demo ran):
   its regimes, the variants it ran and its suites, read with the names the study's grid gives its runs
   (study/pipeline.py ``grid``: ``<regime>-s<seed>``, ``headroom-s<seed>`` on the headroom suite, a variant by
   its name); figures sit below the pipeline, so the names are read here rather than the grid called;
2. the run's name alone: ``<regime>-s<seed>``, or a variant's name in ``VARIANTS`` (no suite known);

a run that neither names (a report of arbitrary runs) has no regime and is drawn with the plain palette.

Colour (:func:`run_colours`): the regime's hue (:data:`REGIME_COLOURS`; another regime name gets a hue of
:data:`EXTRA_HUES` by a digest of its name) in the shade of the run (:data:`SHADES`: a seeded run's seed, a
variant's place in ``VARIANTS`` after the seeds). Both come from the run's name and regime alone, so a run has
the same colour in every figure of a report, in every report, and in the notebook figures
(figures/notebook.py), whatever else is drawn beside it. The SFT reference is drawn in :data:`REFERENCE`;
a run outside any regime, beside regime runs, in :data:`OTHER` (by its place), and when no run of a figure
has a regime every run keeps ``_common.PALETTE`` by its place, as before regimes existed.

A training run's checkpoints measured one by one (``kl`` and ``graft`` with ``--all-checkpoints``: each result
records its ``step`` and the trainer's output_dir, ``trainer_run``) form one :class:`Trajectory`
(:func:`trajectories`), named after the output_dir, which the report draws over the steps.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, Iterable, Mapping, Sequence, TypeVar

from ..core.errors import GraftkitError
from ..results.layout import FINDINGS, SFT, result_labels
from ..results.store import Result
from ..study.design import VARIANTS
from ._common import colour

#: Hue of each regime the study knows (study/design.py), in the order figures list regimes.
REGIME_COLOURS = {"null": "#2b7bba", "degrade": "#e8820c", "collapse": "#c62a2f", "recipe": "#7b4fae",
                  "headroom": "#23964a"}
#: Hues of regimes by other names (a study config with its own regimes), picked by a digest of the name.
EXTRA_HUES = ("#168f8f", "#8c5a3c", "#c2408f", "#8a8a12", "#3d3d99", "#5f8f1f")
#: The SFT reference, beside regime runs.
REFERENCE = "#262626"
#: Runs outside any regime, beside regime runs (by their place among such runs).
OTHER = ("#8c8c8c", "#17becf", "#bcbd22", "#8c564b", "#e377c2", "#525252")
#: Shade of a run: > 0 mixes the hue with white by that fraction, < 0 with black. Indices 0–5 are training
#: seeds (spread light/dark from the pure hue); 6–12 the ``VARIANTS`` in their order, each picked apart from
#: the seeds of the regime the variant counts in (init-b-degrade beside six degrade seeds: the lightest) and
#: from the other variants of its regime (recipe: -0.5, 0.5, 0.0, -0.75, 0.78).
SHADES = (0.0, 0.42, -0.34, 0.64, -0.55, 0.22, -0.5, 0.5, -0.65, 0.82, 0.0, -0.75, 0.78)
#: Shade index of the first variant (a variant's shade: this plus its place in ``VARIANTS``), after the seeds.
VARIANT_SHADE = 6
#: Labels of the SFT reference policy (the study's and the usual name).
REFERENCE_NAMES = (SFT,)
#: The regime (and suite) of the study's runs on the headroom suite.
HEADROOM = "headroom"

_SEEDED = re.compile(r"(?P<regime>[A-Za-z][\w.-]*?)-s(?P<seed>\d+)")


@dataclass(frozen=True)
class Membership:
    """Where one run sits in a study."""

    regime: str
    #: Index into :data:`SHADES` (modulo its length): the seed, or a variant's place after the seeds.
    shade: int
    #: The suite it was trained on (``mastered`` / ``headroom``), None when only its name was read.
    suite: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Study:
    """A study as its recorded config describes it: its regimes in grid order (the learning-rate regimes, those
    its variants count in, then the headroom runs'), the variants it ran, and its task suites (name → tasks)."""

    regimes: tuple[str, ...]
    variants: tuple[str, ...]
    suites: Mapping[str, tuple[str, ...]]


def shade_of(name: str) -> int:
    """The shade index of run ``name``: its seed when it is named ``<regime>-s<seed>``, a variant's place in
    ``VARIANTS`` after :data:`VARIANT_SHADE`, else 0."""
    m = _SEEDED.fullmatch(name)
    if m:
        return int(m["seed"])
    return VARIANT_SHADE + list(VARIANTS).index(name) if name in VARIANTS else 0


def study_from_config(config: Mapping) -> Study:
    """The study a recorded ``StudyConfig`` (its ``as_dict()``) describes: its regimes (``regimes``: name → lr),
    the variants it ran (``variants``, each counting in the regime its ``VARIANTS`` entry names), its headroom
    runs (``headroom_seeds``: regime and suite "headroom") and its suites (name → tasks).

    Raises GraftkitError when the config is not a study's (the caller then reads regimes from run names)."""
    regimes, suites, ran = config.get("regimes"), config.get("suites"), config.get("variants") or ()
    if (config.get("command") not in (None, "demo") or not isinstance(regimes, Mapping)
            or not isinstance(suites, Mapping) or not isinstance(ran, (list, tuple))):
        raise GraftkitError("not a study's config: no regimes, suites and variants recorded")
    variants = tuple(str(v) for v in ran if str(v) in VARIANTS)
    headroom = (HEADROOM,) if config.get("headroom_seeds") else ()
    order = tuple(dict.fromkeys([*(str(r) for r in regimes), *(VARIANTS[v][2] for v in variants), *headroom]))
    return Study(order, variants, {str(k): tuple(str(t) for t in v) for k, v in suites.items()
                                   if isinstance(v, (list, tuple))})


def study_in(results: Iterable[Result]) -> Study | None:
    """The study of a run folder's results: from the first findings result that records a study's config
    (:func:`study_from_config`); None when there is none (regimes then come from run names alone)."""
    for res in results:
        if res.kind != FINDINGS or not isinstance(res.attrs.get("config"), Mapping):
            continue
        try:
            return study_from_config(res.attrs["config"])
        except GraftkitError:
            continue
    return None


def membership(name: str, study: Study | None = None) -> Membership | None:
    """The regime (and shade, suite, seed) of run ``name``: as the study's grid names its runs
    (``<regime>-s<seed>`` for a regime of ``study``, on the headroom suite for the headroom regime and on the
    mastered suite otherwise; a variant it ran by its name), else from the name alone (no suite); None for a run
    in no regime."""
    m = _SEEDED.fullmatch(name)
    if study is not None:
        if m and m["regime"] in study.regimes:
            suite = "headroom" if m["regime"] == HEADROOM else "mastered"
            return Membership(m["regime"], int(m["seed"]), suite, int(m["seed"]))
        if name in study.variants:
            return Membership(VARIANTS[name][2], shade_of(name), "mastered")
    if m:
        return Membership(m["regime"], int(m["seed"]), seed=int(m["seed"]))
    if name in VARIANTS:
        return Membership(VARIANTS[name][2], shade_of(name))
    return None


def regime_colour(regime: str) -> str:
    """The hue of ``regime``: :data:`REGIME_COLOURS`, else one of :data:`EXTRA_HUES` by a digest of the name."""
    return REGIME_COLOURS.get(regime) or EXTRA_HUES[zlib.crc32(regime.encode()) % len(EXTRA_HUES)]


def shade(hex_colour: str, t: float) -> str:
    """``hex_colour`` mixed with white by ``t`` > 0, with black by −``t`` for ``t`` < 0."""
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    mixed = [c + (255 - c) * t if t >= 0 else c * (1 + t) for c in rgb]
    return "#" + "".join(f"{round(min(255.0, max(0.0, c))):02x}" for c in mixed)


def run_colour(m: Membership) -> str:
    """The colour of a run in a regime: the regime's hue in the run's shade."""
    return shade(regime_colour(m.regime), SHADES[m.shade % len(SHADES)])


def run_colours(names: Sequence[str], study: Study | None = None) -> list[str]:
    """One colour per run name, in order (module docstring: a regime run's colour depends on its name alone)."""
    members = [membership(n, study) for n in names]
    if not any(members):
        return [colour(i) for i in range(len(names))]
    out, others = [], 0
    for n, m in zip(names, members):
        if m is not None:
            out.append(run_colour(m))
        elif n in REFERENCE_NAMES:
            out.append(REFERENCE)
        else:
            out.append(OTHER[others % len(OTHER)])
            others += 1
    return out


def regime_order(regimes: Iterable[str], study: Study | None = None) -> list[str]:
    """``regimes`` (each once) in the study's grid order, else the known regimes' order, then as given."""
    given = list(dict.fromkeys(regimes))
    first = list(study.regimes) if study is not None else []
    rank = {r: i for i, r in enumerate(dict.fromkeys([*first, *REGIME_COLOURS]))}
    return sorted(given, key=lambda r: (rank.get(r, len(rank)), given.index(r)))


def study_order(names: Sequence[str], study: Study | None = None) -> list[int]:
    """Indices of ``names`` in the order figures draw runs: the SFT reference, then each regime's runs (regimes
    in :func:`regime_order`, runs by shade), then runs in no regime, each group as given. Without any regime
    run: as given."""
    members = [membership(n, study) for n in names]
    if not any(members):
        return list(range(len(names)))
    rank = {r: i for i, r in enumerate(regime_order([m.regime for m in members if m], study))}

    def key(i: int) -> tuple:
        m = members[i]
        if m is not None:
            return (1, rank[m.regime], m.shade, i)
        return (0 if names[i] in REFERENCE_NAMES else 2, 0, 0, i)

    return sorted(range(len(names)), key=key)


def regime_groups(names: Sequence[str], study: Study | None = None) -> list[tuple[str, list[int]]]:
    """``(regime, indices of its runs)`` for each regime among ``names`` in :func:`regime_order`, then
    (``OUTSIDE``, the runs in no regime) when there are any."""
    members = [membership(n, study) for n in names]
    out = [(r, [i for i, m in enumerate(members) if m is not None and m.regime == r])
           for r in regime_order([m.regime for m in members if m], study)]
    rest = [i for i, m in enumerate(members) if m is None]
    return out + ([(OUTSIDE, rest)] if rest else [])


#: The group of runs in no regime (the SFT policies, arbitrary runs) in a regime menu.
OUTSIDE = "runs in no regime"


T = TypeVar("T")


@dataclass(frozen=True)
class Trajectory(Generic[T]):
    """The results of one training run's checkpoints, one per step, in step order."""

    key: Hashable
    """What the results share (the trainer's output_dir and what was measured, e.g. the base)."""
    label: str
    """The run's name in figures: the output_dir's (``result_labels``), with what the key adds to tell it apart."""
    steps: tuple[int, ...]
    items: tuple[T, ...]


#: How a result places itself in a trajectory: (key, run label, step), or None for a result of no trajectory.
Point = Callable[[T], "tuple[Hashable, str, int] | None"]


def run_label(trainer_run: str) -> str:
    """The name of a trainer's output_dir in figures, as results name its checkpoints (``result_labels``)."""
    return result_labels([trainer_run])[0]


def trajectories(items: Sequence[T], point: Point) -> tuple[list[Trajectory[T]], list[T], list[tuple[T, T]]]:
    """``items`` (oldest first) grouped by the key ``point`` gives each: the trajectories in order of their first
    item, each in step order; the items of no trajectory; and ``(left out, kept)`` for each item whose step its
    trajectory already holds from a newer item (the newer one is drawn, the older one goes with the rest). Labels
    two trajectories share get `` · 2``, `` · 3`` … in order."""
    groups: dict[Hashable, tuple[str, dict[int, int]]] = {}  # key → (label, step → index into items)
    rest: set[int] = set()
    superseded: list[tuple[T, T]] = []
    for i, item in enumerate(items):
        p = point(item)
        if p is None:
            rest.add(i)
            continue
        key, label, step = p
        by_step = groups.setdefault(key, (label, {}))[1]
        if step in by_step:
            superseded.append((items[by_step[step]], item))
            rest.add(by_step[step])
        by_step[step] = i
    out, seen = [], {}
    for key, (label, by_step) in groups.items():
        seen[label] = seen.get(label, 0) + 1
        shown = label if seen[label] == 1 else f"{label} · {seen[label]}"
        steps = sorted(by_step)
        out.append(Trajectory(key, shown, tuple(steps), tuple(items[by_step[s]] for s in steps)))
    return out, [items[i] for i in sorted(rest)], superseded
