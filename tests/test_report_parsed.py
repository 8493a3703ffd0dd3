"""The report states what parsed and how a user's file was covered, as the results record it.

Every figure that shows a score from model outputs gives, in its hover text, the share of outputs that parsed (a web
action, or an answer in the task's answer format) that the result holds: an evaluation's per task and pooled
(``EvalResult.parsed``), a headroom result's sampled outcomes, each side of a ``kl`` result (``KLResult.parsed``),
each configuration of a graft sweep (``SweepResult.parsed``) and its KL rollouts (``SweepResult.kl_parsed``). The
notes a reader needs — how a user's file was covered, and where most outputs did not parse, naming the flag that
reads another answer format — are section notes, prefixed by the model's label and escaped in the page. A user's
file played whole is counted against its own items, never against graftkit's held-out split of generated tasks.

Results are planted: evaluations constructed as views (``EvalResult``, ``HeadroomResult``), KL results and sweeps
built by their producers from planted numbers (tests/report_results.py).
"""

from __future__ import annotations

import html

import numpy as np
import pytest

from graftkit.evaluation.commands import EvalResult, HeadroomResult
from graftkit.evaluation.kl import KLResult
from graftkit.figures import make_report
from graftkit.figures import success as S
from graftkit.graft.experiments import SweepResult
from graftkit.results.layout import result_path
from graftkit.results.store import write_result
from report_results import kl_run, kl_sweep
from test_report import EVIL, _section
from test_report_kinds import _option, _titled

SEEDS, EPISODES, FILE_ITEMS = 8, 4, 64
#: A user's file (a verifiable task) and a generated web task.
FILE, WEB = "sums", "click-button"


def _hex(k: int) -> str:
    return f"{k:016x}"  # an item id; three in four fall outside the held-out split (is_heldout: ≡ 0 mod 4)


def _eval(label: str, tasks: tuple[str, ...], unparsed: dict[str, int], items: str = "heldout",
          whole: tuple[str, ...] = (), seed: int = 0) -> EvalResult:
    """An evaluation of ``tasks`` over 8 seeds × 4 episodes, one turn per episode of ``FILE`` (a problem) and two of
    ``WEB``; ``unparsed[task]``: how many of the task's episodes (the first ones) have one turn that did not parse.
    ``FILE`` plays items 0–31 of its 64 (the first consecutive items, as a file is played), ``WEB`` 20 distinct
    items over its 32 episodes."""
    rng = np.random.default_rng(seed)
    shape = (len(tasks), SEEDS, EPISODES, 1)
    n = SEEDS * EPISODES
    turns = np.stack([np.full(shape[1:], 1 if t == FILE else 2, np.int32) for t in tasks])
    invalid = np.stack([(np.arange(n) < unparsed.get(t, 0)).astype(np.int32).reshape(shape[1:]) for t in tasks])
    item = np.stack([np.array([_hex(k if t == FILE else 100 + k % 20) for k in range(n)], dtype=object)
                     .reshape(SEEDS, EPISODES) for t in tasks])
    attrs = {"model": {"path": f"/ckpt/{label}"}, "label": label, "decode": {"greedy": True}, "backend": "py",
             "obs": "text", "items": items, "invalid_outputs": {t: [[EVIL, int(unparsed[t])]] for t in unparsed},
             **({"tasks_evaluated_whole": list(whole)} if whole else {})}
    if FILE in tasks:
        attrs.update({"file_items": {FILE: FILE_ITEMS}, "task_sources": {FILE: f"/data/{FILE}.jsonl"},
                      "prompt_formats": {FILE: {"system": None, "template": "chat", "answer_format": "tags"}}})
    return EvalResult(tasks, np.arange(SEEDS), (rng.random(shape) < 0.4).astype(np.int8), np.zeros(shape), turns,
                      invalid, attrs, item)


def _headroom(label: str) -> HeadroomResult:
    """A headroom measurement of ``FILE`` played whole (``--items all``): 4 samples per episode, 1 greedy."""
    rng = np.random.default_rng(3)
    view = _eval(label, (FILE,), {FILE: 8}, items="all")
    k = 4
    shape = (1, SEEDS, EPISODES, k)
    return HeadroomResult(view.tasks, view.seeds, (rng.random(shape) < 0.5).astype(np.int8), np.zeros(shape),
                          np.repeat(view.turns, k, -1), np.repeat(view.invalid, k, -1), view.attrs, view.item,
                          greedy=(rng.random((1, SEEDS, EPISODES, 1)) < 0.3).astype(np.int8))


#: A hover's parse rate is a percentage with two decimals.
SHOWN = 5e-5


def _parsed(text: str) -> float:
    """A hover's parse rate ("87.50%") as a fraction."""
    assert text.endswith("%"), text
    return float(text[:-1]) / 100


