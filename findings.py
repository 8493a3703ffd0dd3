"""The study's findings rules: each of DESIGN.md's four findings stated from finished results, with its
interval and a verdict ("reproduced", "partly reproduced", "not reproduced" or "not measured").

Each rule is written from the claim and reads results only through their typed views (eval and
headroom results, graft sweeps, the coupling result); ``tests/test_study.py`` plants outcomes for each
verdict. The pipeline that produces the results is :mod:`graftkit.study`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .evaluation import EvalResult, HeadroomResult
from .graft.experiments import RL_LABEL, label_for
from .rank.coupling import TRACKS_BOTH, CouplingResult
from .stats import BETTER, WORSE, compare
from .store import Result, View
from .webenv.tasks import SUITES


@dataclass(frozen=True)
class RLRun:
    """One GRPO run of the study."""

    name: str
    suite: str
    regime: str
    lr: float
    seed: int


def suite_outcomes(res, tasks) -> np.ndarray:
    """Greedy outcomes of ``tasks`` from an eval result as [seed, task·episode] (rows are the clusters
    that paired statistics resample)."""
    return EvalResult.from_result(res).outcomes(tasks)


def _pts(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:+.1f}"


def _interval(c) -> str:
    return f"{_pts(c.diff)} points [{_pts(c.bootstrap.low)}, {_pts(c.bootstrap.high)}]"


@dataclass(frozen=True)
class Finding:
    """One of the study's four findings as this run found it."""

    number: int
    claim: str
    statement: str
    estimate: float
    low: float
    high: float
    verdict: str  # "reproduced", "partly reproduced", "not reproduced" or "not measured"


def finding_1(evals: Mapping[str, object], runs: list[RLRun]) -> Finding:
    """No configuration credibly improves the SFT baseline on the mastered suite; the middle learning
    rate degrades it and the highest collapses it (success at most half of SFT's)."""
    tasks = SUITES["mastered"]
    sft = suite_outcomes(evals["sft"], tasks)
    grid = [r for r in runs if r.suite == "mastered"]
    comps = {r.name: compare(sft, suite_outcomes(evals[r.name], tasks)) for r in grid}
    better = [n for n, c in comps.items() if c.verdict == BETTER]
    best = max(comps, key=lambda n: comps[n].diff)
    by_regime = {}
    for r in grid:
        by_regime.setdefault(r.regime, []).append(comps[r.name])
    parts = []
    for regime, cs in by_regime.items():
        worse = sum(c.verdict == WORSE for c in cs)
        parts.append(f"{regime}: {worse}/{len(cs)} credibly worse, mean change {_pts(float(np.mean([c.diff for c in cs])))}")
    sft_rate = float(sft.mean())
    degrade_ok = all(c.verdict == WORSE for c in by_regime.get("degrade", [])) and "degrade" in by_regime
    collapse_ok = "collapse" in by_regime and all(
        c.verdict == WORSE and c.rate_b.rate <= 0.5 * sft_rate for c in by_regime["collapse"])
    verdict = ("reproduced" if not better and degrade_ok and collapse_ok else
               "partly reproduced" if not better and (degrade_ok or collapse_ok) else "not reproduced")
    statement = (f"SFT greedy success on the mastered suite {100 * sft_rate:.1f}%. {len(better)}/{len(comps)} GRPO runs "
                 f"credibly improve it; best run {best}: {_interval(comps[best])}. " + "; ".join(parts) + ".")
    c = comps[best]
    return Finding(1, "No GRPO configuration credibly improves a strong SFT baseline on mastered tasks; a middle "
                      "learning rate degrades it and a high one collapses it.",
                   statement, c.diff, c.bootstrap.low, c.bootstrap.high, verdict)


