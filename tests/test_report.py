"""The HTML report and the CSV export: sections per result kind, self-containment, escaping, browser rendering.

Results of every kind the report reads are built here as synthetic labelled arrays through store.py (the
schemas of docs/design.md and the producers), with known values, so each figure's content can be checked.
"""

from __future__ import annotations

import csv
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.figures import build_report, make_report, write_report
from graftkit.figures.browser import browser_available
from graftkit.stats import compare, wilson_interval
from graftkit.results.store import Result, list_results, read_result, write_result
from report_results import kl_run, kl_sweep

EVIL = "<script>alert(1)</script><img src=x onerror=\"window.__pwned=1\">"
EVIL_DIR = "run<img src=x onerror=window.__pwned=1><script>alert(1)"  # a folder name cannot hold '/'
BOUND = np.array(["estimate", "low", "high"], dtype=object)
ALL_SECTIONS = ("summary", "findings", "training", "success", "headroom", "kl", "anatomy", "grafts", "rank",
                "coupling", "forgetting")
#: The sections of a run of arbitrary results (write_run): every one but the study's summary.
PLAIN = ALL_SECTIONS[1:]


def _s(*xs) -> np.ndarray:
    return np.array(list(xs), dtype=object)


def graft_sweep(tasks: np.ndarray, tag: str, shift: float, attrs: dict) -> Result:
    """A factorial graft sweep over attn and mlp with known differences (``shift`` added to the attribution)."""
    S, E = 6, 5
    configs = _s("∅ (base)", "attn" + tag, "mlp", "attn+mlp", "all (rl)")
    g2 = _s("attn" + tag, "mlp")
    est = np.array([0.0, -0.1, -0.05, -0.2, -0.25])
    diff = np.stack([est, est - 0.05, est + 0.05], -1)
    return Result(
        "graft-sweep", {"config": configs, "task": tasks, "seed": np.arange(S), "episode": np.arange(E),
                        "group": g2, "group2": g2, "bound": BOUND},
        {"success": (("config", "task", "seed", "episode"), np.zeros((5, len(tasks), S, E), np.int8)),
         "diff_vs_base": (("config", "bound"), diff), "diff_vs_rl": (("config", "bound"), diff + 0.25),
         "verdict_vs_base": (("config",), _s("no credible change", "credibly worse" + tag, "no credible change",
                                              "credibly worse", "credibly worse")),
         "config_groups": (("config",), _s("", "attn" + tag, "mlp", "attn" + tag + ",mlp", "all")),
         "config_layers": (("config",), _s("all", "all", "all", "all", "all")),
         "config_alpha": (("config",), np.ones(5)),
         "main_effect": (("group", "bound"), np.array([[-0.12, -0.2, -0.04], [-0.07, -0.15, 0.01]]) + shift),
         "shapley": (("group", "bound"), np.array([[-0.13, -0.2, -0.05], [-0.07, -0.14, 0.0]]) + shift),
         "interaction": (("group", "group2", "bound"), np.zeros((2, 2, 3)) + [[[0, 0, 0]], [[-0.05, -0.1, 0.0]]]),
         "movement_share": (("group",), np.array([0.25, 0.25]))}, attrs)