def _notes_in(page: str, key: str, label: str, notes: list[str]) -> None:
    """Each of ``notes``, prefixed by ``label``, is a note of section ``key``, escaped."""
    part = _section(page, key)
    for n in notes:
        assert f"<p class='note'>{html.escape(f'{label}: {n}', quote=True)}</p>" in part, (label, n)


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    """A user's file evaluated by two models (the SFT model mostly unparsed, with markup as its most common output),
    played on consecutive items under ``--items all``; a headroom measurement of it; a ``kl`` result whose RL side
    mostly did not parse on one task, covering part of a file; a graft sweep whose configurations record their parse
    counts (two mostly unparsed) and a sweep that records none."""
    run = tmp_path_factory.mktemp("parsed") / "run"
    evals = {"sft": _eval("sft", (FILE,), {FILE: 24}, items="all"),
             "rl": _eval("rl", (FILE,), {FILE: 2}, items="all", seed=1)}
    for label, v in evals.items():
        write_result(result_path(run / "results", "eval", label=label, decoding="greedy", obs="text"), v.to_result())
    head = _headroom("sft")
    write_result(result_path(run / "results", "headroom", label="sft", obs="text"), head.to_result())
    kl = kl_run("rl", unparsed={"rl": {"arithmetic": 5}, "sft": {"click-button": 1}},
                attrs={"file_items": {"arithmetic": 6}, "whole_files": ["arithmetic"]})
    write_result(result_path(run / "results", "kl", a="rl", b="sft"), kl)
    sweeps = {"graft-factorial-rl.h5": kl_sweep("factorial", "both", "rl",
                                                unparsed={"attn": 0.75, "attn+mlp": 0.625, "mlp": 0.25},
                                                kl_unparsed={"rl": 0.125, "sft": 0.5},
                                                attrs={"file_items": {"arithmetic": 16}, "whole": ["arithmetic"],
                                                       "prompt_formats": {"arithmetic": {"answer_format": "tags"}}}),
              "graft-factorial-other.h5": kl_sweep("factorial", "both", "other", seed=2)}
    for name, r in sweeps.items():
        write_result(run / "results" / name, r)
    return run, evals, head, kl, sweeps, make_report(run)


# ------------------------------------------------------------------------------------------- success


def test_success_hover_gives_each_models_parse_rate(file_run):
    _, evals, _, _, _, rep = file_run
    fig = _titled(rep.html, "success", "Success rate per task")
    for t in fig["data"]:
        v = evals[t["name"]]
        assert t["x"] == [FILE, S.ALL_TASKS] and "outputs parsed: %{customdata[3]}" in t["hovertemplate"]
        shown = [_parsed(row[3]) for row in t["customdata"]]
        assert shown == pytest.approx([v.parsed(FILE), v.parsed()], abs=SHOWN)
    assert {t["name"]: _parsed(t["customdata"][0][3]) for t in fig["data"]} == {"sft": 0.25, "rl": 0.9375}


def test_a_result_without_parse_counts_says_so_in_the_hover():
    v = _eval("old", (WEB,), {})
    old = EvalResult(v.tasks, v.seeds, v.success, attrs=v.attrs)  # written before outputs were parsed and counted
    (trace,) = S.success_rates([("old", old.to_result())]).data
    assert [row[3] for row in trace.customdata] == ["not recorded", "not recorded"]


def test_success_notes_give_each_models_coverage_and_unparsed_warning_escaped(file_run):
    _, evals, _, _, _, rep = file_run
    covered = (f"{FILE}: 32 of the file's 64 items played (8 seeds × 4 episodes); pass --seeds 16 (seeds × episodes ≥ "
               "64) to play every item")
    warned = evals["sft"].action_notes()
    assert len(warned) == 1 and warned[0].startswith(f"{FILE}: 75% of completions stated no answer in the answer "
                                                     "format tags") and "--answer-format" in warned[0]
    assert evals["rl"].action_notes() == []  # 2 of 32 unparsed: nothing to warn of
    _notes_in(rep.html, "success", "sft", [covered, *warned])
    _notes_in(rep.html, "success", "rl", [covered])
    assert f"sft: {warned[0]}" in rep.notes and f"rl: {covered}" in rep.notes
    assert EVIL not in rep.html and html.escape(repr(EVIL), quote=True) in _section(rep.html, "success")


def test_a_users_file_played_whole_is_counted_against_its_items_not_the_held_out_split(file_run):
    _, evals, _, _, _, rep = file_run
    part = _section(rep.html, "success")
    assert "sft: Evaluation items (distinct / file items): sums 32/64." in part
    assert "held-out" not in part  # 24 of its 32 item ids would fall outside graftkit's split
    # the same file named by tasks_evaluated_whole (a file a training command does not train on) reads the same
    whole = _eval("sft", (FILE,), {}, whole=(FILE,)).to_result()
    assert S.item_line(whole) == "Evaluation items (distinct / file items): sums 32/64."


def test_a_generated_tasks_evaluation_keeps_the_held_out_remark(tmp_path):
    run = tmp_path / "run"
    v = _eval("sft", (WEB,), {WEB: 4})
    write_result(result_path(run / "results", "eval", label="sft", decoding="greedy", obs="text"), v.to_result())
    overlap = sum(int(_hex(100 + k), 16) % 4 != 0 for k in range(20))
    line = f"Evaluation items (distinct / episodes): {WEB} 20/32; items outside the held-out split: {overlap}."
    page = make_report(run).html
    assert f"<p class='note'>sft: {line}</p>" in _section(page, "success") and overlap == 15
    # beside a file played whole, each task is counted its own way
    mixed = _eval("sft", (WEB, FILE), {}, whole=(FILE,)).to_result()
    assert S.item_line(mixed) == (f"Evaluation items (distinct / episodes): {WEB} 20/32; items outside the held-out "
                                  f"split: {overlap}; user's files evaluated whole (distinct / file items): sums 32/64.")