def finding_2(evals: Mapping[str, object], runs: list[RLRun], headroom_res) -> Finding:
    """On the headroom suite (sampled success > greedy), the same recipe raises greedy success."""
    tasks = SUITES["headroom"]
    sft = suite_outcomes(evals["sft"], tasks)
    hr = [r for r in runs if r.suite == "headroom"]
    if not hr:
        return Finding(2, "GRPO helps only where there is headroom.", "no headroom-suite run", math.nan, math.nan,
                       math.nan, "not measured")
    comps = [compare(sft, suite_outcomes(evals[r.name], tasks)) for r in hr]
    pooled = compare(np.concatenate([sft] * len(hr), 1),
                     np.concatenate([suite_outcomes(evals[r.name], tasks) for r in hr], 1))
    hv = HeadroomResult.from_result(headroom_res)
    idx = [hv.tasks.index(t) for t in tasks]
    head = float(hv.success[idx].astype(float).mean() - hv.greedy[idx].astype(float).mean())
    statement = (f"SFT headroom on the headroom suite (sampled − greedy) {_pts(head)} points; GRPO on that suite "
                 f"changes greedy success by {_interval(pooled)} "
                 f"({sum(c.verdict == BETTER for c in comps)}/{len(comps)} runs credibly better).")
    verdict = "reproduced" if pooled.verdict == BETTER else "not reproduced"
    return Finding(2, "On tasks with headroom (sampled success above greedy), GRPO raises success.", statement,
                   pooled.diff, pooled.bootstrap.low, pooled.bootstrap.high, verdict)


def findings_result(findings: list[Finding], cfg) -> Result:
    """The findings as a labelled result; ``cfg`` (the study's config) is its provenance."""
    f = sorted(findings, key=lambda x: x.number)
    arr = lambda key, dt=float: np.array([getattr(x, key) for x in f], dtype=dt)  # noqa: E731
    return Result("findings", {"finding": np.array([str(x.number) for x in f], dtype=object)},
                  {"claim": (("finding",), arr("claim", object)), "statement": (("finding",), arr("statement", object)),
                   "estimate": (("finding",), arr("estimate")), "low": (("finding",), arr("low")),
                   "high": (("finding",), arr("high")), "verdict": (("finding",), arr("verdict", object))},
                  {"config": cfg.as_dict(), "interval": "95% paired bootstrap over evaluation seeds, then episodes",
                   "units": "estimate/low/high: success-rate difference (fraction) unless the statement says otherwise"})


@dataclass(frozen=True)
class FindingsResult(View):
    """A ``findings`` result read by name: the findings in order, whether they state their claims (results
    written before claims were stored do not), and the notes on units and intervals."""

    KINDS = ("findings",)
    PRODUCER = "graftkit demo"

    @property
    def has_claim(self) -> bool:
        return "claim" in self.result.data

    @property
    def findings(self) -> tuple[Finding, ...]:
        res, ids = self.result, [str(f) for f in self.result.coords["finding"]]
        col = {k: (list(res[k]) if k in res.data else [default] * len(ids))
               for k, default in (("claim", ""), ("statement", ""), ("estimate", np.nan), ("low", np.nan),
                                  ("high", np.nan), ("verdict", ""))}
        return tuple(Finding(int(n) if n.isdigit() else n, str(col["claim"][i]), str(col["statement"][i]),
                             float(col["estimate"][i]), float(col["low"][i]), float(col["high"][i]),
                             str(col["verdict"][i])) for i, n in enumerate(ids))

    @property
    def notes(self) -> str:
        return "; ".join(str(self.result.attrs[k]) for k in ("units", "interval")
                         if isinstance(self.result.attrs.get(k), str))