def write_run(run: Path, evil: bool = False, kinds: tuple[str, ...] | None = None) -> Path:
    """A run folder with one or more results of every kind (or only ``kinds``)."""
    tag = EVIL if evil else ""
    res_dir = run / "results"
    rng = np.random.default_rng(0)
    tasks = _s("click-button", "enter-text" + tag)
    S, E = 6, 5
    sft_path, rl_path = str(run / "sft"), str(run / "rl")
    want = (lambda k: True) if kinds is None else (lambda k: k in kinds)

    if want("findings"):
        write_result(res_dir / "findings.h5", Result(
            "findings", {"finding": _s("1", "2", "3", "4")},
            {"statement": (("finding",), _s("GRPO does not improve mastered tasks" + tag, "headroom helps",
                                            "attn+mlp carry the degrade", "late rank tracks success")),
             "estimate": (("finding",), np.array([-0.05, 0.22, 0.8, np.nan])),
             "low": (("finding",), np.array([-0.1, 0.1, 0.6, np.nan])),
             "high": (("finding",), np.array([0.0, 0.3, 0.9, np.nan])),
             "claim": (("finding",), _s("no gain on mastered tasks", "gain with headroom", "localised degrade",
                                        "rank tracks capability" + tag)),
             "verdict": (("finding",), _s("reproduced", "reproduced", "reproduced", "not measured" + tag))},
            {"units": "success-rate difference (fraction) unless the statement says otherwise" + tag}))
    if want("train"):
        steps = np.arange(1, 41)
        write_result(res_dir / "train-sft-sft.h5", Result(
            "train-sft", {"step": steps},
            {"loss": (("step",), 2 * np.exp(-steps / 10)), "grad_norm": (("step",), 1 + rng.random(40)),
             "lr": (("step",), np.full(40, 1e-3))}, {"model": sft_path}))
        write_result(res_dir / "train-grpo-rl.h5", Result(
            "train-grpo", {"step": steps},
            {k: (("step",), rng.random(40)) for k in ("loss", "reward", "success", "kl_k3_mean", "entropy",
                                                        "clip_frac_low", "clip_frac_high")},
            {"model": rl_path}))
    if want("eval"):
        coords = {"task": tasks, "seed": np.arange(S), "episode": np.arange(E), "sample": np.arange(1)}
        dims = ("task", "seed", "episode", "sample")
        sft_x = (rng.random((2, S, E, 1)) < 0.5).astype(np.int8)
        rl_x = (rng.random((2, S, E, 1)) < 0.8).astype(np.int8)
        for name, path, x in (("sft", sft_path, sft_x), ("rl" + tag.replace("/", ""), rl_path + tag.replace("/", ""), rl_x)):
            write_result(res_dir / f"eval-{'sft' if name == 'sft' else 'rl'}-greedy.h5", Result(
                "eval", coords, {"success": (dims, x)},
                {"model": {"path": path, "kind": "hf", "sha256": "0" * 64},
                 "decode": {"greedy": True, "temperature": 1.0, "top_p": 1.0}, "backend": "py", "obs": "text"}))
    if want("headroom"):
        k = 4
        write_result(res_dir / "headroom-sft.h5", Result(
            "headroom", {"task": tasks, "seed": np.arange(S), "episode": np.arange(E), "sample": np.arange(k),
                         "greedy_sample": np.arange(1)},
            {"success": (("task", "seed", "episode", "sample"), (rng.random((2, S, E, k)) < 0.6).astype(np.int8)),
             "greedy_success": (("task", "seed", "episode", "greedy_sample"),
                                (rng.random((2, S, E, 1)) < 0.3).astype(np.int8))},
            {"model": {"path": sft_path}, "decode": {"greedy": False}, "k": k}))
    if want("delta"):
        groups = _s("embed", "attn" + tag, "mlp", "norm")
        tensors = _s("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight" + tag,
                     "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                     "model.layers.1.mlp.up_proj.weight", "model.norm.weight")
        tgroup = _s("embed", "attn" + tag, "mlp", "attn" + tag, "mlp", "norm")
        tlayer = np.array([-1, 0, 0, 1, 1, -1])
        share = np.array([[0.5, 0.1, 0.1, 0.15, 0.15, 0.0]])
        lg = np.zeros((1, 2, 4))
        for t in range(6):
            if tlayer[t] >= 0:
                lg[0, tlayer[t], list(groups).index(tgroup[t])] += share[0, t]
        gshare = np.array([[share[0, tgroup == g].sum() for g in groups]])
        write_result(res_dir / "delta-rl.h5", Result(
            "delta", {"run": _s("rl" + tag), "run2": _s("rl" + tag), "tensor": tensors, "group": groups,
                      "layer": np.arange(2), "all": _s("all")},
            {"tensor_group": (("tensor",), tgroup), "tensor_layer": (("tensor",), tlayer),
             "share": (("run", "tensor"), share), "rel_delta": (("run", "tensor"), share / 10),
             "group_share": (("run", "group"), gshare), "group_rel_delta": (("run", "group"), gshare / 10),
             "group_fro_delta": (("run", "group"), gshare * 3),
             "layer_group_share": (("run", "layer", "group"), lg),
             "layer_group_rel_delta": (("run", "layer", "group"), lg / 10)}, {"tol": 1e-5}))
    if want("graft"):
        g2 = _s("attn" + tag, "mlp")
        write_result(res_dir / "graft-factorial-rl.h5", graft_sweep(tasks, tag, 0.0, {"sweep": "factorial"}))
        write_result(res_dir / "graft-dissociation-rl.h5", Result(
            "graft-dissociation", {"group": g2, "run": _s("A", "B"), "bound": BOUND},
            {"effect": (("run", "group", "bound"), np.array([[[-0.1, -0.2, 0.0], [0.0, -0.1, 0.1]],
                                                             [[0.0, -0.1, 0.1], [-0.1, -0.2, 0.0]]])),
             "difference": (("group", "bound"), np.array([[-0.1, -0.25, 0.05], [0.1, -0.05, 0.25]])),
             "verdict": (("group",), _s("no credible dissociation", "no credible dissociation" + tag))},
            {"runs": {"A": rl_path, "B": rl_path + "2"}}))
    if want("kl"):  # graftkit kl, and a sweep scored by KL alone (graft --metric kl)
        write_result(res_dir / "kl-rl-vs-sft.h5", kl_run("rl", tag=tag))
        write_result(res_dir / "graft-single-rl-kl.h5", kl_sweep("single", "kl", "rl" + tag))
    if want("rank"):
        metrics = _s("erank", "stable_rank" + tag)
        conv = {"erank": "roy-vetterli sigma: exp(H(sigma/sum(sigma)))", "stable_rank" + tag: "sum(sigma^2)/sigma_1^2"}
        for kind, lab in (("rank-weights", "sft"), ("rank-weights", "rl"), ("rank-delta", "rl")):
            vl = rng.random((3, 3, 2)) * 10
            write_result(res_dir / f"{kind}-{lab}.h5", Result(
                kind, {"tensor": _s("model.layers.0.mlp.up_proj.weight" + tag), "metric": metrics,
                       "layer": np.arange(3), "group": _s("attn", "mlp", "all")},
                {"value": (("tensor", "metric"), np.ones((1, 2))), "value_layer": (("layer", "group", "metric"), vl)},
                {"model": {"path": str(run / lab)}, "conventions": conv}))
        write_result(res_dir / "rank-activations-sft.h5", Result(
            "rank-activations", {"layer": np.arange(4), "metric": metrics},
            {"value": (("layer", "metric"), rng.random((4, 2))), "n_tokens": (("layer",), np.full(4, 64))},
            {"model": {"path": sft_path}, "conventions": conv}))
    if want("forgetting"):
        from graftkit.graft.forgetting import ForgettingConfig, forgetting_result

        planted = [{"key": str(run / f"r{i}"), "parent": sft_path, "trained": ["click-button"],
                    "untrained": ["enter-text" + tag], "forgetting": (-0.1 * i, -0.1 * i - 0.05, -0.1 * i + 0.05),
                    "values": {"kl": 0.02 * i + 0.01, "fro_delta": 1.0 + i % 2, "moved": 0.9, "erank_delta": 4.0 + i}}
                   for i in range(4)]
        write_result(res_dir / "forgetting.h5", forgetting_result(
            planted, ["r0", "r1" + tag, "r2", "r3"], ForgettingConfig(n_boot=200), run))
    if want("coupling"):
        runs = _s("r1", "r2" + tag, "r3", "r4")
        corr = np.zeros((3, 2, 3)) + [0.5, 0.1, 0.9]
        write_result(res_dir / "coupling-weights-erank.h5", Result(
            "coupling", {"run": runs, "layer": np.arange(3), "band": _s("early", "mid", "late"),
                         "stat": _s("spearman", "pearson"), "bound": BOUND, "direction": _s("improved", "degraded")},
            {"corr_layer": (("layer", "stat", "bound"), corr), "corr_band": (("band", "stat", "bound"), corr),
             "rank": (("run", "layer"), rng.random((4, 3))), "rank_band": (("run", "band"), rng.random((4, 3))),
             "success": (("run",), np.array([0.2, 0.4, 0.6, 0.8])),
             "agree_layer": (("layer", "direction"), np.array([[2, 1], [1, 1], [2, 2]])),
             "total_layer": (("layer", "direction"), np.full((3, 2), 2)),
             "frac_layer": (("layer", "direction", "bound"), np.zeros((3, 2, 3)) + [0.5, 0.1, 0.9]),
             "verdict_layer": (("layer",), _s("does not track", "does not track", "does not track" + tag))},
            {"metric": "erank", "what": "weights"}))
    return run


#: The runs of a study (the grid of study/pipeline.py for STUDY_GRID): name → success rate on its suite.
STUDY_RUNS = {"null-s0": 0.9, "null-s1": 0.85, "degrade-s0": 0.55, "degrade-s1": 0.6, "collapse-s0": 0.1,
              "collapse-s1": 0.15, "init-b-degrade": 0.5, "headroom-s0": 0.7}
#: The StudyConfig fields whose grid is STUDY_RUNS (the suites are the study's defaults: click-tab mastered,
#: click-button and click-link headroom).
#: The order figures list them in: by regime (a variant in the regime it counts in), then by seed.
STUDY_ORDER = ["null-s0", "null-s1", "degrade-s0", "degrade-s1", "init-b-degrade", "collapse-s0", "collapse-s1",
               "headroom-s0"]
STUDY_GRID = dict(seeds=(0, 1), degrade_seeds=(0, 1), variants=("init-b-degrade",), headroom_seeds=(0,))
STUDY_TASKS = _s("click-tab", "click-button", "click-link")
STUDY_SWEPT = ("degrade-s0", "collapse-s0")
CONTROL = ("the pipeline learns where reward is reachable", 0.3, 0.12, 0.46)


def study_outcomes(name: str, rng) -> np.ndarray:
    """success[task, seed, episode, sample] of one policy of the study: SFT 0.9 on the mastered suite and 0.3 on
    the headroom suite; a run its STUDY_RUNS rate on the suite it trained on, SFT's on the other."""
    rate = STUDY_RUNS.get(name)
    p = np.array([0.9, 0.3, 0.3])
    if rate is not None:
        if name.startswith("headroom"):
            p[1:] = rate
        else:
            p[0] = rate
    return (rng.random((3, 10, 2, 1)) < p[:, None, None, None]).astype(np.int8)


def write_study_run(run: Path, evil: str = "") -> Path:
    """A study's run folder: the findings with their positive control and the recorded config, the greedy eval
    of SFT and of every run, every run's training curves, the delta of every run, graft sweeps of STUDY_SWEPT.
    ``evil``: markup planted in one more delta run's name (a run in no regime)."""
    from graftkit.study.pipeline import StudyConfig

    res_dir = run / "results"
    rng = np.random.default_rng(7)
    cfg = StudyConfig(out=str(run), **STUDY_GRID)
    nums = _s("1", "2", "3", "4", "control")
    write_result(res_dir / "findings.h5", Result(
        "findings", {"finding": nums},
        {"claim": (("finding",), _s("one", "two", "three", "four", CONTROL[0])),
         "statement": (("finding",), _s("s1", "s2", "s3", "s4", "GRPO on a reachable task raised success")),
         "estimate": (("finding",), np.array([0.0, 0.1, np.nan, np.nan, CONTROL[1]])),
         "low": (("finding",), np.array([-0.1, 0.0, np.nan, np.nan, CONTROL[2]])),
         "high": (("finding",), np.array([0.1, 0.2, np.nan, np.nan, CONTROL[3]])),
         "verdict": (("finding",), _s("reproduced", "partly reproduced", "not measured", "not measured",
                                      "reproduced"))},
        {"config": cfg.as_dict(), "units": "success-rate difference (fraction)"}))
    coords = {"task": STUDY_TASKS, "seed": np.arange(10), "episode": np.arange(2), "sample": np.arange(1)}
    for name in ("sft", *STUDY_RUNS):
        write_result(res_dir / f"eval-{name}-greedy.h5", Result(
            "eval", coords, {"success": (("task", "seed", "episode", "sample"), study_outcomes(name, rng))},
            {"model": {"path": str(run / name), "kind": "hf", "sha256": "0" * 64},
             "decode": {"greedy": True, "temperature": 1.0, "top_p": 1.0}, "backend": "py", "obs": "text"}))
    steps = np.arange(1, 13)
    for name in ("sft", *STUDY_RUNS):
        kind = "train-sft" if name == "sft" else "train-grpo"
        write_result(res_dir / f"{kind}-{name}.h5", Result(
            kind, {"step": steps}, {"loss": (("step",), rng.random(12)),
                                    **({} if name == "sft" else {"success": (("step",), rng.random(12))})},
            {"model": str(run / name)}))
    names = [*STUDY_RUNS] + ([f"odd{evil}"] if evil else [])
    groups, layers = _s("embed", "attn", "mlp"), np.arange(3)
    tensors = _s("model.embed_tokens.weight", *(f"model.layers.{i}.{m}.weight" for i in layers
                                                  for m in ("self_attn.q_proj", "mlp.up_proj")))
    tgroup, tlayer = _s("embed", *(["attn", "mlp"] * 3)), np.array([-1, 0, 0, 1, 1, 2, 2])
    share = rng.random((len(names), 7))
    share /= share.sum(1, keepdims=True)
    lg = np.zeros((len(names), 3, 3))
    for t in range(1, 7):
        lg[:, tlayer[t], list(groups).index(tgroup[t])] += share[:, t]
    gshare = np.stack([share[:, tgroup == g].sum(1) for g in groups], 1)
    write_result(res_dir / "delta.h5", Result(
        "delta", {"run": _s(*names), "tensor": tensors, "group": groups, "layer": layers},
        {"tensor_group": (("tensor",), tgroup), "tensor_layer": (("tensor",), tlayer),
         "share": (("run", "tensor"), share), "rel_delta": (("run", "tensor"), share / 7),
         "group_share": (("run", "group"), gshare), "group_rel_delta": (("run", "group"), gshare / 7),
         "layer_group_share": (("run", "layer", "group"), lg),
         "layer_group_rel_delta": (("run", "layer", "group"), lg / 7)}, {"tol": 1e-5}))
    for k, name in enumerate(STUDY_SWEPT):
        write_result(res_dir / f"graft-factorial-{name}.h5", graft_sweep(STUDY_TASKS, "", -0.1 * (k + 1),
                                                                         {"sweep": "factorial", "rl_label": name}))
    return run


# --------------------------------------------------------------------------------------------------
# HTML structure helpers


class _Elements(HTMLParser):
    """Every start tag with its attributes, and the text of each <script> element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._in_script: dict | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = dict(attrs)
            self.scripts.append((self._in_script, ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = None

    def handle_data(self, data):
        if self._in_script is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)


def _parse(page: str) -> _Elements:
    p = _Elements()
    p.feed(page)
    p.close()
    return p


def _figures(page: str) -> list[dict]:
    p = _parse(page)
    data = [t for a, t in p.scripts if a.get("type") == "application/json"]
    assert len(data) == 1
    return json.loads(data[0])


def _section(page: str, key: str) -> str:
    m = re.search(rf"<section id='{key}'>(.*?)</section>", page, re.S)
    assert m, key
    return m.group(1)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, str]:
    run = write_run(tmp_path_factory.mktemp("runs") / "study")
    return run, build_report(run)


# --------------------------------------------------------------------------------------------------
# Sections


def test_every_section_present_with_its_figures(full_run):
    run, page = full_run
    rep = make_report(run)
    assert rep.sections == PLAIN and rep.absent == ("summary",) and rep.notes == ()  # no study: no summary
    titles = [re.sub(r"<[^>]+>", "", f["figure"]["layout"]["title"]["text"]) for f in _figures(page)]
    assert len(titles) == rep.n_figures
    expected = {
        "training": ["Success rate of the training batches", "Mean reward", "Training loss", "KL to the reference",
                     "Policy entropy", "Clip fractions", "Gradient norm"],
        "success": ["Success rate per task", "Paired difference vs sft"],
        "headroom": ["Greedy vs sampled success", "Headroom: sampled − greedy"],
        "kl": ["Behavioural divergence per task", "What moved most under RL"],
        "anatomy": ["Share of squared weight movement", "Relative change", "Largest movers", "Where the weights moved"],
        "grafts": ["Graft effects", "Attribution", "Interactions", "Movement vs effect", "Double dissociation",
                   "Behavioural change each graft reproduces (KL)", "Attribution of the behavioural change (KL)"],
        "rank": ["Rank by layer — weights", "Rank by layer — RL delta", "Rank by layer — activations"],
        "coupling": ["Rank–success coupling by layer", "Late-layer rank vs success", "Both directions"],
        "forgetting": ["Does KL predict forgetting?"],
    }
    for key, want in expected.items():
        html_ = _section(page, key)
        ids = re.findall(r"id='(fig-\d+)'", html_)
        got = [titles[int(i.split("-")[1]) - 1] for i in ids]
        for w in want:
            assert any(t.startswith(w) for t in got), (key, w, got)
        assert "class='absent'" not in html_
    findings = _section(page, "findings")
    assert "GRPO does not improve mastered tasks" in findings and "gain with headroom" in findings
    assert "<td>0.22 [0.1, 0.3]</td>" in findings and "<td>undefined</td>" in findings
    assert "success-rate difference (fraction)" in findings


def test_absent_sections_say_which_command_adds_them(tmp_path):
    run = write_run(tmp_path / "r", kinds=("train",))
    page = build_report(run)
    rep = make_report(run)
    assert rep.sections == ("training",)
    for key, command in (("summary", "graftkit demo"), ("findings", "graftkit demo"),
                         ("success", "graftkit eval"), ("headroom", "graftkit headroom"), ("kl", "graftkit kl"),
                         ("anatomy", "graftkit delta"), ("grafts", "graftkit graft"), ("rank", "graftkit rank"),
                         ("coupling", "graftkit couple"), ("forgetting", "graftkit forgetting")):
        html_ = _section(page, key)
        assert "class='absent'" in html_ and f"<code>{command}" in html_, key
        assert "class='graph'" not in html_
    # An empty run still renders: header, contents, every section's note.
    empty = tmp_path / "empty"
    empty.mkdir()
    page = build_report(empty)
    assert page.count("class='absent'") == len(ALL_SECTIONS) and _figures(page) == []


def test_success_figures_hold_wilson_and_paired_values(full_run):
    run, page = full_run
    figs = {re.sub(r"<[^>]+>", "", f["figure"]["layout"]["title"]["text"]).split("\n")[0]: f["figure"]
            for f in _figures(page)}
    rates = next(v for k, v in figs.items() if k.startswith("Success rate per task"))
    sft = read_result(run / "results" / "eval-sft-greedy.h5")["success"]
    trace = next(t for t in rates["data"] if t["name"] == "sft")
    x = sft[0]
    w = wilson_interval(int(x.sum()), x.size)
    y = _decode(trace["y"])
    assert trace["x"][0] == "click-button"
    assert y[0] == pytest.approx(100 * w.rate)
    assert _decode(trace["error_y"]["array"])[0] == pytest.approx(100 * (w.high - w.rate))
    assert _decode(trace["error_y"]["arrayminus"])[0] == pytest.approx(100 * (w.rate - w.low))
    assert trace["x"][-1] == "all tasks" and y[-1] == pytest.approx(100 * sft.mean())
    # Paired difference: rl − sft per task, bootstrap interval from stats.compare on the same arrays.
    diff = next(v for k, v in figs.items() if k.startswith("Paired difference vs sft"))
    rl = read_result(run / "results" / "eval-rl-greedy.h5")["success"]
    c = compare(sft[1].reshape(6, -1), rl[1].reshape(6, -1))
    t = diff["data"][0]
    assert _decode(t["y"])[1] == pytest.approx(100 * c.diff)
    assert _decode(t["error_y"]["array"])[1] == pytest.approx(100 * (c.bootstrap.high - c.diff))
    # Pooled over tasks, seeds stay the paired unit: [seed, task·episode].
    pooled = compare(np.moveaxis(sft[..., 0], 0, 1).reshape(6, -1), np.moveaxis(rl[..., 0], 0, 1).reshape(6, -1))
    assert t["x"][-1] == "all tasks" and _decode(t["y"])[-1] == pytest.approx(100 * pooled.diff)


def _decode(v):
    """A figure array as floats: plotly 6 writes numpy arrays as {dtype, bdata} (base64)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).astype(float)
    return np.array([np.nan if x is None else x for x in v], dtype=float)


