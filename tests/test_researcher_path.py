"""A researcher's own run, end to end, the way it first failed: TRL's own ``GRPOTrainer`` (not graftkit's) trains a
tiny random chat model for a few CPU steps with ``save_steps``, on the user's JSONL file — conversational prompts,
each with its own system message, whose answers are plain numbers read by the user's reward function — and then the
README's path runs on the ``output_dir`` exactly as TRL wrote it: ``inspect``, ``delta --all-checkpoints``,
``kl --all-checkpoints``, ``graft --sweep single --metric both --all-checkpoints``, ``eval``, ``rank --what delta``,
``report``; the report is opened in Chromium. Nothing needs a workaround: no file copied, renamed or edited, no system message copied out of graftkit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.results.store import read_result

# found, not imported: collecting this module does not load TRL (each test's subprocess does)
# one xdist worker runs the module: the user's trial (a TRL run, a module fixture) is trained once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("researcher-path"),
              pytest.mark.skipif(not all(find_spec(m) for m in ("trl", "datasets")),
                                 reason="TRL is not installed (the trl extra)")]
HERE = Path(__file__).resolve().parent
SYSTEM = "You add two numbers. End your reply with the number."
N_ITEMS = 16
#: What every command that plays the file is told of the trainer's format (the system message is in the file).
FORMAT = ("--tasks", "problems.jsonl", "--answer-format", "last-number", "--max-new-tokens", "8")
EPISODES = ("--seeds", "4", "--episodes", "4")  # 16 episodes: the whole file


def _cli(cwd: Path, *args) -> dict:
    """A graftkit command as the user types it in ``cwd``, with ``--json``: its output, or the test fails with it."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, [str(a) for a in args] + ["--json"])
    finally:
        os.chdir(old)
    assert res.exit_code == 0, f"graftkit {' '.join(map(str, args))}: {res.output}"
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    """The user's folder: ``sft/`` (a tiny random chat model, SmolLM2's chat template), ``problems.jsonl``, ``out/``
    (TRL's output_dir: checkpoint-2, checkpoint-4) and every graftkit command's JSON output, run folder ``run/``."""
    from chat_models import chat_model_folder

    root = tmp_path_factory.mktemp("researcher")
    chat_model_folder(root / "sft", "smollm2", seed=0, hidden=64, layers=2)
    rows = [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"What is {i} + {i % 5}?"}],
             "answer": i + i % 5} for i in range(N_ITEMS)]
    (root / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": str(HERE), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(HERE / "trl_user_run.py"), "sft", "problems.jsonl", "out", "4"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    os.environ.setdefault("GRAFTKIT_RUNS", str(root / "runs"))
    run = ("--run", "run")
    out = {
        "inspect": _cli(root, "inspect", "out"),
        "delta": _cli(root, "delta", "--base", "sft", "--from", "out", "--all-checkpoints", *run),
        "kl": _cli(root, "kl", "--model", "out", "--base", "sft", "--all-checkpoints", *FORMAT, *EPISODES,
                   "--n-boot", "400", *run),
        "graft": _cli(root, "graft", "--from", "out", "--base", "sft", "--sweep", "single", "--metric", "both",
                      "--all-checkpoints", *FORMAT, *EPISODES, *run),
        "eval": _cli(root, "eval", "--model", "out", "--compare", "sft", *FORMAT, *EPISODES, *run),
        "rank": _cli(root, "rank", "--what", "delta", "--model", "out", "--base", "sft", *run),
        # the same KL as kl above (its --n-boot too): trajectory rewrites each step's kl result, bit for bit
        "trajectory": _cli(root, "trajectory", "--from", "out", "--base", "sft", *FORMAT, *EPISODES, "--n-boot", "400",
                           *run),
        "top": _cli(root, "graft", "--from", "out", "--base", "sft", "--groups", "all", "--top-frac", "0.05", *run),
    }
    out["report"] = _cli(root, "report", "run")
    return root, out


def test_trl_wrote_its_output_dir_as_trl_writes_it(trial):
    root, _ = trial
    steps = sorted(int(p.name.split("-")[1]) for p in (root / "out").glob("checkpoint-*"))
    assert steps == [2, 4]
    for s in steps:
        ck = root / "out" / f"checkpoint-{s}"
        assert (ck / "model.safetensors").is_file() and (ck / "trainer_state.json").is_file()
        assert (ck / "optimizer.pt").is_file()  # TRL's pickles sit beside the weights; graftkit never opens them
        assert not (ck / "graftkit.json").exists()


def test_inspect_and_delta_read_the_output_dir_step_by_step(trial):
    root, out = trial
    assert any("checkpoints at steps 2, 4" in n for n in out["inspect"]["notes"])
    delta = read_result(root / out["delta"]["result_file"])
    assert [str(r) for r in delta.coords["run"]] == ["out-checkpoint-2", "out-checkpoint-4"]
    moved = np.asarray(delta["fro_delta"]).sum(axis=1)
    assert (moved > 0).all() and moved[1] > moved[0]  # four steps moved further than two


def test_behaviour_is_followed_step_by_step(trial):
    """kl and the graft sweep, like delta, give one row per checkpoint: when behaviour moved and which group moved it."""
    from graftkit.evaluation.kl import KLResult

    root, out = trial
    rows = out["kl"]["trajectory"]
    assert [r["step"] for r in rows] == [2, 4]
    for r, step in zip(rows, out["kl"]["steps"]):
        view = KLResult.read(root / r["file"])
        assert view.step == r["step"] and r["rl"]["kl_per_token"] == list(view.summary("rl", "all", "token"))
        assert r["rl"]["kl_per_token"][0] > 0 and step["file"] == r["file"]
    sweep = out["graft"]["trajectory"]
    assert [r["step"] for r in sweep["rows"]] == [2, 4] and sweep["names"] == ["embed", "attn", "mlp", "norm"]
    for r in sweep["rows"]:
        for g in sweep["names"]:
            assert np.isfinite(r["effects"][g]["reproduced_rl"][0])


def test_the_file_is_played_whole_in_the_trainers_format(trial):
    root, out = trial
    kl = out["kl"]["steps"][-1]
    (row, pooled) = kl["tasks"]
    assert row["task"] == "problems" and row["items"] == N_ITEMS and row["file_items"] == N_ITEMS
    assert "problems: the whole file played, 16 items, each once" in kl["notes"]
    for side in ("rl", "sft"):
        assert 0 <= row[side]["parsed"] <= 1 and row[side]["episodes"] == N_ITEMS
    ev = out["eval"]
    assert ev["tasks"][0]["items"] == N_ITEMS and ev["tasks"][0]["file_items"] == N_ITEMS
    stored = read_result(root / ev["files"]["model"])
    fmt = stored.attrs["prompt_formats"]["problems"]
    assert fmt["answer_format"] == "last-number" and fmt["template"] == "auto"
    # each item's own system message reached the prompt the policy read, through the model's chat template
    from graftkit.agent import load_policy, resolve_tasks
    from graftkit.verifiable import lookup

    resolve_tasks(str(root / "problems.jsonl"))
    task = lookup("problems")
    policy = load_policy(root / "out" / "checkpoint-4")
    text = policy.tokenizer.decode(policy.problem_ids(task.conversation(task.problem(0))))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is ")


def test_the_fields_questions_on_the_trainers_run(trial):
    """trajectory, a top-fraction graft and the principal directions on TRL's output_dir as TRL wrote it."""
    from graftkit.weights import open_checkpoint

    root, out = trial
    t = out["trajectory"]
    assert [r["step"] for r in t["steps"]] == [2, 4] and t["steps"][-1]["cos_to_final"] == pytest.approx(1.0)
    assert 0 <= t["groups"]["all"]["r2"] <= 1 and 0 <= t["groups"]["all"]["r2_random_walk"] <= 1
    assert all(0 <= r["frac_unchanged_bf16"] <= 1 for r in t["steps"])
    # KL at every step, in the trainer's format: the estimates kl --all-checkpoints gives on the same rollouts
    assert [r["kl_per_token"][0] for r in t["steps"]] == pytest.approx(
        [r["rl"]["kl_per_token"][0] for r in out["kl"]["trajectory"]], rel=1e-9)
    top = out["top"]
    sft, rl, grafted = (open_checkpoint(p) for p in (root / "sft", root / "out" / "checkpoint-4", Path(top["out"])))
    changed = sum(int((grafted.read(n) != sft.read(n)).sum()) for n in sft.metas)
    assert changed == top["sparsity"]["changed"] <= top["sparsity"]["selected"]
    for n in sft.metas:  # every entry is base's or RL's, bit for bit
        g, b, r = grafted.read(n), sft.read(n), rl.read(n)
        assert bool(((g == b) | (g == r)).all()), n
    principal = next(iter(out["rank"]["models"].values()))["principal"]
    every = next(r for r in principal if r["group"] == "all")
    assert 0 < every["delta_energy_top8"] <= 1 and 0 < every["delta_energy_top8_chance"] < 1


def test_every_command_states_what_parsed(trial):
    _, out = trial
    for run in out["graft"]["runs"].values():
        assert run["configs"] and all(0 <= c["parsed"] <= 1 for c in run["configs"])
        assert set(run["kl"]["parsed"]) == {"rl", "sft"}
    assert all(0 <= r[s]["parsed"] <= 1 for r in out["kl"]["trajectory"] for s in ("rl", "sft"))
    assert all(0 <= r["parsed"] <= 1 for r in out["eval"]["tasks"])


def test_the_report_shows_every_result_of_the_run_and_the_kl_values_it_holds(trial):
    from test_report_kinds import _drawn

    from graftkit.evaluation.kl import KLResult

    root, out = trial
    run = root / "run"
    page = (run / "report.html").read_text()
    assert {"kl", "grafts", "anatomy", "success", "rank"} <= set(out["report"]["sections"])
    drawn = _drawn(page)
    files = sorted(str(p.relative_to(run)) for p in (run / "results").glob("*.h5"))
    assert len(files) >= 6
    for name in files:
        assert name in drawn, f"{name} appears in no figure or table of the report"
    # the KL figures carry the numbers of each kl result
    from test_report import _section_figures

    values = set()

    def walk(x):
        if isinstance(x, float):
            values.add(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict) and "bdata" in x:  # plotly's typed array: base64 of the values
            import base64

            values.update(float(v) for v in np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"]).ravel())
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    for fig in _section_figures(page, "kl"):
        walk([trace for trace in fig["data"]])
    for row in out["kl"]["trajectory"]:
        view = KLResult.read(root / row["file"])
        for side in ("rl", "sft"):
            estimate = view.summary(side, "problems", "token")[0]
            assert any(abs(v - estimate) <= 1e-12 * abs(estimate) for v in values), (row["step"], side, estimate)


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium and chromium-driver")
def test_the_report_renders_in_chromium(trial):
    from graftkit.figures.browser import chromium, wait_rendered

    root, out = trial
    driver = chromium()
    try:
        driver.get((root / "run" / "report.html").resolve().as_uri())
        assert wait_rendered(driver) == out["report"]["figures"] > 10
        drawn = driver.execute_script("""
            return Array.from(document.querySelectorAll('#kl .graph')).map(function (g) {
              return g.querySelectorAll('.cartesianlayer .trace').length; });""")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()
    assert drawn and all(n > 0 for n in drawn) and severe == []
