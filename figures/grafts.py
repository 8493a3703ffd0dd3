"""Graft experiments: success change per grafted configuration, its attribution to parameter groups,
movement share against causal effect, and the double dissociation between two RL runs.

Inputs: results of kind ``graft-sweep`` (coords config, task, seed, episode, group, group2, bound =
estimate/low/high; ``diff_vs_base[config, bound]``, ``diff_vs_rl[config, bound]``,
``verdict_vs_base[config]``, ``config_groups`` / ``config_layers`` / ``config_alpha``; optional
``main_effect[group, bound]``, ``interaction[group, group2, bound]``, ``shapley[group, bound]``,
``movement_share[group]``) and ``graft-dissociation`` (``effect[run, group, bound]``,
``difference[group, bound]``, ``verdict[group]``). Differences are success-rate fractions (shown in
percentage points) unless the array's attrs give ``unit`` "points"/"pp". Every optional array that is
missing only removes its figure. Results are read through :class:`~graftkit.graft.experiments.SweepResult`
and :class:`~graftkit.graft.experiments.DissociationResult`. The report draws each measure once, a menu picking
the swept run (:func:`by_sweep`). Hover text gives each configuration's share of outputs that parsed, and
:func:`sweep_notes` what the report says beside the figures (outputs that mostly did not parse, a user's file's
coverage).

A sweep scored by KL (``--metric kl``, or ``both`` beside success; graft/kl.py) adds two figures: the fraction of
RL's behavioural change each configuration reproduces on each side's rollouts (:func:`kl_reproduced`:
reproduced_RL on RL's, reproduced_SFT on SFT's, 0 at ∅ and 100% at the full graft) and its attribution per group
(:func:`kl_attribution`: Shapley values and main effects, or the single / leave-one-out effects the sweep stores).
The sum of the KL Shapley values is v(N) − v(∅) with N the swept groups (the sweep's recorded ``groups``), named
so: it is the whole RL model's change only when the swept groups are everything RL moved. The summary reads the
attribution per group through :func:`kl_per_group`.

The sweeps ``graft --all-checkpoints`` writes, one per checkpoint of a training run (each recording its ``step`` and
``trainer_run``), are one trajectory per run, sweep kind and metric (:func:`trajectory_point`, figures/runs.py
``trajectories``). :func:`sweep_trajectory` draws the numbers ``graftkit graft --all-checkpoints`` prints
(graft/commands.py ``trajectory_json``, built from each step's view): per swept group (or, for a sweep without a
group effect, per graft) a line over the steps of its effect on success in points, beside the checkpoint's own
RL − base, and, where the sweeps were scored by KL, of the fraction of RL's behavioural change it reproduces on RL's
rollouts; :func:`trajectory_effect` is what the effect is, as the sweeps record it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..graft.experiments import DissociationResult, SweepResult
from ..results.store import Result
from ._common import (base_layout, bounds, colour, esc, esc_all, interval_error, parsed_text, selector, step_axis,
                      verdict_colour, zero_line)
from .runs import REFERENCE, run_label, study_order


def _scale(v: SweepResult | DissociationResult, name: str) -> float:
    """Factor to percentage points: 1 when the array says it is already in points, else 100."""
    unit = str(v.result.var_attrs.get(name, {}).get("unit", "")).lower()
    return 1.0 if unit in ("points", "pp", "percentage points", "%") else 100.0


def _iv(e: float, lo: float, hi: float) -> str:
    return f"{e:+.2f} [{lo:+.2f}, {hi:+.2f}]" if np.isfinite(e) else "undefined"


def graft_effects(label: str, res: Result) -> go.Figure | None:
    """Per grafted configuration: success change vs the base (filled, coloured by verdict) and vs RL (None for
    a sweep with neither: scored by KL only); the hover gives the share of the configuration's outputs that parsed
    (``SweepResult.parsed``, "not recorded" where the sweep holds no parse counts)."""
    v = SweepResult.from_result(res)
    configs = v.configs
    n = len(configs)
    groups, layers = v.strings("config_groups"), v.strings("config_layers")
    alpha = v.array("config_alpha")
    alpha = np.full(n, np.nan) if alpha is None else alpha.astype(np.float64)
    verdicts = (v.strings("verdict_vs_base", "no verdict stored"), v.strings("verdict_vs_rl", ""))
    verdict = verdicts[0]
    parsed = [parsed_text(v.parsed(c)) for c in configs]
    fig = go.Figure()
    for k, (name, what) in enumerate((("diff_vs_base", "vs base (SFT)"), ("diff_vs_rl", "vs RL"))):
        if v.array(name) is None:
            continue
        s = _scale(v, name)
        e, lo, hi = bounds(v.array(name), v.bound_names)
        custom = [[esc(groups[i]), esc(layers[i]), f"{alpha[i]:g}", esc(verdicts[k][i]),
                   _iv(s * e[i], s * lo[i], s * hi[i]), parsed[i]] for i in range(n)]
        fig.add_trace(go.Scatter(
            y=esc_all(configs), x=s * e, mode="markers", name=what, error_x={**interval_error(e, lo, hi, s),
                                                                           "color": colour(k)},
            marker={"size": 11, "symbol": "circle" if k == 0 else "diamond-open",
                    "color": [verdict_colour(v) for v in verdict] if k == 0 else colour(k),
                    "line": {"color": colour(k), "width": 2}},
            customdata=custom,
            hovertemplate="%{y} (%{fullData.name})<br>groups %{customdata[0]} · layers %{customdata[1]} · "
                          "α %{customdata[2]}<br>change %{customdata[4]} points (95% interval)"
                          "<br>%{customdata[3]}<br>outputs parsed: %{customdata[5]}<extra></extra>",
        ))
    if not fig.data:
        return None
    zero_line(fig, "x")
    fig.update_yaxes(autorange="reversed", type="category")
    return base_layout(fig, f"Graft effects — {esc(label)}",
                       "success(graft) − success(reference) on identical episodes with 95% intervals; fill: green "
                       "credibly better than base, red credibly worse, grey neither",
                       "change in success (percentage points)", "grafted configuration",
                       height=max(320, 140 + 26 * n), legend_title="compared with")


def sweep_notes(res: Result) -> list[str]:
    """What a reader of a sweep's figures needs, by graftkit graft's own rules (graft/commands.py): one line when
    most outputs of some configurations did not parse (``unparsed_lines``), and how the sweep covered each user's
    file it played whole (``file_coverage``)."""
    from ..graft.commands import file_coverage, unparsed_lines

    v = SweepResult.from_result(res)
    # the fields of sweep_json's output that unparsed_lines reads, from the view (a sweep's other arrays may be absent)
    run = {"configs": [{"config": c, "parsed": v.parsed(c)} for c in v.configs] if v.has_success else [],
           "prompt_formats": dict(v.attrs.get("prompt_formats") or {})}
    return unparsed_lines(run) + file_coverage(v)


def attribution(label: str, res: Result) -> go.Figure | None:
    """Shapley values and main effects per parameter group, with 95% intervals (None if neither is stored)."""
    v = SweepResult.from_result(res)
    names = [(n, t) for n, t in (("shapley", "Shapley value"), ("main_effect", "main effect"),
                                  ("group_effect", _group_effect_name(v))) if v.array(n) is not None]
    if v.array("shapley") is not None and v.effect_kind == "shapley":
        names = [x for x in names if x[0] != "group_effect"]  # the same numbers as the Shapley values
    if not names:
        return None
    fig = go.Figure()
    for k, (name, what) in enumerate(names):
        s = _scale(v, name)
        groups = v.axis(name)
        e, lo, hi = bounds(v.array(name), v.bound_names)
        fig.add_trace(go.Bar(
            x=esc_all(groups), y=s * e, name=what, marker_color=colour(k), error_y=interval_error(e, lo, hi, s),
            customdata=[[_iv(s * e[i], s * lo[i], s * hi[i])] for i in range(len(e))],
            hovertemplate="%{x} · %{fullData.name}<br>%{customdata[0]} points (95% interval)<extra></extra>",
        ))
    zero_line(fig)
    fig.update_layout(barmode="group")
    return base_layout(fig, f"Attribution of the success change to parameter groups — {esc(label)}",
                       "Shapley: average marginal contribution over subsets; main effect: mean over the other "
                       "groups' settings of success(with g) − success(without g); whiskers: 95% intervals",
                       "parameter group", "contribution to success (percentage points)", legend_title="measure")


def interaction_heatmap(label: str, res: Result) -> go.Figure | None:
    """Pairwise interactions between grafted groups (None if not stored)."""
    v = SweepResult.from_result(res)
    if v.array("interaction") is None:
        return None
    s = _scale(v, "interaction")
    e, lo, hi = bounds(v.array("interaction"), v.bound_names)
    custom = [[_iv(s * e[i, j], s * lo[i, j], s * hi[i, j]) for j in range(e.shape[1])] for i in range(e.shape[0])]
    lim = float(np.nanmax(np.abs(s * e))) if np.isfinite(e).any() else 1.0
    fig = go.Figure(go.Heatmap(
        z=s * e, x=esc_all(v.axis("interaction", 1)), y=esc_all(v.axis("interaction")), customdata=custom, colorscale="RdBu",
        zmid=0, zmin=-lim or -1, zmax=lim or 1, colorbar={"title": {"text": "interaction (points)", "side": "right"}},
        hovertemplate="%{y} × %{x}<br>interaction %{customdata} points (95% interval)<extra></extra>",
    ))
    fig.update_yaxes(autorange="reversed")
    return base_layout(fig, f"Interactions between grafted groups — {esc(label)}",
                       "success(g and h) − success(g) − success(h) + success(neither), averaged over the rest; "
                       "blue positive, red negative", "group", "group", height=420)


def _group_effect_name(v: SweepResult) -> str:
    return f"group effect ({v.effect_kind})" if v.effect_kind else "group effect"


def effect_per_group(res: Result) -> tuple[str, list[str], np.ndarray, np.ndarray, np.ndarray] | None:
    """The causal effect per group used against movement: Shapley, else main effect, else the single-group
    graft (all layers, α = 1) vs base. Returns (source, groups, estimate, low, high) in points.

    Shapley values, main effects and group effects are the sweep's attribution arrays; the single-group
    fallback reads the configurations when only those were stored."""
    v = SweepResult.from_result(res)
    for name, what in (("shapley", "Shapley value"), ("main_effect", "main effect"),
                       ("group_effect", _group_effect_name(v))):
        if v.array(name) is not None:
            s = _scale(v, name)
            e, lo, hi = bounds(v.array(name), v.bound_names)
            return what, v.axis(name), s * e, s * lo, s * hi
    if v.array("diff_vs_base") is None or v.array("config_groups") is None:
        return None
    layers = v.strings("config_layers", "all")
    alpha = v.array("config_alpha")
    alpha = np.ones(len(v.configs)) if alpha is None else alpha.astype(np.float64)
    s = _scale(v, "diff_vs_base")
    e, lo, hi = bounds(v.array("diff_vs_base"), v.bound_names)
    found: dict[str, int] = {}
    for i, g in enumerate(v.strings("config_groups")):
        parts = [p.strip() for p in g.split(",") if p.strip()]
        if len(parts) == 1 and layers[i] in ("all", "") and alpha[i] == 1.0:
            found.setdefault(parts[0], i)
    if not found:
        return None
    idx = list(found.values())
    return "single-group graft vs base", list(found), s * e[idx], s * lo[idx], s * hi[idx]


#: How a sweep's KL attribution is read (graft/kl.py: per group, the share of RL's behavioural change, by KL on
#: fixed rollouts, that grafting the group reproduces): the :class:`~graftkit.graft.experiments.SweepResult`
#: method ``KL_ACCESSOR(name, side)`` → ``[group, bound]`` or None, the arrays tried in order, and the side
#: (whose rollouts: RL's own). A view without the method, or a sweep without KL, has no KL side.
KL_ACCESSOR = "kl_attribution"
KL_ARRAYS = (("kl_shapley", "Shapley value"), ("kl_main_effect", "main effect"), ("kl_group_effect", "group effect"))
KL_SIDE = "rl"


def kl_per_group(res: Result, side: str = KL_SIDE
                 ) -> tuple[str, list[str], np.ndarray, np.ndarray, np.ndarray, str] | None:
    """A sweep's KL attribution per group as (source, groups, estimate, low, high, unit) — a fraction stored
    as such is shown in % of RL's behavioural change — or None when the sweep view exposes none."""
    v = SweepResult.from_result(res)
    get = getattr(v, KL_ACCESSOR, None)
    if not callable(get) or not getattr(v, "has_kl", False) or side not in getattr(v, "sides", ()):
        return None
    for name, what in KL_ARRAYS:
        arr = get(name, side)
        if arr is None:
            continue
        unit = str(v.var_attrs(name).get("unit", ""))
        scale, shown = (100.0, "% of RL's behavioural change") if unit == "fraction" else (1.0, unit or "as stored")
        e, lo, hi = bounds(np.asarray(arr, dtype=np.float64), v.bound_names)
        groups = v.axis(name, 1) if name in v.result.data else v.groups  # [side, group, bound] over the sweep's groups
        if len(groups) != len(e):
            raise ValueError(f"{name}: {len(e)} values for {len(groups)} groups")
        return f"KL {what} ({side} rollouts)", groups, scale * e, scale * lo, scale * hi, shown
    return None