def test_anatomy_heatmap_is_layer_by_group_of_the_stored_share(full_run):
    run, page = full_run
    res = read_result(run / "results" / "delta-rl.h5")
    fig = next(f["figure"] for f in _figures(page) if f["figure"]["layout"]["title"]["text"].startswith(
        "<b>Share of squared weight movement"))
    hm = fig["data"][0]
    assert hm["type"] == "heatmap" and hm["x"] == ["attn", "mlp"]  # embed and norm have no in-layer tensors
    z = np.array([_decode(row) for row in hm["z"]]) if isinstance(hm["z"], list) else _decode(hm["z"]).reshape(2, 2)
    np.testing.assert_allclose(z, 100 * res["layer_group_share"][0][:, 1:3])


def test_rank_menu_switches_metric_and_names_the_convention(full_run):
    _, page = full_run
    fig = next(f["figure"] for f in _figures(page) if "Rank by layer — weights" in f["figure"]["layout"]["title"]["text"])
    assert len(fig["data"]) == 4  # 2 checkpoints × 2 metrics
    assert [t["visible"] for t in fig["data"]] == [True, True, False, False]
    assert "roy-vetterli" in fig["layout"]["title"]["text"]
    buttons = fig["layout"]["updatemenus"][0]["buttons"]
    assert [b["args"][0]["visible"] for b in buttons] == [[True, True, False, False], [False, False, True, True]]
    assert fig["layout"]["yaxis"]["title"]["text"].startswith("effective rank")