def test_headroom_states_parse_rate_coverage_and_items_the_same_way(file_run):
    _, _, head, _, _, rep = file_run
    fig = _titled(rep.html, "headroom", "Greedy vs sampled success")
    greedy, sampled = fig["data"]
    assert "outputs parsed" not in greedy["hovertemplate"]  # greedy outcomes keep no parse counts
    assert [_parsed(row[3]) for row in sampled["customdata"]] == pytest.approx([head.parsed(FILE), head.parsed()],
                                                                               abs=SHOWN)
    assert head.parsed(FILE) == 0.75
    _notes_in(rep.html, "headroom", "sft", ["Evaluation items (distinct / file items): sums 32/64.",
                                            head.coverage_note(FILE)])
    assert "held-out" not in _section(rep.html, "headroom")


# ------------------------------------------------------------------------------------------------ KL


def test_kl_hover_gives_each_sides_parse_rate_and_the_notes_are_the_results(file_run):
    _, _, _, kl, _, rep = file_run
    v = KLResult.from_result(kl)
    fig = _titled(rep.html, "kl", "Behavioural divergence per task")
    for t in fig["data"]:
        side = "rl" if t["name"].startswith("KL(π_RL") else "sft"
        assert "outputs parsed on these rollouts: %{customdata[2]}" in t["hovertemplate"]
        assert [_parsed(row[2]) for row in t["customdata"]] == pytest.approx([v.parsed(side, s) for s in v.scopes],
                                                                          abs=SHOWN)
    assert v.parsed("rl", "arithmetic") == pytest.approx(1 / 6) and v.parsed("sft", "click-button") == pytest.approx(5 / 6)
    notes = v.notes()
    assert any("3 of the file's 6 items played" in n for n in notes)
    assert any(n.startswith("arithmetic: 83% of RL's completions") and "--answer-format" in n for n in notes)
    _notes_in(rep.html, "kl", "rl", notes)


# ------------------------------------------------------------------------------------------- grafts


def test_graft_hover_gives_each_configurations_parse_rate(file_run):
    _, _, _, _, sweeps, rep = file_run
    fig = _titled(rep.html, "grafts", "Graft effects")
    for label, name in (("rl", "graft-factorial-rl.h5"), ("other", "graft-factorial-other.h5")):
        v = SweepResult.from_result(sweeps[name])
        for t in _option(fig, label):
            assert t["y"] == v.configs and "outputs parsed: %{customdata[5]}" in t["hovertemplate"]
            shown = [row[5] for row in t["customdata"]]
            if label == "other":  # a sweep that recorded no parse counts
                assert shown == ["not recorded"] * len(v.configs) and np.isnan(v.parsed(v.configs[0]))
            else:
                assert [_parsed(x) for x in shown] == pytest.approx([v.parsed(c) for c in v.configs], abs=SHOWN)
    v = SweepResult.from_result(sweeps["graft-factorial-rl.h5"])
    assert v.parsed("attn") == 0.25 and v.parsed("∅ (base)") == 1.0
    # the KL rollouts' parse rate, per side, in the reproduced-fraction figure
    fig = _titled(rep.html, "grafts", "Behavioural change each graft reproduces (KL)")
    for t, side in zip(_option(fig, "rl"), ("rl", "sft")):
        assert [_parsed(row[6]) for row in t["customdata"]] == pytest.approx([v.kl_parsed(side)] * len(v.configs),
                                                                             abs=SHOWN)
    assert (v.kl_parsed("rl"), v.kl_parsed("sft")) == (0.875, 0.5)


def test_graft_notes_are_the_commands_warning_and_coverage(file_run):
    from graftkit.graft.commands import file_coverage, sweep_json, unparsed_lines

    _, _, _, _, sweeps, rep = file_run
    v = SweepResult.from_result(sweeps["graft-factorial-rl.h5"])
    warned, covered = unparsed_lines(sweep_json(v, "/runs/rl")), file_coverage(v)  # what `graftkit graft` prints
    assert len(warned) == 1 and "in 2 of 5 configurations (attn: 25% parsed)" in warned[0]
    assert "--answer-format" in warned[0]
    assert covered == ["arithmetic: 8 of the file's 16 items played (4 seeds × 2 episodes); pass --seeds 8 (seeds × "
                       "episodes ≥ 16) to play every item"]
    _notes_in(rep.html, "grafts", "rl", warned + covered)
    other = SweepResult.from_result(sweeps["graft-factorial-other.h5"])
    assert unparsed_lines(sweep_json(other, "/runs/other")) == [] and file_coverage(other) == []
    assert not any(n.startswith("other: ") for n in rep.notes)  # nothing to say of a sweep that parsed and split
