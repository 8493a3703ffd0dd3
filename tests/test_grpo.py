"""The SFT and GRPO trainers: outputs, variants, bad input, and exact resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from graftkit.core.errors import GraftkitError
from graftkit.weights.runs import rl_checkpoints
from graftkit.train.grpo import GRPOConfig, latest_checkpoint, run_grpo
from graftkit.train.sft import SFTConfig, run_sft
from graftkit.weights import open_checkpoint, recorded_base

TASKS = ("click-button", "enter-text")


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "sft"
    cfg = SFTConfig(out=str(out), budgets={"click-button": 30, "enter-text": 30}, size="nano", steps=40,
                    batch_size=16, lr=3e-3, warmup=5, threads=1)
    return run_sft(cfg)


def _cfg(sft: Path, out: Path, **kw) -> GRPOConfig:
    base = dict(init=str(sft), out=str(out), tasks=TASKS, steps=4, prompts_per_step=2, group_size=4,
                max_new_tokens=12, lr=3e-4, threads=1)
    return GRPOConfig(**{**base, **kw})


def _tensors(folder: Path) -> dict[str, bytes]:
    ck = open_checkpoint(folder)
    return {n: ck.array(n).tobytes() for n in ck.names}


def test_sft_output_is_a_loadable_policy_with_provenance_and_log(sft):
    from graftkit.weights import load_model

    model, tok = load_model(sft)
    prov = json.loads((sft / "graftkit.json").read_text())
    assert prov["producer"] == "graftkit train sft" and prov["config"]["steps"] == 40
    log = [json.loads(x) for x in (sft / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 40 and log[-1]["loss"] < log[0]["loss"]


def test_grpo_writes_a_policy_that_names_its_sft_parent(sft, tmp_path):
    out = run_grpo(_cfg(sft, tmp_path / "rl", steps=2))
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["producer"] == "graftkit train grpo"
    assert recorded_base(out) == Path(prov["base_model"]["path"]) == sft.resolve()
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    for key in ("reward", "success", "clip_frac_low", "clip_frac_high", "frac_reward_zero_std", "entropy",
                "grad_norm", "lr", "tokens", "staleness", "seconds"):
        assert key in log[-1], key
    assert set(_tensors(out)) == set(_tensors(sft))


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo", "cispo", "gspo"])
def test_every_loss_type_trains(sft, tmp_path, loss):
    extra = {"epsilon_high": 5.0} if loss == "cispo" else {}
    out = run_grpo(_cfg(sft, tmp_path / loss, steps=1, beta=0.05, **extra))
    log = json.loads((out / "train_log.jsonl").read_text().splitlines()[-1])
    assert torch.isfinite(torch.tensor(log["loss"])) and "kl_k3_mean" in log


def test_variants_log_their_statistics(sft, tmp_path):
    out = run_grpo(_cfg(sft, tmp_path / "mu", steps=4, stages=2, epsilon_high=0.4, veto_epsilon=0.05,
                        focal_gamma=2.0, verigate=True))
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [m["staleness"] for m in log] == [0, 1, 0, 1]
    assert [m["gen_seconds"] > 0 for m in log] == [True, False, True, False]
    assert all("veto_frac" in m and "focal_weight_mean" in m for m in log)
    assert all(abs(m["verigate_outcome"] + m["verigate_process"] + m["verigate_none"] - 1) < 1e-9 for m in log)


def test_a_clipping_range_binds_only_off_policy(tmp_path):
    """With one update per batch every ratio is 1, so two clipping ranges train the same weights bit for bit (why
    the study's clip variants take two updates per batch); with two, the second update's ratios leave the tighter
    range, the clip fractions say so, and the weights differ."""
    from graftkit.study.design import EMBEDDED_SFT, REGIMES

    def run(name, **kw):  # the study's policy and degrade recipe, where rewards vary within groups
        out = run_grpo(_cfg(EMBEDDED_SFT, tmp_path / name, tasks=("click-tab",), steps=2, group_size=8,
                            max_new_tokens=24, lr=REGIMES["degrade"], temperature=1.5, **kw))
        return _tensors(out), [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]

    one_wide, _ = run("mu1-wide", epsilon=0.2)
    one_tight, log = run("mu1-tight", epsilon=0.01, epsilon_high=0.01)
    assert all(m["grad_norm"] > 0 for m in log)  # there was something to learn
    assert one_wide == one_tight and all(m["clip_frac_low"] == m["clip_frac_high"] == 0 for m in log)
    two_wide, _ = run("mu2-wide", epsilon=0.2, num_iterations=2)
    two_tight, log = run("mu2-tight", epsilon=0.01, epsilon_high=0.01, num_iterations=2)
    assert two_wide != two_tight and two_wide != one_wide
    assert any(m["clip_frac_low"] + m["clip_frac_high"] > 0 for m in log)


@pytest.mark.parametrize("kw, message", [
    ({"lr": 0.0}, "--lr"), ({"lr": -1e-3}, "--lr"), ({"group_size": 1}, "--group-size"),
    ({"loss": "ppo"}, "unknown --loss"), ({"stages": 3}, "--stages 3 must divide"),
    ({"tasks": ("nope",)}, "unknown task"),
])
def test_bad_config_is_one_clear_error(sft, tmp_path, kw, message):
    with pytest.raises(GraftkitError, match=message):
        _cfg(sft, tmp_path / "x", **kw)


def test_init_whose_tokenizer_does_not_fit_the_tasks(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from graftkit.weights import save_model

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[EOS]", "click", "(", ")", "1"])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]")
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=7, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    bad = save_model(tmp_path / "bad", model, tok, provenance={})
    with pytest.raises(GraftkitError, match="tokenizer does not fit the task"):
        run_grpo(_cfg(bad, tmp_path / "rl", steps=1))


def test_existing_output_needs_force_or_resume(sft, tmp_path):
    cfg = _cfg(sft, tmp_path / "rl", steps=1)
    run_grpo(cfg)
    with pytest.raises(GraftkitError, match="--force"):
        run_grpo(cfg)


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical_to_an_uninterrupted_run(sft, tmp_path):
    cfg = _cfg(sft, tmp_path / "straight", steps=6, checkpoint_every=1)
    straight = run_grpo(cfg)

    killed = replace(cfg, out=str(tmp_path / "killed"))
    args = ["train", "grpo", "--init", killed.init, "--out", killed.out, "--tasks", ",".join(TASKS),
            "--steps", "6", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "12",
            "--lr", "3e-4", "--threads", "1", "--checkpoint-every", "1"]
    # The command line's run, held once its step-3 checkpoint is written (it says so on stdout, then waits on
    # stdin), so the kill falls mid-run however fast the machine: no polling, no race with the last step.
    held = ("import functools, sys\n"
            "from graftkit.train import grpo\n"
            "def hold(folder):\n"
            "    if folder.name == 'step-000003':\n"
            "        print('held after', folder.name, flush=True)\n"
            "        sys.stdin.read()\n"
            "        raise SystemExit('released, not killed')\n"
            "grpo.run_grpo = functools.partial(grpo.run_grpo, on_checkpoint=hold)\n"
            "from graftkit.cli import main; main()\n")
    with open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", held, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
        if not any(line.startswith("held after step-000003") for line in proc.stdout):  # until held, or the end
            proc.wait()
            pytest.fail(f"training ended before its step-3 checkpoint: {(tmp_path / 'stderr.txt').read_text()[-2000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not Path(killed.out).exists(), "killed before the end: no final model"
    assert latest_checkpoint(killed) == rl_checkpoints(killed.out) / "step-000003"

    with pytest.raises(GraftkitError, match="different config"):
        run_grpo(replace(killed, lr=1e-4), resume=True)
    resumed = run_grpo(killed, resume=True)
    assert _tensors(resumed) == _tensors(straight)
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if "seconds" not in k}
                          for x in (path / "train_log.jsonl").read_text().splitlines()]
    assert strip(resumed) == strip(straight)


def _grid(tmp_path: Path, sft: Path, body: str) -> Path:
    g = tmp_path / "grid.yaml"
    g.write_text(f"out: runs\ninits:\n  sft: {sft}\n" + body)
    return g


def test_sweep_expands_product_then_runs_with_names(sft, tmp_path):
    from graftkit.train.sweep import expand

    g = _grid(tmp_path, sft, "base: {init: sft, steps: 2, tasks: click-button}\n"
                             "product: {lr: [1.0e-4, 1.0e-3], seed: [0, 1]}\n"
                             "runs:\n  - {name: kl, beta: 0.1}\n")
    specs = expand(g)
    assert [s.name for s in specs] == ["lr1e-04_seed0", "lr1e-04_seed1", "lr1e-03_seed0", "lr1e-03_seed1", "kl"]
    assert specs[1].config.seed == 1 and specs[2].config.lr == 1e-3 and specs[4].config.beta == 0.1
    assert all(s.config.init == str(sft) and s.config.tasks == ("click-button",) for s in specs)
    assert specs[0].config.out == str(tmp_path / "runs" / "lr1e-04_seed0")


@pytest.mark.parametrize("body, message", [
    ("base: {init: sft}\nruns:\n  - {name: a, lr: 0.1, nonsense: 1}\n", "unknown setting"),
    ("base: {init: sft}\nruns:\n  - {name: a}\n  - {name: a}\n", "two runs are named a"),
    ("runs:\n  - {name: a}\n", "has no init"),
    ("base: {init: sft}\n", "no runs"),
    ("base: {init: sft}\nruns:\n  - {name: a, lr: -1}\n", "--lr"),
    ("bogus: 1\n", "unknown key"),
    ("base: {init: sft}\nruns:\n  - {name: a, trainer: trl}\n", "a sweep trains with graftkit's own trainer"),
    ("base: {init: sft}\nruns:\n  - {name: a, engine: trl}\n", "the training backend is --trainer"),
])
def test_bad_grid_is_one_clear_error(sft, tmp_path, body, message):
    from graftkit.train.sweep import expand

    with pytest.raises(GraftkitError, match=message):
        expand(_grid(tmp_path, sft, body))


def test_sweep_skips_done_and_resumes_partial_runs(sft, tmp_path):
    from graftkit.train.sweep import expand, run_sweep

    g = _grid(tmp_path, sft, "base: {init: sft, steps: 2, tasks: click-button, prompts_per_step: 1, "
                             "group_size: 2, max_new_tokens: 8, checkpoint_every: 1}\n"
                             "runs:\n  - {name: a}\n  - {name: b, seed: 1}\n")
    a, b = expand(g)
    run_grpo(a.config)  # a is complete
    run_grpo(replace(b.config, steps=2), force=True)
    # make b partial: keep only its first checkpoint
    import shutil

    shutil.rmtree(b.config.out)
    assert [a.status(), b.status()] == ["done", "partial"]
    records = run_sweep([a, b])
    assert [r["status"] for r in records] == ["done", "partial"]
    assert [a.status(), b.status()] == ["done", "done"]


def test_paper18_grid_has_eighteen_runs_over_the_study_axes():
    from graftkit.train.sweep import expand

    specs = expand(Path(__file__).resolve().parents[1] / "grids" / "paper18.yaml")
    assert len(specs) == 18
    cfgs = [s.config for s in specs]
    assert len({c.lr for c in cfgs}) >= 3 and len({c.seed for c in cfgs}) == 6
    assert len({c.init for c in cfgs}) == 2 and len({c.beta for c in cfgs}) >= 3
    assert len({(c.epsilon, c.eps_high) for c in cfgs}) >= 3


def test_sweep_dry_run_cli_prints_specs_and_runs_nothing(sft, tmp_path):
    from typer.testing import CliRunner

    from graftkit.cli import app

    g = _grid(tmp_path, sft, "base: {init: sft, steps: 2}\nproduct: {lr: [1.0e-4, 1.0e-3]}\n")
    res = CliRunner().invoke(app, ["sweep", str(g), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)["runs"]
    assert [r["name"] for r in runs] == ["lr1e-04", "lr1e-03"] and all(r["status"] == "new" for r in runs)
    assert not (tmp_path / "runs").exists()


def test_shared_prefix_logits_equal_the_plain_computation_values_and_gradients():
    from graftkit.agent import Decode, next_token_logits, rollout, task_words, tiny_policy
    from graftkit.train.grpo import episode_rows, shared_prefix_logits

    pol = tiny_policy(task_words(), "nano", seed=0)
    jobs = [(t, s, k) for t, s in (("click-button", 5), ("enter-text", 7)) for k in range(4)]
    rows = episode_rows(rollout(pol, jobs, Decode(greedy=False, max_new_tokens=6, seed=3), max_turns=1), pol.pad_id)
    assert len(set(rows.prompts)) == 2 < len(rows.prompts)
    model = pol.model.train()
    plain = next_token_logits(model, rows.ids, rows.attn, rows.select)
    shared = shared_prefix_logits(model, rows)
    assert plain.shape == shared.shape and (plain - shared).abs().max() < 1e-5
    params = [p for p in model.parameters() if p.requires_grad]
    g1 = torch.autograd.grad(plain.logsumexp(-1).sum(), params)
    g2 = torch.autograd.grad(shared.logsumexp(-1).sum(), params)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_train_grpo_cli_writes_policy_json_and_training_curves(sft, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from graftkit.cli import app
    from graftkit.results.store import read_result

    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    res = CliRunner().invoke(app, ["train", "grpo", "--init", str(sft), "--out", str(tmp_path / "rl"),
                                   "--tasks", "click-button", "--steps", "2", "--prompts-per-step", "1",
                                   "--group-size", "2", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    curves = read_result(info["curves"])
    assert curves.kind == "train-grpo" and list(curves.coords["step"]) == [1, 2]
    assert {"loss", "success", "entropy", "clip_frac_low", "seconds"} <= set(curves.data)
    bad = CliRunner().invoke(app, ["train", "grpo", "--init", str(sft), "--out", str(tmp_path / "rl2"),
                                   "--group-size", "1"])
    assert bad.exit_code == 2 and "--group-size 1 must be ≥ 2" in bad.stderr


@pytest.mark.parametrize("backend", ["trl", "graftkit"])
def test_train_grpo_engine_naming_a_trainer_is_one_line_naming_trainer(tmp_path, backend):
    """``--engine`` is what generates the rollouts (hf, vllm, auto) in train grpo as everywhere; the training
    backend, once ``--engine graftkit|trl``, is ``--trainer``."""
    from typer.testing import CliRunner

    from graftkit.cli import app

    res = CliRunner().invoke(app, ["train", "grpo", "--init", str(tmp_path / "sft"), "--out", str(tmp_path / "rl"),
                                   "--engine", backend])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --engine") and "--trainer graftkit|trl" in lines[0], lines
    assert not (tmp_path / "rl").exists()


def test_trainer_and_engine_defaults_and_choices():
    cfg = GRPOConfig(init="sft", out="rl")
    assert (cfg.trainer, cfg.engine, cfg.engine_name, cfg.vllm_mode, cfg.trl_vllm_mode) == (
        "graftkit", "hf", "hf", None, None)
    assert {"trainer", "engine", "vllm_mode", "vllm_server"} <= set(cfg.as_dict())
    assert not {"rollout_engine", "vllm"} & set(cfg.as_dict())
    with pytest.raises(GraftkitError, match="--trainer 'vllm' is not an option"):
        GRPOConfig(init="sft", out="rl", trainer="vllm")
    with pytest.raises(GraftkitError, match="--vllm-mode and --vllm-server need --trainer trl --engine vllm"):
        GRPOConfig(init="sft", out="rl", vllm_mode="colocate")  # --vllm-mode without --engine vllm
    with pytest.raises(GraftkitError, match="--vllm-mode and --vllm-server need --trainer trl --engine vllm"):
        GRPOConfig(init="sft", out="rl", trainer="trl", vllm_mode="server")  # --trainer trl, --engine hf
    with pytest.raises(GraftkitError, match="--trainer graftkit for Mu-GRPO"):
        GRPOConfig(init="sft", out="rl", trainer="trl", stages=2)


def _old_record(config: dict, **old) -> dict:
    """``config`` (a GRPOConfig's as_dict) as a run recorded it before --trainer: engine graftkit|trl,
    rollout_engine, vllm."""
    rec = {k: v for k, v in config.items() if k not in ("trainer", "engine", "vllm_mode")}
    return {**rec, **{"engine": "graftkit", "rollout_engine": "hf", "vllm": None, **old}}


def test_an_older_recorded_config_reads_in_todays_names():
    from graftkit.train.configs import recorded_grpo

    now = GRPOConfig(init="sft", out="rl").as_dict()
    assert recorded_grpo(_old_record(now)) == now
    assert recorded_grpo(now) == now  # today's record is left as it is
    trl = GRPOConfig(init="sft", out="rl", trainer="trl").as_dict()
    assert recorded_grpo(_old_record(trl, engine="trl")) == trl
    old_vllm = recorded_grpo(_old_record(now, rollout_engine="vllm"))
    assert (old_vllm["trainer"], old_vllm["engine"], old_vllm["vllm_mode"]) == ("graftkit", "vllm", None)
    old_trl = recorded_grpo(_old_record(now, engine="trl", vllm="server", vllm_server="h:1"))
    assert (old_trl["trainer"], old_trl["engine"], old_trl["vllm_mode"], old_trl["vllm_server"]) == (
        "trl", "vllm", "server", "h:1")
    # a record from before rollout_engine existed: the trainer alone
    assert recorded_grpo({"engine": "graftkit", "lr": 1e-4}) == {"lr": 1e-4, "trainer": "graftkit", "engine": "hf",
                                                                 "vllm_mode": None}


def test_resume_and_curves_read_a_checkpoint_recorded_before_trainer(sft, tmp_path):
    """A checkpoint whose graftkit.json records engine: graftkit and rollout_engine: hf resumes under today's
    config (the same settings), and its training curves carry the record in today's names."""
    from graftkit.train.commands import training_curves
    from graftkit.train.grpo import restore, setup

    cfg = _cfg(sft, tmp_path / "rl", steps=2, checkpoint_every=1)
    out = run_grpo(cfg)
    ckpt = rl_checkpoints(cfg.out) / "step-000001"
    for folder in (ckpt, out):
        prov_path = folder / "graftkit.json"
        prov = json.loads(prov_path.read_text())
        assert prov["config"] == cfg.as_dict()
        prov["config"] = _old_record(prov["config"])
        prov_path.write_text(json.dumps(prov))
    assert latest_checkpoint(cfg) == ckpt  # the final step writes the policy, not a checkpoint
    tr = setup(cfg)
    step, log = restore(tr, resume=True, force=True)
    assert step == 1 and [m["step"] for m in log] == [1]
    with pytest.raises(GraftkitError, match="differs in engine"):  # the old record's rollout engine is read too
        prov = json.loads((ckpt / "graftkit.json").read_text())
        (ckpt / "graftkit.json").write_text(json.dumps({**prov, "config": _old_record(cfg.as_dict(),
                                                                                       rollout_engine="vllm")}))
        restore(setup(cfg), resume=True, force=True)
    curves = training_curves(out, "grpo")
    assert curves.attrs["config"] == cfg.as_dict()