def test_optional_arrays_missing_only_drop_their_figures(tmp_path):
    run = write_run(tmp_path / "r", kinds=("graft", "coupling"))
    for name, drop in (("graft-factorial-rl.h5", ("shapley", "main_effect", "interaction", "movement_share")),
                       ("coupling-weights-erank.h5", ("agree_layer", "total_layer", "frac_layer", "verdict_layer",
                                                       "rank_band", "corr_band"))):
        res = read_result(run / "results" / name)
        write_result(run / "results" / name, Result(res.kind, res.coords,
                                                    {k: v for k, v in res.data.items() if k not in drop}, res.attrs))
    page = build_report(run)
    titles = [f["figure"]["layout"]["title"]["text"] for f in _figures(page)]
    assert any("Graft effects" in t for t in titles) and not any("Attribution" in t or "Interactions" in t
                                                                 for t in titles)
    # Movement vs effect falls back to nothing without movement_share; the scatter to the band rule.
    assert not any("Movement vs effect" in t for t in titles)
    assert any("Late-layer rank vs success" in t for t in titles) and not any("Both directions" in t for t in titles)
    # A required array missing: a visible note names the file, the rest of the report still renders.
    res = read_result(run / "results" / "graft-factorial-rl.h5")
    write_result(run / "results" / "graft-factorial-rl.h5",
                 Result(res.kind, {k: v for k, v in res.coords.items() if k != "config"},
                        {k: v for k, v in res.data.items() if "config" not in v[0]}, res.attrs))
    rep = make_report(run)
    assert any("graft-factorial-rl.h5: could not be drawn" in n for n in rep.notes)
    assert "could not be drawn" in _section(rep.html, "grafts")


# --------------------------------------------------------------------------------------------------
# A study: the summary first, one figure per measure, one colour per run


@pytest.fixture(scope="module")
def study_run(tmp_path_factory) -> tuple[Path, str]:
    run = write_study_run(tmp_path_factory.mktemp("runs") / "demo")
    return run, build_report(run)