#: Each KL side (whose rollouts) of a sweep: the fraction it scores, and how its marks are drawn (RL's rollouts
#: filled, SFT's open or hatched).
KL_SIDES = {"rl": ("reproduced_RL (RL's rollouts)", "circle", ""),
            "sft": ("reproduced_SFT (SFT's rollouts)", "diamond-open", "/")}


def _fraction_scale(v: SweepResult, name: str) -> tuple[float, str]:
    """Factor and unit a KL array is shown in: % of RL's behavioural change for a stored fraction."""
    unit = str(v.var_attrs(name).get("unit", ""))
    return (100.0, "% of RL's behavioural change") if unit == "fraction" else (1.0, unit or "as stored")


def kl_reproduced(label: str, res: Result) -> go.Figure | None:
    """Per grafted configuration, the fraction of RL's behavioural change it reproduces on each side's rollouts
    (reproduced_RL, reproduced_SFT: graft/kl.py ``REPRODUCED``), with 95% intervals, the hover giving the share of
    that side's rollout outputs that parsed (``SweepResult.kl_parsed``); None for a sweep without KL."""
    v = SweepResult.from_result(res)
    if not v.has_kl:
        return None
    configs = v.configs
    n = len(configs)
    groups, layers = v.strings("config_groups"), v.strings("config_layers")
    alpha = v.array("config_alpha")
    alpha = np.full(n, np.nan) if alpha is None else alpha.astype(np.float64)
    s_, unit = _fraction_scale(v, "kl_reproduced")
    fig = go.Figure()
    for k, side in enumerate(v.sides):
        name, symbol, _ = KL_SIDES.get(side, (f"reproduced ({side}'s rollouts)", "square", "x"))
        e, lo, hi = np.array([v.reproduced(c, side) for c in configs], dtype=np.float64).reshape(n, 3).T
        who = "RL" if side == "rl" else "SFT" if side == "sft" else side
        rollouts = parsed_text(v.kl_parsed(side))
        custom = [[esc(groups[i]), esc(layers[i]), f"{alpha[i]:g}", _iv(s_ * e[i], s_ * lo[i], s_ * hi[i]),
                   f"{v.kl_per_token(configs[i], side):.4g}", who, rollouts] for i in range(n)]
        fig.add_trace(go.Scatter(
            y=esc_all(configs), x=s_ * e, mode="markers", name=esc(name),
            error_x={**interval_error(e, lo, hi, s_), "color": colour(k)},
            marker={"size": 11, "symbol": symbol, "color": colour(k), "line": {"color": colour(k), "width": 2}},
            customdata=custom,
            hovertemplate="%{y} (%{fullData.name})<br>groups %{customdata[0]} · layers %{customdata[1]} · "
                          "α %{customdata[2]}<br>reproduced %{customdata[3]} (95% interval)<br>"
                          "KL(π_%{customdata[5]}‖π_C) %{customdata[4]} nats per action token<br>outputs parsed on "
                          "%{customdata[5]}'s rollouts: %{customdata[6]}<extra></extra>",
        ))
    zero_line(fig, "x")  # ∅ (SFT)
    fig.add_vline(x=s_, line={"color": "#444", "width": 1, "dash": "dot"})  # the full graft (RL)
    fig.update_yaxes(autorange="reversed", type="category")
    return base_layout(fig, f"Behavioural change each graft reproduces (KL) — {esc(label)}",
                       "by KL on fixed rollouts of RL and SFT: 0 = SFT's behaviour (∅), 100% = RL's (the full graft); "
                       "whiskers: 95% intervals", f"reproduced ({esc(unit)})", "grafted configuration",
                       height=max(320, 140 + 26 * n), legend_title="fraction (whose rollouts)")


