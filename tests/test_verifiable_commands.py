"""Every command that evaluates or trains, on verifiable tasks: built-in ones, a user's JSONL file and a
Python entry point — ``train sft``, ``eval`` (paired), ``headroom`` (pass@k), ``train grpo`` (VeriGate's
process fallback) and ``graft --eval``."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.results.store import read_result
from graftkit.verifiable import registry

runner = CliRunner()


def _run(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A briefly trained SFT policy on arithmetic-2 and a GRPO run from it (VeriGate on)."""
    import os

    root = tmp_path_factory.mktemp("verifiable")
    old = os.environ.get("GRAFTKIT_RUNS")
    os.environ["GRAFTKIT_RUNS"] = str(root / "runs")
    try:
        res = runner.invoke(app, ["train", "sft", "--out", str(root / "sft"), "--tasks", "arithmetic-2,multiples",
                                  "--steps", "40", "--size", "nano", "--threads", "1", "--batch-size", "16"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(app, ["train", "grpo", "--init", str(root / "sft"), "--out", str(root / "rl"), "--tasks",
                                  "arithmetic-2", "--steps", "2", "--prompts-per-step", "2", "--group-size", "4",
                                  "--lr", "1e-3", "--verigate", "--max-new-tokens", "12"])
        assert res.exit_code == 0, res.output
    finally:
        if old is None:
            os.environ.pop("GRAFTKIT_RUNS")
        else:
            os.environ["GRAFTKIT_RUNS"] = old
    return root


def test_sft_demonstrates_solutions_of_training_items(policies):
    prov = json.loads((policies / "sft" / "graftkit.json").read_text())
    assert set(prov["config"]["budgets"]) == {"arithmetic-2", "multiples"}
    assert prov["config"]["budgets"]["arithmetic-2"] == 1_000_000  # fresh problems throughout


def test_grpo_on_a_problem_task_logs_verigate_paths_and_items(policies):
    log = [json.loads(line) for line in (policies / "rl" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 2
    for m in log:
        assert abs(m["verigate_outcome"] + m["verigate_process"] + m["verigate_none"] - 1) < 1e-9
    rows = (policies / "rl" / "train_items.tsv").read_text().splitlines()
    assert len(rows) == 4 and all(r.startswith("arithmetic-2\t") for r in rows)
    from graftkit.webenv.items import is_heldout

    assert not any(is_heldout(r.split("\t")[1]) for r in rows)  # GRPO never trains on an evaluation item


def test_eval_pairs_two_policies_on_identical_problems(policies, tmp_path, monkeypatch):
    res = _run(["eval", "--model", policies / "rl", "--compare", policies / "sft", "--tasks", "arithmetic-2",
                "--seeds", "3", "--episodes", "4", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    a, b = read_result(payload["files"]["model"]), read_result(payload["files"]["compare"])
    assert (a["item"] == b["item"]).all() and a["success"].shape == (1, 3, 4, 1)
    assert a.attrs["task_sources"] == {"arithmetic-2": "builtin"}
    assert payload["tasks"][0]["task"] == "arithmetic-2"


def test_headroom_samples_k_completions(policies, tmp_path, monkeypatch):
    res = _run(["headroom", "--model", policies / "sft", "--tasks", "arithmetic-2,multiples", "--seeds", "2",
                "--episodes", "3", "--k", "4", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    stored = read_result(payload["file"])
    assert stored["success"].shape == (2, 2, 3, 4)
    assert [r["task"] for r in payload["tasks"]][:2] == ["arithmetic-2", "multiples"]


def test_graft_eval_on_a_problem_task(policies, tmp_path, monkeypatch):
    res = _run(["graft", "--from", policies / "rl", "--base", policies / "sft", "--groups", "mlp", "--eval",
                "--tasks", "arithmetic-2", "--seeds", "2", "--episodes", "3", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert "arithmetic-2" in json.dumps(payload)


@pytest.fixture
def clean_registry():
    registry._REGISTERED.clear()
    registry._FORMATTED.clear()
    yield
    registry._REGISTERED.clear()
    registry._FORMATTED.clear()


def test_eval_on_a_users_jsonl_and_entry_point(policies, tmp_path, monkeypatch, clean_registry):
    items = tmp_path / "sums.jsonl"
    items.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": 2 * i, "verifier": "numeric"}) + "\n"
                             for i in range(40)))
    res = _run(["eval", "--model", policies / "sft", "--tasks", f"{items},arithmetic-2", "--seeds", "2",
                "--episodes", "3", "--items", "all", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    stored = read_result(json.loads(res.stdout)["files"]["model"])
    assert list(stored.coords["task"]) == ["sums", "arithmetic-2"]
    assert stored.attrs["task_sources"]["sums"].startswith(str(items.resolve()))
    (tmp_path / "mytasks.py").write_text(textwrap.dedent("""
        from graftkit.verifiable import Arithmetic

        def suite():
            return [Arithmetic(name="add-one-digit", digits=1)]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    res = _run(["eval", "--model", policies / "sft", "--tasks", "mytasks:suite", "--seeds", "2", "--episodes", "2",
                "--items", "all", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    stored = read_result(json.loads(res.stdout)["files"]["model"])
    assert list(stored.coords["task"]) == ["add-one-digit"] and stored.attrs["task_sources"] == {
        "add-one-digit": "mytasks:suite"}


def test_a_bad_task_file_is_one_line_and_exit_2(policies, tmp_path, monkeypatch, clean_registry):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "answer": 1}\n{"answer": 2}\n')
    res = _run(["eval", "--model", policies / "sft", "--tasks", bad, "--seeds", "1"], tmp_path, monkeypatch)
    assert res.exit_code == 2
    assert f"{bad}:2" in res.output and "prompt" in res.output and "Traceback" not in res.output
    res = _run(["eval", "--model", policies / "sft", "--tasks", "no_such_module_xyz:suite", "--seeds", "1"], tmp_path,
               monkeypatch)
    assert res.exit_code == 2 and "no_such_module_xyz" in res.output


def test_an_untrained_policy_is_told_the_answer_format(tmp_path, monkeypatch):
    from graftkit.agent import tiny_policy, tiny_words
    from graftkit.weights import save_model

    p = tiny_policy(tiny_words(("arithmetic",)), "nano", seed=3)
    folder = save_model(tmp_path / "raw", p.model, p.tokenizer, provenance={"producer": "test"})
    res = _run(["eval", "--model", folder, "--tasks", "arithmetic", "--seeds", "1", "--episodes", "4",
                "--max-new-tokens", "3"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "no completion stated an answer in the answer format tags" in said and "--answer-format" in said


def _sums_file(tmp_path, name: str, numbers) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": 2 * i}) + "\n" for i in numbers))
    return str(path)


def _items_of(task: str, n: int) -> list[str]:
    """The item ids of a user's file's n items (seed s shows item s)."""
    from graftkit.verifiable import ProblemEnv, lookup
    from graftkit.webenv.items import item_id

    env = ProblemEnv(lookup(task))
    return [item_id(env.reset(s)) for s in range(n)]


def test_eval_plays_a_users_file_whole(tmp_path, monkeypatch, clean_registry):
    """A 4-line file on its own is every item of it: the one-in-four held-out split is for a run that trains on it."""
    from graftkit.agent import resolve_tasks, tiny_policy, tiny_words
    from graftkit.weights import save_model
    from graftkit.webenv.items import is_heldout

    four = _sums_file(tmp_path, "four.jsonl", (3, 5, 7, 9))
    (task,) = resolve_tasks(four)
    items = _items_of(task, 4)
    assert not all(is_heldout(i) for i in items)  # so held-out items alone would not be all four
    p = tiny_policy(tiny_words((task,)), "nano", seed=0)
    folder = save_model(tmp_path / "raw", p.model, p.tokenizer, provenance={"producer": "test"})
    res = _run(["eval", "--model", folder, "--tasks", four, "--seeds", "1", "--episodes", "4", "--max-new-tokens", "3",
                "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    stored = read_result(payload["files"]["model"])
    assert sorted(stored["item"].ravel()) == sorted(items)
    assert stored.attrs["tasks_evaluated_whole"] == ["four"] and stored.attrs["config"]["items"] == "auto"
    assert "four: the whole file played, 4 items, each once" in payload["notes"]
    # what the study asks for, since it trains on the file: only the items training never draws
    res = _run(["eval", "--model", folder, "--tasks", four, "--seeds", "1", "--episodes", "4", "--max-new-tokens", "3",
                "--items", "heldout", "--json"], tmp_path, monkeypatch)
    if any(is_heldout(i) for i in items):
        stored = read_result(json.loads(res.stdout)["files"]["model"])
        assert all(is_heldout(i) for i in stored["item"].ravel()) and "tasks_evaluated_whole" not in stored.attrs
    else:
        assert res.exit_code == 2 and "no evaluation item" in res.output


def test_training_on_a_users_file_holds_its_items_out(tmp_path, clean_registry):
    """A run that trains on a user's file still splits it: GRPO's prompts (and SFT's demonstrations, drawn the
    same way) are its training items only, never the held-out ones the study evaluates."""
    from graftkit.agent import resolve_tasks
    from graftkit.train.configs import GRPOConfig
    from graftkit.train.grpo import prompt_items
    from graftkit.webenv.items import is_heldout

    (task,) = resolve_tasks(_sums_file(tmp_path, "forty.jsonl", range(40)))
    held = {i for i in _items_of(task, 40) if is_heldout(i)}
    assert held  # some of the file is held out
    cfg = GRPOConfig(init=str(tmp_path), out=str(tmp_path / "rl"), tasks=(task,), prompts_per_step=4)
    prompts = {item for _, item in prompt_items(cfg, 10)}
    assert len(prompts) > 10 and not prompts & held


def _user_tasks(tmp_path, monkeypatch):
    """A user's JSONL file (sums of two numbers) and an entry point (one-digit sums), both importable here."""
    items = tmp_path / "sums.jsonl"
    items.write_text("".join(json.dumps({"prompt": f"What is {i} + {i + 3}?", "answer": 2 * i + 3, "verifier": "numeric"})
                             + "\n" for i in range(10, 210)))
    (tmp_path / "mytasks.py").write_text(textwrap.dedent("""
        from graftkit.verifiable import Arithmetic

        def suite():
            return [Arithmetic(name="add-one-digit", digits=1)]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return str(items), "mytasks:suite"


def test_train_headroom_and_graft_on_a_users_tasks(policies, tmp_path, monkeypatch, clean_registry):
    jsonl, entry = _user_tasks(tmp_path, monkeypatch)
    res = _run(["train", "sft", "--out", tmp_path / "sft", "--init", policies / "sft", "--tasks", f"{jsonl},{entry}",
                "--steps", "3", "--batch-size", "4", "--threads", "1"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    budgets = json.loads((tmp_path / "sft" / "graftkit.json").read_text())["config"]["budgets"]
    assert set(budgets) == {"sums", "add-one-digit"}
    res = _run(["train", "grpo", "--init", tmp_path / "sft", "--out", tmp_path / "rl", "--tasks", jsonl, "--steps", "2",
                "--prompts-per-step", "2", "--group-size", "2", "--lr", "1e-3", "--max-new-tokens", "10"],
               tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    rows = (tmp_path / "rl" / "train_items.tsv").read_text().splitlines()
    assert len(rows) == 4 and all(r.startswith("sums\t") for r in rows)
    res = _run(["headroom", "--model", tmp_path / "sft", "--tasks", entry, "--seeds", "2", "--episodes", "3", "--k", "2",
                "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    stored = read_result(json.loads(res.stdout)["file"])
    assert list(stored.coords["task"]) == ["add-one-digit"] and stored["success"].shape == (1, 2, 3, 2)
    res = _run(["graft", "--from", tmp_path / "rl", "--base", tmp_path / "sft", "--groups", "attn", "--eval",
                "--tasks", jsonl, "--seeds", "2", "--episodes", "2", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert "sums" in json.dumps(json.loads(res.stdout))


def test_the_study_takes_a_users_tasks_as_its_suites(tmp_path, monkeypatch, clean_registry):
    from graftkit.core.errors import GraftkitError
    from graftkit.study.pipeline import StudyConfig, all_tasks

    jsonl, entry = _user_tasks(tmp_path, monkeypatch)
    cfg = StudyConfig.preset(str(tmp_path / "run"), True, domain="arithmetic", mastered_tasks=jsonl,
                             headroom_tasks=entry)
    assert cfg.suites == {"mastered": ("sums",), "headroom": ("add-one-digit",)}
    assert cfg.sft_recipe.tasks == cfg.sft_b_recipe.tasks == cfg.probe_tasks == "sums,add-one-digit"
    assert all_tasks(cfg) == ["sums", "add-one-digit"]
    assert "suites given by the user" in cfg.regime_calibration
    keep = StudyConfig.preset("x", True, domain="arithmetic", headroom_tasks="countdown")
    assert keep.suites == {"mastered": ("multiples",), "headroom": ("countdown",)}
    with pytest.raises(GraftkitError, match="click-tab is a web task"):
        StudyConfig.preset("x", True, domain="arithmetic", mastered_tasks="click-tab")
    with pytest.raises(GraftkitError, match="add --domain arithmetic"):
        StudyConfig.preset("x", True, mastered_tasks=jsonl)


@pytest.mark.slow
def test_the_study_runs_end_to_end_on_a_jsonl_and_an_entry_point(tmp_path, monkeypatch, clean_registry):
    from graftkit.demo import run_study
    from graftkit.study.pipeline import StudyConfig

    jsonl, entry = _user_tasks(tmp_path, monkeypatch)
    cfg = StudyConfig.preset(str(tmp_path / "run"), True, domain="arithmetic", mastered_tasks=jsonl,
                             headroom_tasks=entry, sft_recipe={"steps": 30},
                             grpo_recipe={"steps": 2, "checkpoint_every": 1}, seeds=(0,), degrade_seeds=(0,),
                             variants=(), regimes={"collapse": 1e-2}, eval_seeds=3, headroom_k=2, graft_seeds=2,
                             graft_groups=("attn",), probes=4)  # the stages the built-in study's test does not repeat
    info = run_study(cfg)
    root = tmp_path / "run"
    ev = read_result(root / "results" / "eval-sft-greedy.h5")
    assert list(ev.coords["task"]) == ["sums", "add-one-digit"]
    assert ev.attrs["task_sources"]["add-one-digit"] == entry and ev.attrs["task_sources"]["sums"].startswith(
        str((tmp_path / "sums.jsonl").resolve()))
    assert info["items"]["sft_overlap"] == 0 and set(info["items"]["grpo_overlap"].values()) == {0}
    from graftkit.webenv.items import is_heldout

    # the study trains on the file, so it evaluates the file's held-out items only
    assert "tasks_evaluated_whole" not in ev.attrs and all(is_heldout(i) for i in ev["item"][0].ravel())
    assert len(info["findings"]) == 4 and (root / "report.html").is_file()


def test_a_sweep_grid_names_verifiable_tasks(tmp_path, monkeypatch, clean_registry):
    from graftkit.train.sweep import expand

    jsonl, _ = _user_tasks(tmp_path, monkeypatch)
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"out: runs\ninits:\n  sft: {tmp_path}\nbase: {{init: sft, steps: 2, tasks: 'countdown-4,{jsonl}'}}\n"
                    "product: {lr: [1.0e-4, 1.0e-3]}\n")
    specs = expand(grid)
    assert [s.config.tasks for s in specs] == [("countdown-4", "sums")] * 2


def test_a_solution_its_verifier_does_not_score_1_stops_sft_with_one_line(tmp_path, monkeypatch, clean_registry):
    """A user's task whose demonstrated solution its own reward rejects is never trained on: SFT plays each
    demonstration as an episode and stops at the first that does not reach reward 1, naming the task, the item's
    seed and the fix; nothing is written. (A JSONL file's solutions are checked as it loads: an entry point's task
    class is checked here.)"""
    (tmp_path / "offtasks.py").write_text(textwrap.dedent("""
        from graftkit.verifiable import Arithmetic

        class OffByOne(Arithmetic):
            def solution(self, problem):
                return self.stated_answer(problem, str(int(problem.answer) + 1))

        def suite():
            return [OffByOne(name="off-by-one", digits=1)]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    res = _run(["train", "sft", "--out", tmp_path / "sft", "--tasks", "offtasks:suite", "--steps", "2", "--size",
                "nano", "--threads", "1", "--batch-size", "4"], tmp_path, monkeypatch)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith("error: the off-by-one demonstration failed on seed ") and "\n" not in err, err
    assert "does not reach reward 1" in err and "its verifier scores 1" in err and "Traceback" not in res.output
    assert not (tmp_path / "sft").exists()