def _menu(fig: dict) -> list[tuple[str, list[int]]]:
    """(label, indices of the traces it shows) of each entry of a figure's one menu."""
    (menu,) = fig["layout"]["updatemenus"]
    return [(b["label"], [i for i, v in enumerate(b["args"][0]["visible"]) if v]) for b in menu["buttons"]]


def _section_figures(page: str, key: str) -> list[dict]:
    figs = _figures(page)
    return [figs[int(i.split("-")[1]) - 1]["figure"] for i in re.findall(r"id='(fig-\d+)'", _section(page, key))]


@pytest.mark.slow
def test_study_report_opens_with_the_summary_and_draws_one_figure_per_measure(study_run):
    run, page = study_run
    rep = make_report(run)
    assert rep.sections[0] == "summary" and rep.notes == ()
    assert page.index("<section id='summary'>") < page.index("<section id='findings'>")
    (fig,) = _section_figures(page, "summary")
    assert fig["layout"]["title"]["text"].startswith("<b>The study at a glance")
    assert _figures(page)[0]["id"] == "fig-1" and _figures(page)[0]["figure"] == fig  # the page's first figure
    # 8 runs in one delta result, 2 sweeps: each measure once, a menu of the runs' labels picking the run
    runs = STUDY_ORDER
    anatomy = _section_figures(page, "anatomy")
    assert len(anatomy) == 4
    for fig in anatomy[:3]:  # share, relative change, largest movers
        menu = _menu(fig)
        assert [label for label, _ in menu] == runs
        assert all(len(shown) == 1 for _, shown in menu)
        assert sorted(i for _, shown in menu for i in shown) == list(range(len(fig["data"])))
        assert [t.get("visible") for t in fig["data"]] == [True] + [False] * (len(runs) - 1)
    grafts = _section_figures(page, "grafts")
    assert len(grafts) == 4 and all([label for label, _ in _menu(f)] == list(STUDY_SWEPT) for f in grafts)
    # the training curves: one figure per family, a menu showing all runs or one regime's
    training = _section_figures(page, "training")
    assert len(training) == 2
    regimes = ["all runs", "null", "degrade", "collapse", "headroom"]
    assert [label for label, _ in _menu(training[0])] == regimes  # success: GRPO runs only
    assert [label for label, _ in _menu(training[1])] == regimes + ["runs in no regime"]  # loss: and SFT
    assert rep.n_figures == 1 + 2 + 2 + 4 + 4  # summary, training, success, anatomy, grafts
    # a run more or less changes no count
    more = write_study_run(run.parent / "more", evil="x")
    assert make_report(more).n_figures == rep.n_figures


def _run_colour(trace: dict) -> list[tuple[str, str]]:
    """(run label, colour) pairs a trace draws: its name and its marker/line colour, or per point its text."""
    marker, line = trace.get("marker", {}), trace.get("line", {})
    c = marker.get("color") if trace.get("type") == "bar" else line.get("color") or marker.get("line", {}).get("color")
    if isinstance(marker.get("color"), list) and isinstance(trace.get("text"), list):  # one dot per run
        return list(zip(trace["text"], marker["color"]))
    name = str(trace.get("name", "")).split(" (")[0]
    return [(name, c)] if isinstance(c, str) else []


def test_every_run_has_one_colour_in_every_figure_its_regimes_hue(study_run):
    from graftkit.figures.runs import REFERENCE, REGIME_COLOURS, run_colours

    _, page = study_run
    seen: dict[str, set] = {}
    for f in _figures(page):
        for t in f["figure"]["data"]:
            for name, c in _run_colour(t):
                if name in STUDY_RUNS or name == "sft":
                    seen.setdefault(name, set()).add(c)
    assert set(seen) == {*STUDY_RUNS, "sft"}
    assert all(len(c) == 1 for c in seen.values()), seen
    colours = {n: next(iter(c)) for n, c in seen.items()}
    assert colours == dict(zip(seen, run_colours(list(seen))))
    assert len(set(colours.values())) == len(colours)  # every run its own shade
    assert colours["sft"] == REFERENCE
    for regime in ("null", "degrade", "collapse", "headroom"):
        assert colours[f"{regime}-s0"] == REGIME_COLOURS[regime]  # seed 0: the regime's hue itself
    # the variant counts in the regime its VARIANTS entry names: a shade of degrade's hue
    from graftkit.figures.runs import membership

    assert membership("init-b-degrade").regime == "degrade"


def test_run_colours_without_a_study_keep_the_palette():
    from graftkit.figures._common import colour
    from graftkit.figures.runs import OTHER, REFERENCE, membership, run_colours, study_order

    assert run_colours(["rl", "sft", "grpo-lora-checkpoint-6"]) == [colour(0), colour(1), colour(2)]
    assert run_colours(["x", "sft", "degrade-s1", "y"])[::3] == [OTHER[0], OTHER[1]]
    assert run_colours(["sft", "lr1e-3-s0"])[0] == REFERENCE and membership("lr1e-3-s0").regime == "lr1e-3"
    assert study_order(["b", "a"]) == [0, 1]
    assert study_order(["x", "collapse-s0", "sft", "null-s1", "null-s0"]) == [2, 4, 3, 1, 0]


def test_every_run_of_a_regime_has_its_own_shade():
    """The six seeds of a regime and every variant counting in it get different shades of its hue (the recipe
    regime: the KL, clipping and updates-per-batch variants)."""
    from graftkit.figures.runs import SHADES, shade_of
    from graftkit.study.design import VARIANTS

    for regime in {r for _, _, r in VARIANTS.values()} | {"degrade"}:
        seeds = [f"{regime}-s{i}" for i in range(6)] if regime in ("null", "degrade") else []
        names = seeds + [v for v, (_, _, r) in VARIANTS.items() if r == regime]
        shades = [SHADES[shade_of(n) % len(SHADES)] for n in names]
        assert len(set(shades)) == len(shades), (regime, dict(zip(names, shades)))


def test_regimes_come_from_the_recorded_study_config_else_the_run_names(study_run):
    from graftkit.figures.runs import Membership, membership, study_in

    run, _ = study_run
    study = study_in([read_result(run / "results" / "findings.h5")])
    assert study.regimes == ("null", "degrade", "collapse", "headroom") and study.variants == ("init-b-degrade",)
    from graftkit.study.design import SUITES

    assert study.suites["headroom"] == SUITES["headroom"]  # as the run's recorded config holds them
    assert membership("headroom-s0", study) == Membership("headroom", 0, "headroom", 0)
    assert membership("degrade-s1", study) == Membership("degrade", 1, "mastered", 1)
    assert membership("init-b-degrade", study).suite == "mastered"
    # a name the study does not know, or no study: the name alone, no suite
    assert membership("lr1-s2", study) == Membership("lr1", 2, None, 2) == membership("lr1-s2")
    assert membership("sft", study) is None and membership("rl") is None
    # a findings result without a study's config (another producer, an older run): no study, names decide
    for attrs in ({}, {"config": {"command": "eval", "regimes": {"a": 1}}}, {"config": {"regimes": [1]}},
                  {"config": {"regimes": {"a": 1}, "suites": {}, "variants": 3}}):
        assert study_in([Result("findings", {"finding": _s("1")}, {}, attrs)]) is None