def finding_3(degrade, collapse) -> Finding:
    """Grafting localises the degrade regime to attention + MLP; the collapse regime is not traceable to
    any single group; the embedding dominates weight movement yet is causally inert (``degrade``,
    ``collapse``: the factorial sweeps as :class:`~graftkit.graft.experiments.SweepResult`, None if not run).

    Rules: (a) in the degraded run, the attn+mlp graft alone is credibly worse than base and carries at
    least half of the full RL change; (b) in the collapsed run, no single-group graft carries half of the
    change; (c) the embedding has the largest movement share and its Shapley interval contains zero.
    """
    claim = ("Grafting localises the degrade regime to attention + MLP; the collapse regime is not traceable to any "
             "single group; the embedding change dominates weight movement yet is causally inert.")
    if degrade is None:
        return Finding(3, claim, "no graft sweep of a degraded run", math.nan, math.nan, math.nan, "not measured")
    parts, checks = [], []
    full = degrade.diff(RL_LABEL)
    am = degrade.diff(label_for(("attn", "mlp")))
    groups = degrade.groups
    if am is not None and full is not None:
        share = am[0] / full[0] if full[0] else math.nan
        parts.append(f"degraded run: RL changes success by {_pts(full[0])} [{_pts(full[1])}, {_pts(full[2])}], "
                     f"the attn+mlp graft alone by {_pts(am[0])} [{_pts(am[1])}, {_pts(am[2])}] "
                     f"({100 * share:.0f}% of it)" if np.isfinite(share) else "")
        checks.append(am[2] < 0 and np.isfinite(share) and share >= 0.5)
    sh, ms = degrade.array("shapley"), degrade.array("movement_share")
    if sh is not None:
        parts.append("Shapley " + ", ".join(f"{g} {_pts(sh[i, 0])} [{_pts(sh[i, 1])}, {_pts(sh[i, 2])}]"
                                            for i, g in enumerate(groups)))
    if collapse is not None:
        cf = collapse.diff(RL_LABEL)
        singles = {g: collapse.diff(label_for((g,))) for g in collapse.groups}
        best = max((g for g in singles if singles[g] is not None), key=lambda g: abs(singles[g][0]), default=None)
        if cf is not None and best is not None:
            frac = singles[best][0] / cf[0] if cf[0] else math.nan
            parts.append(f"collapsed run: RL changes success by {_pts(cf[0])} [{_pts(cf[1])}, {_pts(cf[2])}]; the "
                         f"strongest single-group graft ({best}) carries {100 * frac:.0f}% of it")
            checks.append(np.isfinite(frac) and abs(frac) < 0.5)
    if ms is not None and "embed" in groups and sh is not None:
        e = groups.index("embed")
        parts.append(f"embed: {100 * ms[e]:.0f}% of the weight movement, Shapley effect {_pts(sh[e, 0])} "
                     f"[{_pts(sh[e, 1])}, {_pts(sh[e, 2])}]")
        checks.append(int(np.argmax(ms)) == e and sh[e, 1] <= 0 <= sh[e, 2])
    verdict = ("reproduced" if checks and all(checks) else "partly reproduced" if any(checks) else "not reproduced")
    est = am if am is not None else (math.nan,) * 3
    return Finding(3, claim, "; ".join(p for p in parts if p) + ".", float(est[0]), float(est[1]), float(est[2]),
                   verdict)


def finding_4(coupling: CouplingResult | None) -> Finding:
    """Late-layer effective rank tracks capability in both directions.

    Rule: reproduced when the late band's Spearman interval lies above zero and the both-directions
    verdict of the late band is 'tracks in both directions'; partly when only one of the two holds
    (``coupling``: the study's coupling result, None if it was not computed)."""
    claim = "Late-layer effective rank tracks capability in both directions (at 4B; at 8B the two come apart)."
    if coupling is None:
        return Finding(4, claim, "no coupling result", math.nan, math.nan, math.nan, "not measured")
    res = coupling
    if "late" not in res.bands:
        return Finding(4, claim, "the model has no late layer band", math.nan, math.nan, math.nan, "not measured")
    b = res.bands.index("late")
    rho = res.corr("band")[b, res.stats.index("spearman")]
    parts = [f"late-band activation {res.metric} vs greedy success across {len(res.runs)} policies: "
             f"Spearman ρ {rho[0]:+.2f} [{rho[1]:+.2f}, {rho[2]:+.2f}]"]
    verdicts = res.both("verdict", "band")
    verdict_band = None if verdicts is None else str(verdicts[b])
    if res.has_both:
        a, t = res.both("agree", "band")[b], res.both("total", "band")[b]
        parts.append(f"sign of Δrank agrees with Δsuccess in {int(a[0])}/{int(t[0])} improved and "
                     f"{int(a[1])}/{int(t[1])} degraded runs ({verdict_band})")
    checks = [bool(rho[1] > 0), verdict_band == TRACKS_BOTH]
    verdict = "reproduced" if all(checks) else "partly reproduced" if any(checks) else "not reproduced"
    return Finding(4, claim, "; ".join(parts) + ".", float(rho[0]), float(rho[1]), float(rho[2]), verdict)