def sparsity_curve(label: str, res: Result) -> go.Figure | None:
    """A ``--sweep sparsity``: against the fraction F of the grafted groups' entries moved (the largest |Δ|; log
    axis), the success change from the base with its 95% interval and, with KL, the fraction of RL's behavioural
    change reproduced on each side's rollouts; dotted, RL's own success change. None for any other sweep."""
    v = SweepResult.from_result(res)
    frac = v.array("config_top_frac")
    if v.sweep != "sparsity" or frac is None:
        return None
    roles = v.strings("config_role")
    rows = [i for i, r in enumerate(roles) if r == "graft"]
    order = sorted(rows, key=lambda i: frac[i])
    x = [100 * float(frac[i]) for i in order]
    erank = v.array("config_delta_erank")  # the rank of what each fraction grafts, on hover
    two = v.has_kl and v.array("diff_vs_base") is not None  # success on the left axis, KL on the right
    fig = make_subplots(specs=[[{"secondary_y": True}]]) if two else go.Figure()
    if v.array("diff_vs_base") is not None:
        s = _scale(v, "diff_vs_base")
        e, lo, hi = bounds(v.array("diff_vs_base"), v.bound_names)
        fig.add_trace(go.Scatter(x=x, y=[s * e[i] for i in order], mode="lines+markers", name="success change vs base",
                                 error_y={**interval_error(e[order], lo[order], hi[order], s), "color": colour(0)},
                                 marker={"color": colour(0), "size": 9},
                                 customdata=[[esc(v.configs[i]), "—" if erank is None or not np.isfinite(erank[i])
                                              else f"{erank[i]:.4g}"] for i in order],
                                 hovertemplate="%{customdata[0]}<br>top %{x:.3g}% of entries<br>%{y:+.1f} points"
                                               "<br>effective rank of the grafted Δ %{customdata[1]}<extra></extra>"))
        rl = next((i for i, r in enumerate(roles) if r == "rl"), None)
        if rl is not None:
            fig.add_hline(y=s * e[rl], line={"color": "#444", "width": 1, "dash": "dot"})
    if v.has_kl:
        for k, side in enumerate(v.sides):
            name = KL_SIDES.get(side, (f"reproduced ({side}'s rollouts)",))[0]
            e, lo, hi = np.array([v.reproduced(v.configs[i], side) for i in order], dtype=np.float64).reshape(-1, 3).T
            trace = go.Scatter(x=x, y=100 * e, mode="lines+markers", name=esc(name),
                               error_y={**interval_error(e, lo, hi, 100.0), "color": colour(k + 1)},
                               marker={"color": colour(k + 1), "symbol": "diamond", "size": 9},
                               hovertemplate="top %{x:.3g}% of entries<br>reproduced %{y:.1f}%<extra></extra>")
            fig.add_trace(trace, secondary_y=True) if two else fig.add_trace(trace)
    fig.update_xaxes(type="log")
    scope = v.strings("config_top_scope")
    where = "each tensor's" if any(scope[i] == "tensor" for i in rows if frac[i] < 1) else "all the groups'"
    base_layout(fig, f"How much of the change a fraction of the movement carries — {esc(label)}",
                f"grafting only the largest |Δ| entries ({where} top F); dotted: RL's own success change",
                "entries grafted, % (log scale)", "success change (percentage points)" if v.array("diff_vs_base")
                is not None else "reproduced (% of RL's behavioural change)", legend_title="measure")
    if two:
        fig.update_yaxes(title_text="reproduced (% of RL's behavioural change)", secondary_y=True)
    return fig