@pytest.mark.slow
def test_kl_attribution_drawn_beside_success_when_the_sweep_exposes_it(tmp_path, monkeypatch):
    """A run's KL-scored sweep (its own file, --metric kl) beside its success sweep: the summary draws the KL
    attribution per group beside the success attribution, both named and coloured after the swept run; a sweep
    view without the KL accessor draws no KL side."""
    from graftkit.figures import grafts as G
    from graftkit.graft.experiments import SweepResult

    run = write_study_run(tmp_path / "demo")
    for name in STUDY_SWEPT:  # the KL sweep: configurations only, no success arrays
        res = read_result(run / "results" / f"graft-factorial-{name}.h5")
        write_result(run / "results" / f"graft-factorial-{name}-kl.h5", Result(
            res.kind, res.coords, {k: v for k, v in res.data.items() if k.startswith("config_")},
            {**res.attrs, "metric": "kl"}))
    monkeypatch.setattr(SweepResult, G.KL_ACCESSOR, None, raising=False)
    page = build_report(run)
    (fig,) = _section_figures(page, "summary")
    assert "KL attribution per group" not in [a["text"] for a in fig["layout"]["annotations"]]
    assert all([label for label, _ in _menu(f)] == list(STUDY_SWEPT) for f in _section_figures(page, "grafts"))
    kl = {"degrade-s0": np.array([[0.6, 0.4, 0.8], [0.3, 0.1, 0.5]]), "collapse-s0": np.array([[0.2, 0.0, 0.4],
                                                                                                 [0.9, 0.7, 1.0]])}

    def kl_attribution(self, name, side):
        return kl[self.attrs["rl_label"]] if name == "kl_shapley" and side == "rl" else None

    monkeypatch.setattr(SweepResult, G.KL_ACCESSOR, kl_attribution, raising=False)
    monkeypatch.setattr(SweepResult, "has_kl", property(lambda self: self.attrs.get("metric") == "kl"), raising=False)
    monkeypatch.setattr(SweepResult, "sides", property(lambda self: ["rl", "sft"]), raising=False)
    monkeypatch.setattr(SweepResult, "var_attrs", lambda self, name: {"unit": "fraction"} if name == "kl_shapley"
                        else self.result.var_attrs.get(name, {}))
    (fig,) = _section_figures(build_report(run), "summary")
    assert [a["text"] for a in fig["layout"]["annotations"]][:3] == [
        "regimes against SFT", "success attribution per group", "KL attribution per group"]
    assert fig["layout"]["yaxis3"]["title"]["text"] == "contribution to KL (% of RL's behavioural change)"
    success = [t for t in fig["data"] if t.get("xaxis") == "x2"]
    bars = [t for t in fig["data"] if t.get("xaxis") == "x3"]
    assert [t["name"] for t in success] == [t["name"] for t in bars] == list(STUDY_SWEPT)
    assert all(t["showlegend"] for t in success) and not any(t["showlegend"] for t in bars)
    assert [t["marker"]["color"] for t in success] == [t["marker"]["color"] for t in bars]
    for t in bars:
        np.testing.assert_allclose(_decode(t["y"]), 100 * kl[t["name"]][:, 0])
        assert t["x"] == ["attn", "mlp"]


def test_notebook_study_summary_is_the_reports(study_run):
    from graftkit import figures as F
    from graftkit.core.errors import GraftkitError
    from graftkit.figures.report import load_run

    run, page = study_run
    (want,) = _section_figures(page, "summary")
    files = [x.path for x in load_run(run) if x.kind in ("eval", "findings", "graft-sweep")]
    got = json.loads(F.study_summary(files).to_json())
    assert got["data"] == json.loads(json.dumps(want["data"])) and got["layout"]["title"] == want["layout"]["title"]
    with pytest.raises(GraftkitError, match="no regime to draw"):
        F.study_summary([run / "results" / "eval-sft-greedy.h5"])
    # per-run figures: every run of the result with a menu, or the run asked for
    delta = run / "results" / "delta.h5"
    assert [b.label for b in F.anatomy_heatmap(delta).layout.updatemenus[0].buttons] == STUDY_ORDER
    assert not F.anatomy_heatmap(delta, run="degrade-s1").layout.updatemenus
    title = F.anatomy_heatmap(delta, run=2).layout.title.text
    assert title.startswith("<b>Share of squared weight movement — degrade-s0")
    sweeps = [run / "results" / f"graft-factorial-{n}.h5" for n in STUDY_SWEPT]
    assert [b.label for b in F.graft_effects(sweeps[::-1]).layout.updatemenus[0].buttons] == list(STUDY_SWEPT)


# --------------------------------------------------------------------------------------------------
# Self-contained and escaped


def test_self_contained_plotly_inlined_once(full_run):
    _, page = full_run
    p = _parse(page)
    for tag, attrs in p.tags:
        for k in ("src", "href"):
            v = attrs.get(k) or ""
            assert not re.match(r"\s*(https?:)?//", v), (tag, k, v)
    scripts = p.scripts
    assert len(scripts) == 3 and not any("src" in a for a, _ in scripts)
    from plotly.offline import get_plotlyjs

    assert page.count(get_plotlyjs()[:2000]) == 1  # the bundle appears exactly once
    assert "<link" not in page and "@import" not in page


def test_planted_markup_is_inert(tmp_path):
    run = write_run(tmp_path / EVIL_DIR, evil=True)
    page = build_report(run)
    p = _parse(page)
    tags = [t for t, _ in p.tags]
    assert "img" not in tags
    assert tags.count("script") == 3
    assert [a.get("type") for a, _ in p.scripts] == [None, "application/json", None]
    assert not [(t, k) for t, a in p.tags for k in a if k.lower().startswith("on")]
    # The planted text is shown literally: in the page, as text…
    text = "".join(p.text)
    assert EVIL_DIR in text and "GRPO does not improve mastered tasks" + EVIL in text
    # …and inside the figures entity-escaped, so Plotly's label renderer shows it instead of parsing it.
    data_text = [t for a, t in p.scripts if a.get("type") == "application/json"][0]
    assert "<" not in data_text and ">" not in data_text
    figs = json.loads(data_text)
    blob = json.dumps(figs, ensure_ascii=False)
    assert "<script" not in blob and "<img" not in blob
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in blob
    assert "model.layers.0.self_attn.q_proj.weight&lt;script&gt;" in blob  # a tensor name
    assert "enter-text&lt;script&gt;" in blob  # a task name
    # Every label Plotly will parse carries only the builders' own tags.
    allowed = {"b", "/b", "br", "sup", "/sup", "extra", "/extra"}
    for s in re.findall(r"<(/?[a-zA-Z]+)", blob):
        assert s in allowed, s


