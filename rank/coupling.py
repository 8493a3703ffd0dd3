"""Rank–capability coupling across a set of checkpoints (a control grid): does per-layer rank track success?

Inputs are labelled arrays, never files: ``rank_by_run[run, layer]`` (one rank metric per decoder layer and
checkpoint, e.g. ``value_layer[:, "all", "erank"]`` of a weight-rank result) and ``success[run]`` (each
checkpoint's success rate on the same evaluation episodes). Two pure functions:

- :func:`coupling`: per layer and per band (early/mid/late), the Spearman ρ and Pearson r between rank and
  success across runs, each with a pairs-bootstrap percentile interval (:func:`graftkit.stats.correlation_ci`:
  runs resampled with replacement, ranks recomputed in every resample, percentiles over the resamples where
  the correlation is defined). A band's rank is the mean of its layers' ranks (NaN layers left out), bands by
  ``weights.band_of``: layer i of n is in band ⌊3i/n⌋.
- :func:`both_directions`: relative to the SFT parent, for the runs that credibly improved and the runs that
  credibly degraded (paired verdicts of :func:`graftkit.stats.compare`), how often sign(Δrank) equals
  sign(Δsuccess), with a Wilson interval, and a per-layer verdict by :data:`BOTH_DIRECTIONS_RULE`.

:func:`coupling_result` joins the two into one result (kind ``"coupling"``) for the store.

Degenerate inputs, by rule (:data:`DEGENERATE_RULE`): fewer than 3 runs or a constant success vector raise a
:class:`GraftkitError` (no layer has a defined correlation then); a layer whose rank is constant across runs,
or that has fewer than 3 runs with a finite rank, gets NaN for every bound and its reason in ``reason_layer``.

References
    Spearman (1904), The proof and measurement of association between two things. Am. J. Psychol. 15:72–101.
    Efron & Tibshirani (1993), An Introduction to the Bootstrap, ch. 13 (percentile interval).
    Wilson (1927), Probable inference, the law of succession, and statistical inference. JASA 22:209–212.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..core.errors import GraftkitError
from ..stats import BETTER, WORSE, correlation_ci, wilson_interval
from ..results.layout import BOTH_DIRECTIONS, COUPLING
from ..results.store import Result, View
from ..weights import BANDS, band_of, band_rule

STATS: tuple[str, ...] = ("spearman", "pearson")
BOUNDS: tuple[str, ...] = ("estimate", "low", "high")
DIRECTIONS: tuple[str, ...] = ("improved", "degraded")

TRACKS_BOTH = "tracks in both directions"
ANTI_BOTH = "moves against success in both directions"
TRACKS_IMPROVED = "tracks improvements only"
TRACKS_DEGRADED = "tracks degradations only"
NO_TRACK = "does not track"
TOO_FEW = "too few runs"

#: The one place the per-layer verdict of :func:`both_directions` is defined.
BOTH_DIRECTIONS_RULE = (
    "runs are split by their paired verdict against the SFT parent: 'credibly better' -> improved, 'credibly "
    "worse' -> degraded, any other verdict -> excluded (and counted). Per layer and direction group: Δrank = "
    "rank(run) − rank(SFT), Δsuccess = success(run) − success(SFT); a run agrees when sign(Δrank) == "
    "sign(Δsuccess) and both are non-zero (Δrank = 0 counts as not agreeing); runs whose Δrank is NaN are left "
    "out of that layer's total. The group agrees credibly when the Wilson interval of agree/total lies entirely "
    "above 1/2, and disagrees credibly when it lies entirely below 1/2. Verdict: both groups agree -> 'tracks in "
    "both directions'; both disagree -> 'moves against success in both directions'; only the improved group "
    "agrees -> 'tracks improvements only'; only the degraded group agrees -> 'tracks degradations only'; a group "
    "with no run (total 0) -> 'too few runs'; otherwise 'does not track'"
)

DEGENERATE_RULE = (
    "fewer than 3 runs, or success constant across runs: GraftkitError (no correlation is defined); a layer or "
    "band with fewer than 3 runs of finite rank, or with a rank constant across them: NaN estimate and "
    "interval, reason in reason_layer / reason_band"
)


# ---------------------------------------------------------------------------------------------------
# input handling


def _labels(values: Sequence | None, n: int, default: Sequence, what: str) -> list:
    if values is None:
        return list(default)
    out = list(values)
    if len(out) != n:
        raise GraftkitError(f"{len(out)} {what} labels for {n} {what}s", f"pass one label per {what}")
    if len(set(map(str, out))) != n:
        raise GraftkitError(f"{what} labels repeat: {out}", f"give every {what} a distinct label")
    return out


def _inputs(rank_by_run: Any, success: Any, runs: Sequence[str] | None, layers: Sequence[int] | None,
            n_layers: int | None) -> tuple[np.ndarray, np.ndarray, list[str], list[int], int]:
    R = np.asarray(rank_by_run, dtype=np.float64)
    s = np.asarray(success, dtype=np.float64)
    if R.ndim != 2 or R.shape[1] == 0:
        raise GraftkitError(f"rank_by_run has shape {list(R.shape)}, expected [run, layer]",
                            "pass one row per checkpoint and one column per decoder layer")
    if s.shape != (R.shape[0],):
        raise GraftkitError(f"success has shape {list(s.shape)} for {R.shape[0]} runs of rank_by_run",
                            "pass one success rate per run, in the same run order")
    if not np.isfinite(s).all():
        raise GraftkitError("success holds NaN or inf", "pass finite success rates")
    if np.isinf(R).any():
        raise GraftkitError("rank_by_run holds inf", "pass finite ranks (NaN marks an undefined one)")
    runs_ = [str(r) for r in _labels(runs, R.shape[0], [f"run{i}" for i in range(R.shape[0])], "run")]
    layers_ = [int(L) for L in _labels(layers, R.shape[1], range(R.shape[1]), "layer")]
    n = int(n_layers) if n_layers is not None else max(layers_) + 1
    bad = [L for L in layers_ if not 0 <= L < n]
    if bad:
        raise GraftkitError(f"layers {bad} lie outside a stack of n_layers={n}", "pass the model's decoder depth")
    return R, s, runs_, layers_, n


def _check_enough(s: np.ndarray, runs: list[str]) -> None:
    if s.size < 3:
        raise GraftkitError(f"{s.size} run(s) {runs}: a correlation needs at least 3 checkpoints",
                            "add checkpoints with both a rank and an eval result")
    if np.ptp(s) == 0:
        raise GraftkitError(f"success is constant ({s[0]:g}) across runs {runs}: the correlation with rank is "
                            "undefined", "couple runs whose success rates differ")


def _bands(R: np.ndarray, layers: list[int], n_layers: int) -> tuple[list[str], np.ndarray]:
    """Bands present among ``layers`` (in BANDS order) and the band rank [run, band] = nanmean over its layers."""
    of = [band_of(L, n_layers) for L in layers]
    present = [b for b in BANDS if b in of]
    out = np.full((R.shape[0], len(present)), np.nan)
    for j, b in enumerate(present):
        cols = R[:, [i for i, x in enumerate(of) if x == b]]
        ok = np.isfinite(cols)
        n = ok.sum(1)
        out[:, j] = np.where(n > 0, np.where(ok, cols, 0.0).sum(1) / np.maximum(n, 1), np.nan)
    return present, out


def _correlate(x: np.ndarray, y: np.ndarray, level: float, n_boot: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray, int, str]:
    """([stat, bound] values, [stat] valid resamples, runs used, reason or '') for one column x against y."""
    ok = np.isfinite(x)
    vals = np.full((len(STATS), len(BOUNDS)), np.nan)
    valid = np.zeros(len(STATS), dtype=np.int64)
    n = int(ok.sum())
    if n < 3:
        return vals, valid, n, f"{n} run(s) with a finite rank (need 3)"
    if np.ptp(x[ok]) == 0:
        return vals, valid, n, "rank is constant across runs"
    if np.ptp(y[ok]) == 0:
        return vals, valid, n, "success is constant across the runs with a finite rank"
    for k, stat in enumerate(STATS):
        ci = correlation_ci(x[ok], y[ok], method=stat, level=level, n_boot=n_boot, seed=seed)
        vals[k] = (ci.estimate, ci.low, ci.high)
        valid[k] = ci.n_valid
    return vals, valid, n, ""


# ---------------------------------------------------------------------------------------------------
# correlation


def coupling(
    rank_by_run: Any,
    success: Any,
    n_success: Any | None = None,
    level: float = 0.95,
    n_boot: int = 10_000,
    seed: int = 0,
    *,
    runs: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    n_layers: int | None = None,
    conventions: Mapping[str, Any] | None = None,
    on_column: Callable[[int], None] = lambda total: None,
) -> Result:
    """Per layer and per band: Spearman ρ and Pearson r of rank vs success across runs, with intervals.

    ``rank_by_run[run, layer]`` (NaN = undefined for that run), ``success[run]`` in the same run order;
    ``layers`` are the decoder indices of the columns (default 0..L−1) and ``n_layers`` the model's decoder
    depth (default max(layers)+1), which fixes the bands. ``n_success[run]`` (episodes behind each rate, optional)
    adds a Wilson interval per run's success rate (``success_interval[run, bound]``); the correlation
    intervals resample runs (pairs bootstrap), with every layer and band using the same ``seed``.
    ``conventions`` (which metric, which target, how layers are indexed) is copied into attrs. ``on_column(total)``
    is called as each of the ``total`` layers and bands is done (each is ``n_boot`` resamples of both statistics).

    Returns kind ``"coupling"``: ``corr_layer[layer, stat, bound]``, ``corr_band[band, stat, bound]``,
    ``n_layer[layer]`` / ``n_band[band]`` (runs used), ``valid_boot_layer[layer, stat]`` /
    ``valid_boot_band[band, stat]``, ``reason_layer`` / ``reason_band`` ('' when defined), ``rank[run, layer]``,
    ``rank_band[run, band]``, ``success[run]``. Degenerate inputs follow :data:`DEGENERATE_RULE`.
    """
    R, s, runs_, layers_, n = _inputs(rank_by_run, success, runs, layers, n_layers)
    _check_enough(s, runs_)
    band_names, RB = _bands(R, layers_, n)
    columns = R.shape[1] + RB.shape[1]

    def block(M: np.ndarray):
        corr = np.full((M.shape[1], len(STATS), len(BOUNDS)), np.nan)
        valid = np.zeros((M.shape[1], len(STATS)), dtype=np.int64)
        used = np.zeros(M.shape[1], dtype=np.int64)
        why = []
        for j in range(M.shape[1]):
            corr[j], valid[j], used[j], reason = _correlate(M[:, j], s, level, n_boot, seed)
            why.append(reason)
            on_column(columns)
        return corr, valid, used, np.array(why, dtype=object)

    cl, vl, ul, wl = block(R)
    cb, vb, ub, wb = block(RB)
    coords = {
        "run": np.array(runs_, dtype=object), "layer": np.array(layers_, dtype=np.int64),
        "band": np.array(band_names, dtype=object), "stat": np.array(STATS, dtype=object),
        "bound": np.array(BOUNDS, dtype=object),
    }
    data = {
        "corr_layer": (("layer", "stat", "bound"), cl), "corr_band": (("band", "stat", "bound"), cb),
        "n_layer": (("layer",), ul), "n_band": (("band",), ub),
        "valid_boot_layer": (("layer", "stat"), vl), "valid_boot_band": (("band", "stat"), vb),
        "reason_layer": (("layer",), wl), "reason_band": (("band",), wb),
        "rank": (("run", "layer"), R), "rank_band": (("run", "band"), RB), "success": (("run",), s),
    }
    var_attrs = {"rank_band": {"rule": "mean of the band's layers' ranks, NaN layers left out"}}
    if n_success is not None:
        ns = np.asarray(n_success)
        if ns.shape != s.shape or ns.dtype.kind not in "iu" or (ns < 1).any():
            raise GraftkitError(f"n_success has shape {list(ns.shape)}, dtype {ns.dtype}",
                                "pass one positive integer episode count per run")
        k = np.rint(s * ns)
        if (s < 0).any() or (s > 1).any() or (np.abs(k - s * ns) > 1e-6 * ns).any():
            raise GraftkitError("success × n_success is not a whole number of successes for every run",
                                "pass success rates measured on n_success episodes")
        iv = [wilson_interval(int(x), int(m), level) for x, m in zip(k, ns)]
        data["n_success"] = (("run",), ns.astype(np.int64))
        data["success_interval"] = (("run", "bound"), np.array([(r.rate, r.low, r.high) for r in iv]))
        var_attrs["success_interval"] = {"method": iv[0].method, "level": level}
    attrs = {
        "rank_stats": {"spearman": "Pearson correlation of average ranks (ties share their mean rank)",
                       "pearson": "Pearson product-moment correlation"},
        "interval": "pairs bootstrap over runs, percentile interval over resamples with a defined correlation",
        "level": level, "n_boot": n_boot, "seed": seed, "same_seed_every_layer": True,
        "band_rule": band_rule(n), "n_layers": n, "band_value": "mean rank over the band's layers (NaN left out)",
        "degenerate": DEGENERATE_RULE, **dict(conventions or {}),
    }
    return Result(COUPLING, coords, data, attrs, var_attrs)


# ---------------------------------------------------------------------------------------------------
# both directions


def _groups(verdicts: Sequence[str], n: int) -> np.ndarray:
    v = [str(x) for x in verdicts]
    if len(v) != n:
        raise GraftkitError(f"{len(v)} verdicts for {n} runs", "pass one paired verdict per run")
    return np.array(["improved" if x == BETTER else "degraded" if x == WORSE else "excluded" for x in v], dtype=object)


def _agree_block(D: np.ndarray, ds: np.ndarray, group: np.ndarray, level: float):
    """Per column of Δrank D[run, col]: agree / total counts and fraction interval per direction, verdict."""
    cols = D.shape[1]
    agree = np.zeros((cols, len(DIRECTIONS)), dtype=np.int64)
    total = np.zeros((cols, len(DIRECTIONS)), dtype=np.int64)
    frac = np.full((cols, len(DIRECTIONS), len(BOUNDS)), np.nan)
    verdict = []
    for j in range(cols):
        credible = {}
        for k, d in enumerate(DIRECTIONS):
            member = (group == d) & np.isfinite(D[:, j])
            same = (np.sign(D[member, j]) == np.sign(ds[member])) & (D[member, j] != 0) & (ds[member] != 0)
            agree[j, k], total[j, k] = int(same.sum()), int(member.sum())
            if total[j, k]:
                w = wilson_interval(int(agree[j, k]), int(total[j, k]), level)
                frac[j, k] = (w.rate, w.low, w.high)
                credible[d] = "agree" if w.low > 0.5 else "disagree" if w.high < 0.5 else "open"
        if len(credible) < len(DIRECTIONS):
            verdict.append(TOO_FEW)
        elif credible["improved"] == credible["degraded"] == "agree":
            verdict.append(TRACKS_BOTH)
        elif credible["improved"] == credible["degraded"] == "disagree":
            verdict.append(ANTI_BOTH)
        elif credible["improved"] == "agree":
            verdict.append(TRACKS_IMPROVED)
        elif credible["degraded"] == "agree":
            verdict.append(TRACKS_DEGRADED)
        else:
            verdict.append(NO_TRACK)
    return agree, total, frac, np.array(verdict, dtype=object)


def both_directions(
    rank_by_run: Any,
    success: Any,
    base_rank: Any,
    base_success: Any,
    verdicts: Sequence[str],
    level: float = 0.95,
    *,
    runs: Sequence[str] | None = None,
    layers: Sequence[int] | None = None,
    n_layers: int | None = None,
    conventions: Mapping[str, Any] | None = None,
) -> Result:
    """Do Δrank and Δsuccess (run − SFT) share their sign, for improved runs and for degraded runs?

    ``verdicts[run]`` are the paired verdicts of each run against the SFT parent on identical episodes
    (:func:`graftkit.stats.compare`: "credibly better", "credibly worse", anything else); ``base_rank[layer]``
    and ``base_success`` are the SFT parent's (or ``base_rank[run, layer]`` and ``base_success[run]`` when runs
    descend from different parents). The counting and verdict rule is :data:`BOTH_DIRECTIONS_RULE`
    (also stored in attrs); band values are band means of the layers' ranks, as in :func:`coupling`.

    Returns kind ``"both-directions"``: ``agree_layer[layer, direction]``, ``total_layer[layer, direction]``,
    ``frac_layer[layer, direction, bound]`` (Wilson), ``verdict_layer[layer]``, the same per band, and
    ``delta_rank[run, layer]``, ``delta_success[run]``, ``direction_run[run]`` (improved/degraded/excluded).
    """
    R, s, runs_, layers_, n = _inputs(rank_by_run, success, runs, layers, n_layers)
    b = np.asarray(base_rank, dtype=np.float64)
    if b.shape not in ((R.shape[1],), R.shape):
        raise GraftkitError(f"base_rank has shape {list(b.shape)} for rank_by_run {list(R.shape)}",
                            "pass the SFT parent's rank at the same layers: [layer], or [run, layer] for one "
                            "parent per run")
    bs = np.asarray(base_success, dtype=np.float64)
    if bs.shape not in ((), s.shape) or not np.isfinite(bs).all():
        raise GraftkitError(f"base_success has shape {list(bs.shape)} (finite: {bool(np.isfinite(bs).all())})",
                            "pass the SFT parent's finite success rate: one number, or one per run")
    group = _groups(verdicts, R.shape[0])
    B = np.broadcast_to(b, R.shape)
    band_names, RB = _bands(R, layers_, n)
    _, BB = _bands(B, layers_, n)
    D, DB, ds = R - B, RB - BB, s - bs
    al, tl, fl, vl = _agree_block(D, ds, group, level)
    ab, tb, fb, vb = _agree_block(DB, ds, group, level)
    excluded = [r for r, g in zip(runs_, group) if g == "excluded"]
    coords = {
        "run": np.array(runs_, dtype=object), "layer": np.array(layers_, dtype=np.int64),
        "band": np.array(band_names, dtype=object), "direction": np.array(DIRECTIONS, dtype=object),
        "bound": np.array(BOUNDS, dtype=object),
    }
    data = {
        "agree_layer": (("layer", "direction"), al), "total_layer": (("layer", "direction"), tl),
        "frac_layer": (("layer", "direction", "bound"), fl), "verdict_layer": (("layer",), vl),
        "agree_band": (("band", "direction"), ab), "total_band": (("band", "direction"), tb),
        "frac_band": (("band", "direction", "bound"), fb), "verdict_band": (("band",), vb),
        "delta_rank": (("run", "layer"), D), "delta_rank_band": (("run", "band"), DB),
        "delta_success": (("run",), ds), "direction_run": (("run",), group),
        "base_rank": (("run", "layer"), np.array(B)), "base_success": (("run",), np.broadcast_to(bs, s.shape).copy()),
    }
    attrs = {
        "rule": BOTH_DIRECTIONS_RULE, "level": level,
        "interval": "Wilson score interval of agree/total (no continuity correction)",
        "n_improved": int((group == "improved").sum()), "n_degraded": int((group == "degraded").sum()),
        "n_excluded": len(excluded), "excluded_runs": excluded, "band_rule": band_rule(n), "n_layers": n,
        **dict(conventions or {}),
    }
    return Result(BOTH_DIRECTIONS, coords, data, attrs)


def coupling_result(corr: Result, both: Result | None) -> Result:
    """One ``"coupling"`` result holding :func:`coupling`'s arrays and, if given, :func:`both_directions`'."""
    if both is None:
        return corr
    for dim in ("run", "layer", "band"):
        if list(corr.coords[dim]) != list(both.coords[dim]):
            raise GraftkitError(f"coupling and both-directions results differ in their {dim} labels",
                                "build both from the same rank_by_run, runs and layers")
    data = dict(corr.data)
    for name, v in both.data.items():
        data[name if name not in data else f"both_{name}"] = v
    attrs = {**corr.attrs, "both_directions": dict(both.attrs)}
    return Result(COUPLING, {**corr.coords, **both.coords}, data, attrs, {**corr.var_attrs, **both.var_attrs})


def verdicts_from_intervals(low: Any, high: Any) -> list[str]:
    """Paired verdicts from interval bounds of Δsuccess per run: low > 0 → better, high < 0 → worse."""
    lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    if lo.shape != hi.shape or lo.ndim != 1:
        raise GraftkitError(f"low {list(lo.shape)} and high {list(hi.shape)}", "pass one interval per run")
    return [BETTER if a > 0 else WORSE if c < 0 else "no credible change" for a, c in zip(lo, hi)]


# ---------------------------------------------------------------------------------------------------
# the typed view every reader goes through


@dataclass(frozen=True)
class CouplingResult(View):
    """A ``"coupling"`` result (:func:`coupling_result`) read by name: correlations per layer and band,
    each run's rank and success, and the both-directions arrays when the result holds them (their names
    take a ``both_`` prefix where they clash with the correlation's)."""

    KINDS = (COUPLING,)
    PRODUCER = "graftkit couple"

    @property
    def metric(self) -> str:
        """The rank metric coupled to success."""
        return str(self.attrs["metric"])

    @property
    def runs(self) -> list[str]:
        return [str(r) for r in self.result.coords["run"]]

    @property
    def layers(self) -> list[int]:
        return [int(L) for L in self.result.coords["layer"]]

    @property
    def bands(self) -> list[str]:
        return [str(b) for b in self.result.coords.get("band", [])]

    @property
    def stats(self) -> list[str]:
        return [str(s) for s in self.result.coords["stat"]]

    @property
    def bound_labels(self) -> np.ndarray:
        return self.result.coords["bound"]

    @property
    def n_layers(self) -> int:
        return int(self.attrs.get("n_layers", len(self.layers)) or len(self.layers))

    @property
    def level(self) -> float:
        return float(self.attrs.get("level", 0.95))

    def has(self, name: str) -> bool:
        return name in self.result.data

    def corr(self, kind: str) -> np.ndarray:
        """``corr_<kind>[row, stat, bound]``, kind "layer" or "band"."""
        return np.asarray(self.result[f"corr_{kind}"])

    def n_runs(self, kind: str) -> np.ndarray | None:
        """Runs behind each row's correlation (``n_<kind>``), None if not recorded."""
        return np.asarray(self.result[f"n_{kind}"]) if self.has(f"n_{kind}") else None

    def reasons(self, kind: str) -> list[str]:
        return [str(r) for r in self.result[f"reason_{kind}"]]

    @property
    def has_both(self) -> bool:
        return self.both("agree", "layer") is not None

    def both(self, what: str, kind: str) -> np.ndarray | None:
        """A both-directions array ``<what>_<kind>`` (agree, total, frac, verdict), None if absent."""
        for name in (f"{what}_{kind}", f"both_{what}_{kind}"):
            if self.has(name):
                return np.asarray(self.result[name])
        return None

    @property
    def directions(self) -> list[str]:
        return [str(d) for d in self.result.coords.get("direction", DIRECTIONS)]

    @property
    def success(self) -> np.ndarray | None:
        return np.asarray(self.result["success"], dtype=np.float64) if self.has("success") else None

    @property
    def success_interval(self) -> np.ndarray | None:
        return np.asarray(self.result["success_interval"]) if self.has("success_interval") else None

    def late_rank(self) -> tuple[np.ndarray, str] | None:
        """Each run's rank in the late band: ``rank_band[run, "late"]``, else the mean over the last third."""
        if self.has("rank_band") and "late" in self.bands:
            return np.asarray(self.result["rank_band"], dtype=np.float64)[:, self.bands.index("late")], \
                "late band (as stored)"
        if not self.has("rank"):
            return None
        late = [i for i, L in enumerate(self.layers) if (3 * L) // max(self.n_layers, 1) == 2]
        if not late:
            return None
        with np.errstate(invalid="ignore"):
            return np.nanmean(np.asarray(self.result["rank"], dtype=np.float64)[:, late], axis=1), \
                "late band (⌊3i/n⌋ = 2)"

    def rows(self, kind: str) -> list[dict]:
        """One row per layer or band: Spearman and Pearson with their interval, runs used, the reason when
        undefined, the band of a layer, and the both-directions counts and verdict when present."""
        names = self.layers if kind == "layer" else self.bands
        corr, n, reasons = self.corr(kind), self.result[f"n_{kind}"], self.reasons(kind)
        out = []
        for j, name in enumerate(names):
            row = {kind: name, **{s: dict(zip(BOUNDS, corr[j, k])) for k, s in enumerate(STATS)},
                   "n": int(n[j]), "reason": reasons[j] or None}
            if kind == "layer":
                row["band"] = band_of(int(name), self.n_layers)
            if self.has_both:
                agree, total, frac = (self.both(w, kind) for w in ("agree", "total", "frac"))
                for d, direction in enumerate(DIRECTIONS):
                    row[direction] = {"agree": int(agree[j, d]), "total": int(total[j, d]),
                                      "frac": frac[j, d, 0], "low": frac[j, d, 1], "high": frac[j, d, 2]}
                row["verdict"] = str(self.both("verdict", kind)[j])
            out.append(row)
        return out