def _kl_measures(v: SweepResult) -> list[tuple[str, str]]:
    """The KL attribution arrays a sweep stores, ``(array, name)``, in the order of the success figure (a group
    effect of kind shapley is the Shapley values again, so left out beside them)."""
    kind = v.var_attrs("kl_group_effect").get("kind")
    names = [(n, what) for n, what in (("kl_shapley", "Shapley value"), ("kl_main_effect", "main effect"),
                                       ("kl_group_effect", f"{kind} effect" if kind else "group effect"))
             if v.array(n) is not None]
    if any(n == "kl_shapley" for n, _ in names) and kind == "shapley":
        names = [x for x in names if x[0] != "kl_group_effect"]
    return names


def swept_groups(v: SweepResult) -> list[str]:
    """The groups the sweep grafted, as it records them (``attrs["groups"]``), else its group axis."""
    rec = v.attrs.get("groups")
    return [str(g) for g in rec] if isinstance(rec, (list, tuple)) and rec else v.groups


def kl_shapley_total(v: SweepResult, side: str) -> str | None:
    """The KL Shapley values' sum on ``side``'s rollouts, named for what it is: v(all swept groups) − v(∅), the
    swept groups listed (not the whole RL model: the full graft reproduces 100% by definition); None without."""
    total = v.kl_total(side)
    if total is None:
        return None
    s_, _ = _fraction_scale(v, "kl_shapley")
    unit = "%" if s_ == 100.0 else ""
    e, lo, hi = (s_ * float(x) for x in total)
    return (f"v(all swept groups: {', '.join(swept_groups(v))}) − v(∅) = {e:+.1f}{unit} [{lo:+.1f}, {hi:+.1f}]"
            if np.isfinite(e) else f"v(all swept groups: {', '.join(swept_groups(v))}) − v(∅) undefined")