def test_planted_markup_in_a_menu_is_inert(tmp_path):
    run = write_study_run(tmp_path / EVIL_DIR, evil=EVIL)
    page = build_report(run)
    data_text = [t for a, t in _parse(page).scripts if a.get("type") == "application/json"][0]
    assert "<" not in data_text and ">" not in data_text
    figs = json.loads(data_text)
    labels = [b["label"] for f in figs for m in f["figure"]["layout"].get("updatemenus", []) for b in m["buttons"]]
    assert "odd&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=\"window.__pwned=1\"&gt;" in labels
    blob = json.dumps(figs, ensure_ascii=False)
    assert set(re.findall(r"<(/?[a-zA-Z]+)", blob)) <= {"b", "/b", "br", "sup", "/sup", "extra", "/extra"}


# --------------------------------------------------------------------------------------------------
# CLI: report and results


@pytest.mark.slow
def test_cli_report_writes_the_page_and_lists_sections(full_run, tmp_path):
    run, _ = full_run
    out = tmp_path / "out" / "r.html"
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["path"] == str(out) and out.is_file()
    assert info["sections"] == list(PLAIN) and info["absent"] == ["summary"]
    assert info["figures"] == len(_figures(out.read_text()))
    # Default output: RUN/report.html, and the plain summary names it.
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0, r.output
    assert (run / "report.html").is_file() and "report.html" in r.stdout
    r = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such run folder" in r.output


