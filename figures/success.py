"""Success with intervals, paired differences against the SFT model, and headroom.

Inputs: results of kind ``eval`` (``success[task, seed, episode, sample]`` int8, ``attrs["model"]`` the
checkpoint's description) and ``headroom`` (sampled ``success[task, seed, episode, sample]`` beside
``greedy_success[task, seed, episode, greedy_sample]``). Rates carry 95% Wilson intervals
(``stats.wilson_interval``, over all episodes); paired differences use ``stats.compare`` on identical
episodes (a = the reference, b = the model), headroom ``stats.headroom`` (a = greedy, b = sampled).

Beside each rate, the hover gives the share of outputs that parsed (``EvalResult.parsed``: a web action, or an
answer in the task's answer format), and :func:`reader_notes` the notes a reader needs: how a user's file played
whole was covered, and where most outputs did not parse. A user's file played whole is counted against its own
items (:func:`item_line`), never against graftkit's held-out split of generated tasks.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from ..evaluation.commands import EvalResult, HeadroomResult
from ..stats import Comparison, HeadroomTable, RateInterval, compare, wilson_interval
from ..results.store import Result
from ._common import (base_layout, colour, esc, esc_all, fmt, interval_error, parsed_text, pct, verdict_colour,
                      zero_line)
from .runs import run_colours, study_order

#: Category label of the pooled rate over every task of a result.
ALL_TASKS = "all tasks"


def _rates(tasks: Sequence[str], x: np.ndarray, level: float) -> dict[str, RateInterval]:
    """Per task of ``x[task, ...]`` and pooled (:data:`ALL_TASKS`): successes / episodes, Wilson interval."""
    out = {t: wilson_interval(int(x[i].sum()), int(x[i].size), level) for i, t in enumerate(tasks)}
    out[ALL_TASKS] = wilson_interval(int(x.sum()), int(x.size), level)
    return out


def task_rates(res: Result, level: float = 0.95) -> dict[str, RateInterval]:
    """Per task and pooled (:data:`ALL_TASKS`): successes / episodes with a Wilson interval."""
    view = EvalResult.from_result(res)
    return _rates(view.tasks, view.success, level)


def paired_vs(reference: Result, model: Result, level: float = 0.95) -> dict[str, Comparison]:
    """``model`` against ``reference`` per shared task (and pooled) on identical episodes.

    Empty when the two were not evaluated on the same seeds, episodes and samples per episode, or on
    different items (then no pairing exists and nothing is claimed). Intervals cluster by item where the
    results kept items (``EvalResult.clustered``), else by seed."""
    a, b = EvalResult.from_result(reference), EvalResult.from_result(model)
    if not np.array_equal(a.seeds, b.seeds) or a.success.shape[2:] != b.success.shape[2:]:
        return {}
    shared = [t for t in b.tasks if t in a.tasks]
    if not shared or any(_items_differ(a, b, t) for t in shared):
        return {}

    def one(tasks):
        (x, clusters), (y, _) = a.clustered(tasks), b.clustered(tasks)
        return compare(x, y, level=level, clusters=clusters)

    out = {t: one([t]) for t in shared}
    if len(shared) > 1:
        out[ALL_TASKS] = one(shared)
    return out


def _items_differ(a: EvalResult, b: EvalResult, task: str) -> bool:
    ia, ib = a.items_of(task), b.items_of(task)
    return ia is not None and ib is not None and not np.array_equal(ia, ib)


def item_line(res: Result) -> str | None:
    """One line on an evaluation's items: per generated task distinct items / episodes and the overlap with
    training (items outside graftkit's held-out split); per user's file played whole (``EvalResult.played_whole``)
    distinct items / the file's items, and no overlap: a file evaluated whole is not split."""
    view = EvalResult.from_result(res)
    counts = view.item_counts()
    if not counts:
        return None

    def part(t: str, c: dict, of: object) -> str:
        return f"{t} {c['distinct']}/{of}" + (" (too few)" if c["too_few"] else "")

    split = {t: c for t, c in counts.items() if not view.played_whole(t)}
    files = {t: c for t, c in counts.items() if view.played_whole(t)}
    said = []
    if split:
        said.append(f"(distinct / episodes): {', '.join(part(t, c, c['episodes']) for t, c in split.items())}; items "
                    f"outside the held-out split: {sum(c['overlap'] for c in split.values())}")
    if files:
        said.append(("user's files evaluated whole " if split else "") + "(distinct / file items): "
                    + ", ".join(part(t, c, c.get("total", "?")) for t, c in files.items()))
    return f"Evaluation items {'; '.join(said)}."


def reader_notes(res: Result) -> list[str]:
    """The notes of an evaluation a reader of its figures needs: how each user's file played whole was covered
    (``EvalResult.coverage_note``), and where most outputs did not parse, which flag reads them
    (``EvalResult.action_notes``, naming ``--answer-format`` for a verifiable task)."""
    view = EvalResult.from_result(res)
    return [view.coverage_note(t) for t in view.tasks if view.played_whole(t)] + view.action_notes()


def parse_rates(res: Result) -> dict[str, float]:
    """Per task and pooled (:data:`ALL_TASKS`): the share of turns whose output parsed (NaN where not recorded)."""
    view = EvalResult.from_result(res)
    return {**{t: view.parsed(t) for t in view.tasks}, ALL_TASKS: view.parsed()}


def headroom_of(res: Result, level: float = 0.95) -> HeadroomTable | None:
    """``stats.headroom`` of a headroom result: each greedy episode repeated against its k samples.

    None when the greedy and sampled arrays cannot be paired (greedy samples neither 1 nor k)."""
    return HeadroomResult.from_result(res).table(level)


# --------------------------------------------------------------------------------------------------
# Figures


def _rate_bar(name: str, colour_: str, cats: list[str], rates: dict[str, RateInterval],
              parsed: dict[str, float] | None = None) -> go.Bar:
    """Bars of success rates with their Wilson intervals; with ``parsed``, each bar's hover also gives the share of
    outputs that parsed (:func:`~graftkit.figures._common.parsed_text`)."""
    keys = [c for c in cats if c in rates]
    r = [rates[c] for c in keys]
    est, low, high = ([getattr(x, f) for x in r] for f in ("rate", "low", "high"))
    return go.Bar(
        x=[esc(c) for c in keys], y=100 * np.asarray(est), name=name, marker_color=colour_,
        error_y=interval_error(est, low, high, 100.0),
        customdata=[[f"{x.successes}/{x.n}", pct(x.low), pct(x.high)]
                    + ([parsed_text(parsed.get(c, float("nan")))] if parsed is not None else [])
                    for c, x in zip(keys, r)],
        hovertemplate="%{fullData.name}<br>%{x}<br>success %{y:.2f}% (%{customdata[0]})"
                      "<br>95% Wilson [%{customdata[1]}, %{customdata[2]}]"
                      + ("<br>outputs parsed: %{customdata[3]}" if parsed is not None else "") + "<extra></extra>",
    )


def success_rates(evals: Sequence[tuple[str, Result]]) -> go.Figure:
    """Success per task (and pooled) for every evaluated model, with 95% Wilson intervals and, in the hover, the share
    of outputs that parsed; each model in its run's colour (figures/runs.py: a regime's hue, a shade per seed)."""
    cats: list[str] = []
    per = []
    for _, res in evals:
        rates = task_rates(res)
        per.append(rates)
        cats += [t for t in rates if t not in cats and t != ALL_TASKS]
    cats.append(ALL_TASKS)
    colours = run_colours([label for label, _ in evals])
    fig = go.Figure([_rate_bar(esc(evals[i][0]), colours[i], cats, per[i], parse_rates(evals[i][1]))
                     for i in study_order([label for label, _ in evals])])
    fig.update_layout(barmode="group", yaxis_range=[0, 105])
    return base_layout(fig, "Success rate per task", "bars: successes / episodes; whiskers: 95% Wilson interval",
                       "task", "success rate (%)", legend_title="model")


def paired_differences(reference: str, rows: Sequence[tuple[str, dict[str, Comparison]]]) -> go.Figure:
    """Per task, success(model) − success(reference) in points with the paired bootstrap interval; marker fill
    by verdict, outline and whiskers in the model's run colour."""
    fig = go.Figure()
    colours = run_colours([label for label, _ in rows])
    for i in study_order([label for label, _ in rows]):
        label, comps = rows[i]
        keys = list(comps)
        c = [comps[k] for k in keys]
        est = [x.diff for x in c]
        low, high = [x.bootstrap.low for x in c], [x.bootstrap.high for x in c]
        fig.add_trace(go.Scatter(
            x=[esc(k) for k in keys], y=100 * np.asarray(est), mode="markers", name=esc(label),
            marker={"color": [verdict_colour(x.verdict) for x in c], "size": 11, "symbol": i % 20,
                    "line": {"color": colours[i], "width": 2}},
            error_y={**interval_error(est, low, high, 100.0), "color": colours[i]},
            customdata=[[f"{100 * x.bootstrap.low:+.2f}", f"{100 * x.bootstrap.high:+.2f}",
                         f"{100 * x.bayes.low:+.2f}", f"{100 * x.bayes.high:+.2f}", fmt(x.mcnemar.p_value, ".3g"),
                         x.verdict, pct(x.rate_a.rate), pct(x.rate_b.rate), esc(reference)] for x in c],
            hovertemplate="%{fullData.name} − %{customdata[8]}<br>%{x}<br>difference %{y:+.2f} points "
                          "(%{customdata[7]} vs %{customdata[6]})<br>95% paired bootstrap [%{customdata[0]}, "
                          "%{customdata[1]}]<br>95% Bayes [%{customdata[2]}, %{customdata[3]}]<br>McNemar exact p "
                          "= %{customdata[4]}<br>%{customdata[5]}<extra></extra>",
        ))
    zero_line(fig)
    return base_layout(fig, f"Paired difference vs {esc(reference)}",
                       "success(model) − success(reference) on identical episodes; whiskers: 95% paired bootstrap; "
                       "fill: green credibly better, red credibly worse, grey no credible change",
                       "task", "difference in success (percentage points)", legend_title="model")


def headroom_rates(label: str, res: Result) -> go.Figure:
    """Greedy and sampled success per task for one model, each with a 95% Wilson interval; the sampled bars' hover
    gives the share of outputs that parsed (the result records it for its sampled outcomes)."""
    view = HeadroomResult.from_result(res)
    if view.greedy is None:
        raise KeyError("greedy_success")
    sampled, greedy = _rates(view.tasks, view.success, 0.95), _rates(view.tasks, view.greedy, 0.95)
    cats = [t for t in sampled]
    # the parse counts a headroom result records are its sampled outcomes'
    fig = go.Figure([_rate_bar("greedy", colour(0), cats, greedy),
                     _rate_bar("sampled", colour(1), cats, sampled, parse_rates(res))])
    k = view.k
    fig.update_layout(barmode="group", yaxis_range=[0, 105])
    return base_layout(fig, f"Greedy vs sampled success — {esc(label)}",
                       f"sampled: {k} samples per episode; whiskers: 95% Wilson interval", "task",
                       "success rate (%)", legend_title="decoding")


def headroom_differences(rows: Sequence[tuple[str, HeadroomTable]]) -> go.Figure:
    """Headroom = sampled − greedy success per task, with the paired bootstrap interval and verdict."""
    fig = go.Figure()
    for i, (label, table) in enumerate(rows):
        c = [r.comparison for r in table.rows]
        est = [x.diff for x in c]
        low, high = [x.bootstrap.low for x in c], [x.bootstrap.high for x in c]
        fig.add_trace(go.Scatter(
            x=esc_all(table.tasks), y=100 * np.asarray(est), mode="markers", name=esc(label),
            marker={"color": [verdict_colour(r.verdict) for r in table.rows], "size": 11, "symbol": i % 20,
                    "line": {"color": colour(i), "width": 2}},
            error_y={**interval_error(est, low, high, 100.0), "color": colour(i)},
            customdata=[[f"{100 * x.bootstrap.low:+.2f}", f"{100 * x.bootstrap.high:+.2f}",
                         f"{100 * x.bayes.low:+.2f}", f"{100 * x.bayes.high:+.2f}", r.verdict,
                         pct(x.rate_a.rate), pct(x.rate_b.rate)] for x, r in zip(c, table.rows)],
            hovertemplate="%{fullData.name}<br>%{x}<br>headroom %{y:+.2f} points (sampled %{customdata[6]}, "
                          "greedy %{customdata[5]})<br>95% paired bootstrap [%{customdata[0]}, %{customdata[1]}]"
                          "<br>95% Bayes [%{customdata[2]}, %{customdata[3]}]<br>%{customdata[4]}<extra></extra>",
        ))
    zero_line(fig)
    return base_layout(fig, "Headroom: sampled − greedy success",
                       "whiskers: 95% paired bootstrap; fill: green headroom, red sampling credibly worse, grey neither",
                       "task", "sampled − greedy success (percentage points)", legend_title="model")