def kl_attribution(label: str, res: Result) -> go.Figure | None:
    """The fraction of RL's behavioural change (KL) attributed to each parameter group — Shapley values, main
    effects, or the sweep's single / leave-one-out effects — on each side's rollouts (solid: RL's, hatched: SFT's),
    with 95% intervals, and the Shapley total named v(all swept groups) − v(∅); None without KL attribution."""
    v = SweepResult.from_result(res)
    if not v.has_kl:
        return None
    measures = _kl_measures(v)
    if not measures:
        return None
    fig = go.Figure()
    unit = ""
    for k, (name, what) in enumerate(measures):
        s_, unit = _fraction_scale(v, name)
        for side in v.sides:
            arr = v.kl_attribution(name, side)
            groups = v.axis(name, 1)
            e, lo, hi = bounds(arr, v.bound_names)
            fig.add_trace(go.Bar(
                x=esc_all(groups), y=s_ * e, name=f"{what} · {esc(KL_SIDES.get(side, (side,))[0])}",
                offsetgroup=f"{name} {side}", legendgroup=name,
                marker={"color": colour(k), "pattern": {"shape": KL_SIDES.get(side, ("", "", "x"))[2],
                                                        "fillmode": "overlay", "fgcolor": "#ffffff",
                                                        "solidity": 0.4}},
                error_y={**interval_error(e, lo, hi, s_), "color": "#222"},
                customdata=[[_iv(s_ * e[i], s_ * lo[i], s_ * hi[i])] for i in range(len(e))],
                hovertemplate="%{x} · %{fullData.name}<br>%{customdata[0]} points of the reproduced fraction "
                              "(95% interval)<extra></extra>",
            ))
    totals = [f"Σ Shapley on {'RL' if side == 'rl' else 'SFT' if side == 'sft' else esc(side)}'s rollouts = {esc(t)}"
              for side in v.sides if (t := kl_shapley_total(v, side)) is not None]
    zero_line(fig)
    fig.update_layout(barmode="group")
    sub = "<br>".join(["each group's contribution to the fraction of RL's behavioural change a graft reproduces (by "
                       "KL); solid: on RL's rollouts, hatched: on SFT's; whiskers: 95% intervals", *totals])
    fig = base_layout(fig, f"Attribution of the behavioural change (KL) to parameter groups — {esc(label)}", sub,
                      "parameter group", f"contribution ({esc(unit)})", legend_title="measure · whose rollouts",
                      height=460)
    fig.update_layout(margin={"t": 116})  # the same for every option of a menu: room for both sides' totals
    return fig