def test_write_report_is_atomic(tmp_path, monkeypatch):
    run = write_run(tmp_path / "r", kinds=("findings",))
    out = tmp_path / "report.html"
    out.write_text("old")
    import graftkit.figures.report as report

    monkeypatch.setattr(report.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_report(run, out)
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_results_csv_round_trip(tmp_path):
    run = write_run(tmp_path / "r", evil=True)
    dest = tmp_path / "csv"
    r = CliRunner().invoke(app, ["results", str(run), "--csv", str(dest), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    listed = list_results(run)
    assert [x["file"] for x in info["results"]] == [str(Path(x["path"]).relative_to(run)) for x in listed]
    n_arrays = 0
    for row in listed:
        res = read_result(row["path"])
        for name, (dims, values) in res.data.items():
            n_arrays += 1
            f = dest / f"results__{Path(row['path']).stem}.{name}.csv"
            with open(f, newline="", encoding="utf-8") as fh:
                rows = list(csv.reader(fh))
            assert rows[0] == [*dims, "value"]
            assert len(rows) - 1 == values.size
            body = rows[1:]
            # Rebuild the array from the tidy rows by its labels: every value and label recovered exactly.
            index = [{str(v): i for i, v in enumerate(res.coords[d])} for d in dims]
            back = np.empty(values.shape, dtype=object)
            for cells in body:
                back[tuple(index[k][c] for k, c in enumerate(cells[:-1]))] = cells[-1]
            if values.dtype.kind in "fiub":
                np.testing.assert_array_equal(back.astype(float), values.astype(float))
            else:
                assert back.tolist() == values.tolist()
    assert len(info["csv"]) == n_arrays == len(list(dest.glob("*.csv")))
    # Never into an input folder.
    r = CliRunner().invoke(app, ["results", str(run), "--csv", str(run / "results")])
    assert r.exit_code == 2 and "holds the run's result files" in r.output
    # The listing without --csv.
    r = CliRunner().invoke(app, ["results", str(run)])
    assert r.exit_code == 0 and "graft-sweep" in r.stdout


# --------------------------------------------------------------------------------------------------
# Real producers: the report reads what graftkit itself writes


def test_report_reads_real_delta_and_rank_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    from _pairs import make_pair

    from graftkit.graft import delta_anatomy
    from graftkit.rank import delta_ranks, weight_ranks
    from graftkit.weights import open_checkpoint

    pair = make_pair(tmp_path / "ck", layers=3)
    b, r = open_checkpoint(pair.base), open_checkpoint(pair.rl)
    tax = b.taxonomy()
    run = tmp_path / "run"
    write_result(run / "results" / "delta-rl.h5", delta_anatomy(b, [r], ["rl"], tax, force_pair=True))
    write_result(run / "results" / "rank-weights-rl.h5", weight_ranks(r, tax))
    write_result(run / "results" / "rank-delta-rl.h5", delta_ranks(b, r, tax, force_pair=True))
    rep = make_report(run)
    assert rep.sections == ("anatomy", "rank") and rep.notes == ()
    figs = _figures(rep.html)
    hm = next(f["figure"]["data"][0] for f in figs if "Share of squared" in f["figure"]["layout"]["title"]["text"])
    assert len(hm["y"]) == 3 if isinstance(hm["y"], list) else True
    assert sum(1 for f in figs if "Rank by layer" in f["figure"]["layout"]["title"]["text"]) == 2


def test_report_reads_real_graft_and_coupling_results(tmp_path):
    from graftkit.graft import attribution as A
    from graftkit.graft import experiments as X
    from graftkit.rank.coupling import both_directions, coupling, coupling_result

    rng = np.random.default_rng(1)
    groups, present = ["attn", "mlp"], ["embed", "attn", "mlp", "norm"]
    exps = X.expand_sweep("factorial", groups, present)
    tasks, seeds, E = ["click-button", "enter-text"], list(range(5)), 4

    def outcomes(p_attn: float):
        return {e.label: (rng.random((2, 5, E)) < 0.8 - (p_attn if "attn" in e.groups else 0)).astype(np.int8)
                for e in exps}

    sa, sb = outcomes(0.4), outcomes(0.0)
    run = tmp_path / "run"
    res = X.sweep_result("factorial", exps, sa, tasks, seeds, E, groups, movement_share={"attn": 0.3, "mlp": 0.2},
                         n_boot=200)
    write_result(run / "results" / "graft-factorial-a.h5", res)
    d = A.dissociation(X.subset_outcomes(exps, sa), X.subset_outcomes(exps, sb), groups, n_boot=200)
    write_result(run / "results" / "graft-dissociation-a-vs-b.h5", X.dissociation_result(
        d, {"A": {"path": "/x/a", "label": "a"}, "B": {"path": "/x/b", "label": "b"}}))
    R = rng.random((5, 6)) * 10
    s = np.array([0.2, 0.3, 0.5, 0.6, 0.9])
    corr = coupling(R, s, np.full(5, 40), n_boot=200, runs=[f"r{i}" for i in range(5)])
    both = both_directions(R, s, R.mean(0), 0.5, ["credibly better", "credibly worse"] * 2 + ["no credible change"],
                           runs=[f"r{i}" for i in range(5)])
    write_result(run / "results" / "coupling-weights-erank.h5", coupling_result(corr, both))
    rep = make_report(run)
    assert rep.sections == ("grafts", "coupling") and rep.notes == ()
    titles = [f["figure"]["layout"]["title"]["text"] for f in _figures(rep.html)]
    for want in ("Graft effects", "Attribution", "Interactions", "Movement vs effect", "Double dissociation",
                 "Rank–success coupling by layer", "Late-layer rank vs success", "Both directions"):
        assert sum(t.startswith("<b>" + want) for t in titles) == 1, want
    fig = next(f["figure"] for f in _figures(rep.html) if "Double dissociation" in f["figure"]["layout"]["title"]["text"])
    assert [t["name"] for t in fig["data"][:2]] == ["effect in run A (a)", "effect in run B (b)"]
    e = _decode(fig["data"][0]["y"])
    np.testing.assert_allclose(e, 100 * d.effect[0, :, 0])


# --------------------------------------------------------------------------------------------------
# Browser


def _open_catching_errors(driver, page) -> None:
    """Open ``page`` in ``driver`` with window.__errors collecting every script error and unhandled rejection: the
    listener is installed before any page script runs (CDP), so errors during load are caught too."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "window.__errors = []; window.addEventListener('error', function (e) { window.__errors.push(String("
        "e.message)); }); window.addEventListener('unhandledrejection', function (e) { "
        "window.__errors.push(String(e.reason)); });")})
    driver.get(page.resolve().as_uri())


@pytest.mark.slow
@pytest.mark.skipif(not browser_available(), reason="needs selenium, chromium and chromium-driver")
def test_report_renders_in_chromium_without_errors(tmp_path):
    from graftkit.figures.browser import chromium, wait_rendered

    run = write_run(tmp_path / EVIL_DIR, evil=True)
    out = tmp_path / "report.html"
    rep = write_report(run, out)
    driver = chromium()
    try:
        _open_catching_errors(driver, out)
        assert wait_rendered(driver) == rep.n_figures > 20
        state = driver.execute_script("""
            var out = [];
            document.querySelectorAll('.graph').forEach(function (d) {
              // Drawn data: the trace groups (scatter, bars) and heatmap images inside the plot area.
              var drawn = 0, area = 0;
              d.querySelectorAll('.cartesianlayer .trace, .cartesianlayer .hm').forEach(function (t) {
                var b = t.getBoundingClientRect();
                if (b.width > 0 && b.height > 0) { drawn++; area += b.width * b.height; }
              });
              out.push({id: d.id, plotly: d.classList.contains('js-plotly-plot'),
                        traces: d._fullData ? d._fullData.length : 0, drawn: drawn, area: area});
            });
            return {figs: out, errors: window.__errors, pwned: typeof window.__pwned,
                    text: Array.from(document.querySelectorAll('svg text')).map(function (t) {
                      return t.textContent; }).join('\\n')};
        """)
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert severe == [] and state["errors"] == []
    assert state["pwned"] == "undefined"
    assert len(state["figs"]) == rep.n_figures
    for f in state["figs"]:
        assert f["plotly"] and f["traces"] > 0 and f["drawn"] > 0 and f["area"] > 0, f
    # the behavioural-divergence figures and the grafts' KL figures among them, each drawn
    page = out.read_text()
    kl_ids = set(re.findall(r"id='(fig-\d+)'", _section(page, "kl")))
    grafts = {f["id"]: f for f in _figures(page)}
    kl_ids |= {i for i in re.findall(r"id='(fig-\d+)'", _section(page, "grafts"))
               if "(KL)" in grafts[i]["figure"]["layout"]["title"]["text"]}
    assert len(kl_ids) == 4 and kl_ids <= {f["id"] for f in state["figs"] if f["drawn"] > 0}
    # Plotly shows the planted markup as literal text.
    assert "enter-text<script>alert(1)</script>" in state["text"]
    assert "act0<script>alert(1)</script>" in state["text"]


@pytest.mark.slow
@pytest.mark.skipif(not browser_available(), reason="needs selenium, chromium and chromium-driver")
def test_study_report_menus_switch_the_run_in_chromium(tmp_path):
    """A user's clicks: open each figure's menu, pick its second entry; that entry's traces, and only they, are
    drawn, and the title and the menu name it. No script error, the planted run name inert."""
    from selenium.webdriver.common.by import By

    from graftkit.figures.browser import chromium, wait_rendered

    run = write_study_run(tmp_path / EVIL_DIR, evil=EVIL)
    out = tmp_path / "report.html"
    rep = write_report(run, out)
    driver = chromium()
    try:
        _open_catching_errors(driver, out)
        assert wait_rendered(driver) == rep.n_figures
        menus = driver.execute_script("""
            return Array.from(document.querySelectorAll('.graph')).filter(function (g) {
              return (g.layout.updatemenus || []).length; }).map(function (g) {
              return {id: g.id, buttons: g.layout.updatemenus[0].buttons.map(function (b) {
                return {label: b.label, visible: b.args[0].visible}; })}; });""")
        assert len(menus) == 3 + 4 + 2  # anatomy (share, relative change, movers), grafts, training
        for m in menus:
            graph = driver.find_element(By.ID, m["id"])
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", graph)
            graph.find_element(By.CSS_SELECTOR, ".updatemenu-header").click()
            graph.find_elements(By.CSS_SELECTOR, ".updatemenu-dropdown-button")[1].click()
            state = driver.execute_script("""
                var g = document.getElementById(arguments[0]);
                var drawn = 0;
                g.querySelectorAll('.cartesianlayer .trace, .cartesianlayer .hm').forEach(function (t) {
                  var b = t.getBoundingClientRect(); if (b.width > 0 && b.height > 0) { drawn++; } });
                return {visible: g._fullData.map(function (t) { return t.visible === true; }), drawn: drawn,
                        header: g.querySelector('.updatemenu-header text').textContent,
                        title: g.querySelector('.gtitle').textContent};""", m["id"])
            picked = m["buttons"][1]
            assert state["visible"] == picked["visible"], m["id"]
            assert state["header"] == picked["label"] and state["drawn"] > 0
            if picked["label"] in STUDY_ORDER:  # a run: the title names it
                assert picked["label"] in state["title"]
        errors = driver.execute_script("return {errors: window.__errors, pwned: typeof window.__pwned};")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert errors == {"errors": [], "pwned": "undefined"} and severe == []


def test_long_curves_get_a_moving_mean_beside_the_raw_steps():
    from graftkit.figures.curves import FAMILIES, moving_mean, smoothing_window, training_curve

    y = np.random.default_rng(0).random(500)
    y[10] = np.nan
    w = smoothing_window(500)
    assert w == 11 and smoothing_window(199) == 0
    ref = [np.nanmean(y[max(0, i - w // 2): i + w // 2 + 1]) for i in range(500)]  # the window, clipped at the ends
    np.testing.assert_allclose(moving_mean(y, w), ref)
    res = Result("train-grpo", {"step": np.arange(500)}, {"loss": (("step",), y)})
    fig = training_curve([("run", res)], next(f for f in FAMILIES if f.key == "loss"))
    assert len(fig.data) == 2 and fig.data[1].showlegend is False
    np.testing.assert_allclose(fig.data[1].y, ref)


@pytest.mark.slow
@pytest.mark.skipif(not browser_available(), reason="needs selenium, chromium and chromium-driver")
def test_cli_report_screenshot_is_a_tall_png(tmp_path):
    from PIL import Image

    run = write_run(tmp_path / "r", kinds=("findings", "delta"))
    png = tmp_path / "shot" / "report.png"
    r = CliRunner().invoke(app, ["report", str(run), "--screenshot", str(png), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["screenshot"] == str(png)
    with Image.open(png) as im:
        w, h = im.size
        assert w == 1400 and h > 2000  # the whole page, not one window's worth
        # Not blank: the header band is dark, the page body light.
        assert im.convert("L").getpixel((10, 10)) < 80 and im.convert("L").getpixel((10, h // 2)) > 200
