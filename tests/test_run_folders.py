"""Run folders and result keys: `--run DIR` on the commands that write results, labels that name a
trainer's run (not just its `checkpoint-N`), and no result of one model ever replaced by another's."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planted import planted_pair  # noqa: E402

from graftkit.cli import app  # noqa: E402
from graftkit.results.layout import current_run, result_labels  # noqa: E402
from graftkit.results.store import Result, read_result, subject, write_result  # noqa: E402


def _result(sha: str | None, value: float = 1.0) -> Result:
    import numpy as np

    attrs = {"model": {"path": f"/m/{sha}", "kind": "hf", "fingerprint": f"blake3:{sha}"}} if sha else {}
    return Result("eval", {"x": np.arange(2)}, {"v": (("x",), np.full(2, value))}, attrs)


def test_trainer_step_folders_are_labelled_with_their_run(tmp_path):
    a, b = tmp_path / "grpo-full" / "checkpoint-6", tmp_path / "grpo-lora" / "checkpoint-6"
    assert result_labels([a, b]) == ["grpo-full-checkpoint-6", "grpo-lora-checkpoint-6"]
    assert result_labels([a]) == ["grpo-full-checkpoint-6"]
    assert result_labels([tmp_path / "run" / "global_step500", tmp_path / "run" / "final"]) == \
        ["run-global_step500", "run-final"]
    assert result_labels([tmp_path / "sft", tmp_path / "x" / "sft"]) == ["sft", "x-sft"]  # a telling name stays


def test_a_result_of_another_model_is_never_replaced(tmp_path):
    path = tmp_path / "eval-checkpoint-6-greedy.h5"
    assert write_result(path, _result("aa" * 32, 1.0)) == path
    before = path.read_bytes()
    other = write_result(path, _result("bb" * 32, 2.0))
    assert other != path and other.parent == path.parent and other.name.startswith("eval-checkpoint-6-greedy-")
    assert path.read_bytes() == before  # the first model's result is untouched
    assert float(read_result(other)["v"][0]) == 2.0 and subject(read_result(other).attrs) == ("blake3:" + "bb" * 32,)
    assert write_result(path, _result("bb" * 32, 3.0)) == other  # that model again: its own file, replaced
    assert float(read_result(other)["v"][0]) == 3.0
    assert write_result(path, _result("aa" * 32, 4.0)) == path  # the same model again: replaced in place
    assert float(read_result(path)["v"][0]) == 4.0


def test_subject_reads_fingerprints_and_single_file_sha256():
    attrs = {"parents": [{"role": "base", "path": "/b", "fingerprint": "blake3:" + "1" * 64},
                         {"role": "source", "path": "/s.gguf", "sha256": "2" * 64}],
             "config": {"path": "/x"}, "note": {"fingerprint": "blake3:" + "3" * 64}}  # no path: no checkpoint
    assert subject(attrs) == ("blake3:" + "1" * 64, "sha256:" + "2" * 64)


def test_the_default_run_is_the_current_one_else_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    assert current_run() == tmp_path / "runs"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / ".current").write_text(str(tmp_path / "runs" / "study") + "\n")
    assert current_run() == tmp_path / "runs" / "study"
    assert current_run(tmp_path / "mine") == tmp_path / "mine"


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    """Two trainers' output folders, each with a `checkpoint-6` of a different model."""
    root = tmp_path_factory.mktemp("trainers")
    out = []
    for i, name in enumerate(("grpo-full", "grpo-lora")):
        sft, rl = planted_pair(root / name, seed=i)
        shutil.move(rl, root / name / "checkpoint-6")
        out.append(root / name / "checkpoint-6")
    return out