def by_sweep(figures: Sequence[tuple[str, go.Figure]], what: str = "swept run") -> go.Figure:
    """One measure's figures of several sweeps (or dissociations), ``(label, figure)``: one shown at a time, a
    menu of their labels picking it, swept runs in study order (figures/runs.py; one: its figure as it is)."""
    order = study_order([label for label, _ in figures])
    return selector([(esc(figures[i][0]), figures[i][1]) for i in order], what)


def trajectory_point(res: Result) -> tuple[tuple, str, int] | None:
    """Where a sweep sits in a training run's trajectory: ((trainer_run, sweep, metric, layers), the run's label and
    the sweep, its step) for a sweep ``graft --all-checkpoints`` wrote (``SweepResult.step`` and ``trainer_run``);
    None for any other."""
    v = SweepResult.from_result(res)
    if v.step is None or v.trainer_run is None:
        return None
    layers = str(v.attrs.get("layers", "all"))
    what = f"{v.sweep} sweep" + ("" if layers == "all" else f", layers {layers}") + (" (KL)" if v.metric == "kl" else "")
    return (v.trainer_run, v.sweep, v.metric, layers), f"{run_label(v.trainer_run)} · {what}", v.step


def trajectory_rows(steps: Sequence[int], results: Sequence[Result], names: Sequence[str]) -> dict:
    """What ``graftkit graft --all-checkpoints`` prints of these sweeps (one per step, in step order; ``names``: each
    step's checkpoint): graft/commands.py ``trajectory_json`` over each step's ``sweep_json``."""
    from ..graft.commands import sweep_json, trajectory_json

    views = [SweepResult.from_result(r) for r in results]
    runs = {n: sweep_json(v, (v.attrs.get("rl") or {}).get("path", "")) for n, v in zip(names, views)}
    return trajectory_json(views[0].sweep, runs, dict(zip(names, steps)), {n: "" for n in names}, views[0].trainer_run)


def trajectory_effect(res: Result) -> str:
    """What a trajectory's lines are, as its sweep records it (plain text): each swept group's effect kind and
    formula (``group_effect``'s, else ``kl_group_effect``'s), with the fraction KL scores (``kl_reproduced``'s
    formula on RL's rollouts); for a sweep without a group effect, each graft's change from base."""
    v = SweepResult.from_result(res)
    rec = v.var_attrs("group_effect") if v.array("group_effect") is not None else v.var_attrs("kl_group_effect")
    kl = v.var_attrs("kl_reproduced").get("formula") if v.has_kl else None
    kl = kl.get("rl") if isinstance(kl, dict) else kl
    on = " and ".join((["on success"] if v.has_success else [])
                      + ([f"on the fraction of RL's behavioural change reproduced, {kl}"] if kl else []))
    if rec.get("kind"):
        return f"the {rec['kind']} effect of each swept group, {rec.get('formula', '')} — {on}"
    return "each graft against base — " + "; ".join((["success(C) − success(base)"] if v.has_success else [])
                                                  + ([kl] if kl else []))


def unmoved_steps(t: dict) -> list[tuple[int, str]]:
    """(step, checkpoint) of each row of a KL-scored trajectory whose checkpoint is exactly SFT's on RL's rollouts
    (KL(π_RL‖π_SFT) = 0 on every token): its behaviour had not moved, so no graft reproduces any of a change."""
    return [(r["step"], r["checkpoint"]) for r in t["rows"] if r.get("kl_rl_sft_per_token") == 0.0]


def trajectory_panels(res: Result) -> tuple[str, ...]:
    """The panels of a sweep's :func:`sweep_trajectory`: ``success`` where it holds success outcomes, then
    ``reproduced_rl`` where it was scored by KL (figures of one menu share their panels)."""
    v = SweepResult.from_result(res)
    return tuple(p for p, on in (("success", v.has_success), ("reproduced_rl", v.has_kl)) if on)


def sweep_trajectory(label: str, steps: Sequence[int], results: Sequence[Result], names: Sequence[str]
                     ) -> go.Figure:
    """One training run's sweeps, one per checkpoint step (``names``: each step's checkpoint): per swept group (a
    sweep without a group effect: per graft) a line over the steps of its effect on success in points with its 95%
    interval, beside the checkpoint's own RL − base (left); where the sweeps were scored by KL, of the fraction of
    RL's behavioural change it reproduces on RL's rollouts (right, 0 = SFT's behaviour, 100% = the checkpoint's).
    The values are :func:`trajectory_rows`'."""
    t = trajectory_rows(steps, results, names)
    rows, columns = t["rows"], t["names"]
    first = SweepResult.from_result(results[0])
    panels = trajectory_panels(results[0])
    s_succ = _scale(first, "group_effect" if t["columns"] == "group" and first.array("group_effect") is not None
                    else "diff_vs_base")
    s_kl, unit = _fraction_scale(first, "kl_reproduced")
    titles = {"success": "effect on success", "reproduced_rl": "change reproduced (KL)"}
    axes = {"success": "percentage points", "reproduced_rl": f"{unit}, RL's rollouts"}
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[titles[p] for p in panels], horizontal_spacing=0.12)
    x = [r["step"] for r in rows]
    checkpoints = esc_all(r["checkpoint"] for r in rows)
    kl_text = [f"{r['kl_rl_sft_per_token']:.4g}" if r.get("kl_rl_sft_per_token") is not None else "—" for r in rows]

    def triple(b) -> tuple[float, float, float]:
        return tuple(float("nan") if v is None else float(v) for v in (b or (None, None, None)))  # type: ignore

    for col, what in enumerate(panels, start=1):
        scale = s_succ if what == "success" else s_kl
        series = [(c, colour(j), [triple(r["effects"].get(c, {}).get(what)) for r in rows]) for j, c in enumerate(columns)]
        if what == "success":
            series.append((RL_VS_BASE, REFERENCE, [triple(r.get("rl_vs_base")) for r in rows]))
        for name, c, vals in series:
            e, lo, hi = (scale * np.array(v, dtype=np.float64) for v in zip(*vals))
            fig.add_trace(go.Scatter(
                x=x, y=e, mode="lines+markers", name=esc(name), legendgroup=name, showlegend=col == 1 or
                name == RL_VS_BASE, line={"color": c, "width": 1.5, "dash": "dash" if name == RL_VS_BASE else "solid"},
                marker={"size": 8, "color": c, "symbol": "diamond" if name == RL_VS_BASE else "circle"},
                error_y={**interval_error(e, lo, hi), "color": c},
                customdata=[[checkpoints[k], _iv(e[k], lo[k], hi[k]), kl_text[k]] for k in range(len(rows))],
                hovertemplate=("%{fullData.name} · step %{x} (%{customdata[0]})<br>"
                               + ("effect on success %{customdata[1]} points (95% interval)" if what == "success" else
                                  f"reproduces %{{customdata[1]}} ({esc(unit)}, 95% interval) on RL's rollouts<br>"
                                  "the checkpoint's KL(π_RL‖π_SFT): %{customdata[2]} nats per action token")
                               + "<extra></extra>"),
            ), row=1, col=col)
        fig.add_hline(y=0, line={"color": "#444", "width": 1}, row=1, col=col)
        if what == "reproduced_rl":
            fig.add_hline(y=s_kl, line={"color": "#444", "width": 1, "dash": "dot"}, row=1, col=col)  # the checkpoint
        fig.update_yaxes(title_text=axes[what], row=1, col=col)
        fig.update_xaxes(title_text="checkpoint step", row=1, col=col)
    step_axis(fig, x)
    what = {"group": "swept group", "config": "graft"}[t["columns"]]
    rec = first.var_attrs("group_effect") if first.array("group_effect") is not None else \
        first.var_attrs("kl_group_effect")
    sub = (esc(f"{rec['kind']} effect of each swept group: {rec.get('formula', '')}") if rec.get("kind") else
           "each graft against base") + "<br>whiskers: 95% intervals" + (
        f"; {'right: ' if len(panels) == 2 else ''}0 = SFT's behaviour, 100% = the checkpoint's own (its full graft)"
        if "reproduced_rl" in panels else "")
    fig = base_layout(fig, f"Graft effects over training — {esc(label)}", sub, "checkpoint step",
                      axes[panels[0]], height=470, legend_title=what)
    fig.update_layout(margin={"t": 125})
    return fig