def _cli(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.slow
def test_two_trainers_checkpoint_6_never_share_a_result(tmp_path, monkeypatch, trainers):
    a, b = trainers
    ep = ("--tasks", "click-tab", "--seeds", "1", "--episodes", "1")
    for ck in (a, b):
        _cli(tmp_path, monkeypatch, "eval", "--model", ck, *ep)
    results = tmp_path / "runs" / "results"
    names = sorted(p.name for p in results.glob("eval-*.h5"))
    assert names == ["eval-grpo-full-checkpoint-6-greedy.h5", "eval-grpo-lora-checkpoint-6-greedy.h5"]
    models = {read_result(results / n).attrs["model"]["path"] for n in names}
    assert models == {str(a.resolve()), str(b.resolve())}
    # even one --save for both: the second model's result goes beside the first, which stays
    _cli(tmp_path, monkeypatch, "eval", "--model", a, *ep, "--save", tmp_path / "same.h5")
    _cli(tmp_path, monkeypatch, "eval", "--model", b, *ep, "--save", tmp_path / "same.h5")
    kept = sorted(p.name for p in tmp_path.glob("same*.h5"))
    assert len(kept) == 2 and read_result(tmp_path / "same.h5").attrs["model"]["path"] == str(a.resolve())


@pytest.mark.slow
def test_run_option_puts_every_result_in_that_run(tmp_path, monkeypatch, trainers):
    a, _ = trainers
    run = tmp_path / "study-7"
    _cli(tmp_path, monkeypatch, "eval", "--model", a, "--tasks", "click-tab", "--seeds", "1", "--episodes", "1",
         "--run", run)
    _cli(tmp_path, monkeypatch, "headroom", "--model", a, "--tasks", "click-tab", "--seeds", "1", "--episodes", "1",
         "--k", "2", "--run", run)
    _cli(tmp_path, monkeypatch, "rank", "--model", a, "--run", run)
    _cli(tmp_path, monkeypatch, "train", "sft", "--out", tmp_path / "sft-x", "--tasks", "click-tab", "--size",
         "nano", "--steps", "2", "--batch-size", "2", "--run", run)
    _cli(tmp_path, monkeypatch, "train", "grpo", "--init", tmp_path / "sft-x", "--out", tmp_path / "rl-x", "--tasks",
         "click-tab", "--steps", "1", "--prompts-per-step", "1", "--group-size", "2", "--run", run)
    written = sorted(p.name.split("-")[0] for p in (run / "results").glob("*.h5"))
    assert written == ["eval", "headroom", "rank", "train", "train"]
    assert (run / "results" / "train-grpo-rl-x.h5").is_file()
    assert not (tmp_path / "runs").exists()  # nothing went to the default run


# ------------------------------------------------------------------------------ trainer output folders

@pytest.fixture(scope="module")
def trl(tmp_path_factory):
    """A GRPOTrainer-shaped output_dir over a tiny SFT model (checkpoint-2, -4, -6 with pickles beside)."""
    from trl_shapes import trl_run

    root = tmp_path_factory.mktemp("trl")
    sft, _ = planted_pair(root / "base")
    return {"sft": sft, "out": trl_run(root / "grpo-out", sft)}


def test_a_trainer_output_dir_is_recognised_and_its_checkpoints_listed(trl):
    from graftkit.weights.resolve import checkpoint_of, checkpoints_of
    from graftkit.weights.runs import trainer_log, trainer_run

    run = trainer_run(trl["out"])
    assert run.steps == (2, 4, 6) and run.last == trl["out"] / "checkpoint-6"
    assert run.state == trl["out"] / "checkpoint-6" / "trainer_state.json"
    assert checkpoints_of(trl["out"]) == [trl["out"] / "checkpoint-6"] and checkpoint_of(trl["out"]) == run.last
    assert checkpoints_of(trl["out"], all_checkpoints=True) == [trl["out"] / f"checkpoint-{s}" for s in (2, 4, 6)]
    assert checkpoint_of(trl["out"] / "checkpoint-4") == trl["out"] / "checkpoint-4"  # a checkpoint is itself
    assert trainer_run(trl["out"] / "checkpoint-4") is None and trainer_run(trl["sft"]) is None
    log = trainer_log(run.state)
    assert [r["step"] for r in log][:3] == [1, 2, 3] and log[0]["reward"] == pytest.approx(0.3)


def test_all_checkpoints_of_a_folder_that_is_no_run_is_one_clear_error(trl):
    from graftkit.core.errors import GraftkitError
    from graftkit.weights.resolve import checkpoints_of

    with pytest.raises(GraftkitError, match="not a trainer output_dir"):
        checkpoints_of(trl["sft"], all_checkpoints=True)


def test_trainer_state_becomes_training_curves(trl, tmp_path):
    import numpy as np

    from graftkit.train.commands import TrainingCurves, trainer_curves

    c = trainer_curves(trl["out"])
    assert c.kind == "trainer" and c.label == "grpo-out" and list(c.steps) == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(c.values("reward"), [0.2 + 0.1 * s for s in range(1, 7)])
    np.testing.assert_allclose(c.values("kl_k3_mean"), [0.001 * s for s in range(1, 7)])  # TRL's kl: the k3 mean
    assert c.has("completions.mean_length") and c.has("clip_frac_low") and not c.has("train_runtime")
    eval_loss = c.values("eval_loss")
    assert np.isnan(eval_loss[:5]).all() and eval_loss[5] == 0.5  # logged at one step only
    back = TrainingCurves.from_result(read_result(write_result(tmp_path / "c.h5", c.result)))
    np.testing.assert_array_equal(back.values("reward"), c.values("reward"))


def test_commands_take_a_trainer_output_dir_as_its_last_checkpoint(tmp_path, monkeypatch, trl):
    """Every pickle beside the weights is bytes that are no pickle: reading one would fail the command."""
    import json

    info = json.loads(_cli(tmp_path, monkeypatch, "inspect", trl["out"], "--json").stdout)
    assert info["path"].endswith("checkpoint-6") and list(info["checkpoints"]) == ["2", "4", "6"]
    assert "checkpoints at steps 2, 4, 6" in _cli(tmp_path, monkeypatch, "inspect", trl["out"]).stdout
    _cli(tmp_path, monkeypatch, "eval", "--model", trl["out"], "--tasks", "click-tab", "--seeds", "1", "--episodes", "1")
    _cli(tmp_path, monkeypatch, "rank", "--model", trl["out"])
    names = sorted(p.name for p in (tmp_path / "runs" / "results").glob("*.h5"))
    assert names == ["eval-grpo-out-checkpoint-6-greedy.h5", "rank-weights-grpo-out-checkpoint-6.h5"], names


def test_delta_over_a_trainer_run_is_its_trajectory_and_the_report_draws_it(tmp_path, monkeypatch, trl):
    import json

    import numpy as np

    from graftkit.graft.anatomy import DeltaResult

    out = json.loads(_cli(tmp_path, monkeypatch, "delta", "--base", trl["sft"], "--from", trl["out"],
                          "--all-checkpoints", "--json").stdout)
    results = tmp_path / "runs" / "results"
    d = DeltaResult.from_result(read_result(results / "delta-grpo-out-trajectory.h5"))
    assert d.runs == [f"grpo-out-checkpoint-{s}" for s in (2, 4, 6)] and d.result.attrs["steps"] == [2, 4, 6]
    attn = [float(d.group("rel_delta", r)[d.groups.index("attn")]) for r in range(3)]
    assert attn[0] < attn[1] < attn[2]  # each checkpoint moved further from the base
    np.testing.assert_allclose(np.array(attn) / attn[0], [1, 2, 3], rtol=1e-3)  # by 1e-3 × step of one direction
    assert float(d.group("rel_delta", 0)[d.groups.index("embed")]) == 0.0  # the trainer never moved the embedding
    assert set(out["runs"]) == set(d.runs)
    curves = read_result(results / "train-trainer-grpo-out.h5")
    assert curves.kind == "train-trainer" and "reward" in curves.data
    # one checkpoint: --from OUTPUT_DIR alone is the last
    _cli(tmp_path, monkeypatch, "delta", "--base", trl["sft"], "--from", trl["out"])
    last = DeltaResult.from_result(read_result(results / "delta-grpo-out-checkpoint-6.h5"))
    np.testing.assert_array_equal(last.group("fro_delta", 0), d.group("fro_delta", 2))
    rep = json.loads(_cli(tmp_path, monkeypatch, "report", tmp_path / "runs", "--json").stdout)
    html = Path(rep["path"]).read_text()
    assert "Where the weights moved, when" in html and "trainer_state.json" in html


def test_graft_takes_a_trainer_output_dir_as_its_last_checkpoint(tmp_path, monkeypatch, trl):
    from graftkit.weights import open_checkpoint

    out = tmp_path / "g"
    _cli(tmp_path, monkeypatch, "graft", "--base", trl["sft"], "--from", trl["out"], "--groups", "all", "--out", out)
    g, last = open_checkpoint(out), open_checkpoint(trl["out"] / "checkpoint-6")
    for name in last.metas:
        assert g.read(name).equal(last.read(name)), name  # graft(all) of the run is its last checkpoint, exactly


@pytest.fixture(scope="module")
def others(tmp_path_factory, trl):
    """An SFTTrainer run and a GRPOTrainer + PEFT LoRA run over the same SFT model."""
    from trl_shapes import sft_trainer_run, trl_lora_run

    root = tmp_path_factory.mktemp("others")
    return {"sft-run": sft_trainer_run(root / "sft-out", trl["sft"]), "lora-run": trl_lora_run(root / "lora-out", trl["sft"])}


@pytest.mark.slow
def test_every_command_on_a_lora_and_an_sft_trainer_run_and_nothing_is_overwritten(tmp_path, monkeypatch, trl, others):
    import json

    from graftkit.graft.anatomy import DeltaResult

    sft, lora, sftrun = trl["sft"], others["lora-run"], others["sft-run"]
    ep = ("--tasks", "click-tab", "--seeds", "1", "--episodes", "1")
    for out in (lora, sftrun, trl["out"]):
        _cli(tmp_path, monkeypatch, "inspect", out)
        _cli(tmp_path, monkeypatch, "delta", "--base", sft, "--from", out, "--all-checkpoints")
        _cli(tmp_path, monkeypatch, "eval", "--model", out, *ep)
        _cli(tmp_path, monkeypatch, "rank", "--model", out, "--what", "delta", "--base", sft)
        _cli(tmp_path, monkeypatch, "graft", "--base", sft, "--from", out, "--groups", "attn",
             "--out", tmp_path / f"g-{out.name}")
    results = tmp_path / "runs" / "results"
    names = sorted(p.name for p in results.glob("*.h5"))
    for out, last in ((lora, 4), (sftrun, 6), (trl["out"], 6)):
        lab = f"{out.name}-checkpoint-{last}"
        for name in (f"delta-{out.name}-trajectory.h5", f"eval-{lab}-greedy.h5", f"rank-delta-{lab}.h5",
                     f"train-trainer-{out.name}.h5"):
            assert name in names, (name, names)
    assert not [n for n in names if re.search(r"-[0-9a-f]{8}\.h5$", n)]  # no two models met on one file name
    d = DeltaResult.from_result(read_result(results / "delta-lora-out-trajectory.h5"))
    assert d.result.attrs["steps"] == [2, 4] and d.runs == ["lora-out-checkpoint-2", "lora-out-checkpoint-4"]
    rank = read_result(results / "rank-delta-lora-out-checkpoint-4.h5")
    k = list(rank.coords["metric"]).index("numerical_rank")
    got = {str(t): float(rank["value"][i, k]) for i, t in enumerate(rank.coords["tensor"])}
    moved = {t: v for t, v in got.items() if t.endswith(("q_proj.weight", "v_proj.weight"))}
    assert moved and set(moved.values()) == {4.0}  # the merged rank-4 adapter reads 4
    assert {v for t, v in got.items() if t not in moved} <= {0.0}
    curves = read_result(results / "train-trainer-sft-out.h5")
    assert "mean_token_accuracy" in curves.data and "reward" not in curves.data
    rep = json.loads(_cli(tmp_path, monkeypatch, "report", tmp_path / "runs", "--json").stdout)
    assert "anatomy" in rep["sections"] and "training" in rep["sections"]