def sweep_trajectories(runs: Sequence[tuple[str, Sequence[int], Sequence[Result], Sequence[str]]]) -> go.Figure:
    """:func:`sweep_trajectory` of every training run ``(label, steps, results, checkpoint names)``, one shown at a
    time, a menu of the runs picking it; the runs' sweeps must draw the same panels (:func:`trajectory_panels`:
    scored by the same metric), since a menu's options share one layout."""
    panels = {trajectory_panels(results[0]) for _, _, results, _ in runs}
    if len(panels) > 1:
        raise ValueError(f"sweeps scored by different metrics draw different panels ({sorted(panels)}): one figure each")
    return by_sweep([(label, sweep_trajectory(label, steps, results, names)) for label, steps, results, names in runs],
                    "training run")


#: The trace of a checkpoint's own change, beside the groups' effects in :func:`sweep_trajectory`.
RL_VS_BASE = "the checkpoint: RL − base"


def movement_vs_effect(label: str, res: Result) -> go.Figure | None:
    """Each group's share of squared weight movement against its causal effect on success."""
    share = SweepResult.from_result(res).movement_share
    if share is None:
        return None
    eff = effect_per_group(res)
    if eff is None:
        return None
    source, groups, e, lo, hi = eff
    keep = [i for i, g in enumerate(groups) if g in share]
    if not keep:
        return None
    x = 100 * np.array([share[groups[i]] for i in keep])
    fig = go.Figure(go.Scatter(
        x=x, y=e[keep], mode="markers+text", text=esc_all(groups[i] for i in keep), textposition="top center",
        name=source, marker={"size": 12, "color": colour(0)}, error_y=interval_error(e[keep], lo[keep], hi[keep]),
        customdata=[[_iv(e[i], lo[i], hi[i])] for i in keep],
        hovertemplate="%{text}<br>movement share %{x:.4f}%<br>effect %{customdata[0]} points (95% interval)"
                      "<extra>%{fullData.name}</extra>",
    ))
    zero_line(fig)
    fig.update_xaxes(rangemode="tozero")
    return base_layout(fig, f"Movement vs effect — {esc(label)}",
                       f"x: share of squared weight movement (delta anatomy); y: {source} with 95% interval. "
                       "Far right and near zero = moved a lot, mattered little", "share of squared movement (%)",
                       "effect on success (percentage points)", legend_title="effect")


def _dissociation_colour(verdict: str, runs: list[str]) -> str:
    """A only / B only in that run's colour; anything else grey."""
    for k, r in enumerate(runs):
        if verdict == f"{r} only":
            return colour(k)
    return "#737373"


def dissociation(label: str, res: Result) -> go.Figure:
    """Per group, the effect in run A and in run B and their difference, with 95% intervals."""
    v = DissociationResult.from_result(res)
    groups = esc_all(v.groups)
    runs = v.runs
    fig = go.Figure()
    s = _scale(v, "effect")
    names = {r: v.run_name(r) for r in runs}
    for k, r in enumerate(runs):
        e, lo, hi = bounds(v.effect[k], v.bound_names)
        name = f"effect in run {r}" + (f" ({names[r]})" if names[r] else "")
        fig.add_trace(go.Bar(
            x=groups, y=s * e, name=esc(name), marker_color=colour(k), error_y=interval_error(e, lo, hi, s),
            customdata=[[_iv(s * e[i], s * lo[i], s * hi[i])] for i in range(len(e))],
            hovertemplate="%{x} · %{fullData.name}<br>%{customdata[0]} points (95% interval)<extra></extra>",
        ))
    if v.difference is not None:
        e, lo, hi = bounds(v.difference, v.bound_names)
        verdict = v.verdicts or ["no verdict stored"] * len(groups)
        fig.add_trace(go.Scatter(
            x=groups, y=s * e, mode="markers", name="difference " + " − ".join(esc_all(runs)),
            marker={"size": 12, "symbol": "diamond", "color": [_dissociation_colour(v, runs) for v in verdict],
                    "line": {"color": "#222", "width": 1}},
            error_y={**interval_error(e, lo, hi, s), "color": "#222"},
            customdata=[[_iv(s * e[i], s * lo[i], s * hi[i]), esc(verdict[i])] for i in range(len(e))],
            hovertemplate="%{x} · %{fullData.name}<br>%{customdata[0]} points (95% interval)<br>%{customdata[1]}"
                          "<extra></extra>",
        ))
    zero_line(fig)
    fig.update_layout(barmode="group")
    effect = v.effect_kind
    return base_layout(fig, f"Double dissociation — {esc(label)}",
                       "each group's effect on success in two RL runs" + (f" ({esc(effect)} effect)" if effect else "")
                       + " and their difference, 95% intervals; diamond colour: the run the group's change belongs to",
                       "parameter group", "effect on success (percentage points)", legend_title="series")
