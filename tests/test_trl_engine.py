"""``train grpo --trainer trl``: TRL's GRPOTrainer with graftkit's episodes as its rollout function."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from importlib.util import find_spec
from types import SimpleNamespace

import pytest
import torch

from graftkit.agent import Decode, Episode, Policy, Turn, load_policy, rollout
from graftkit.core.errors import GraftkitError
from graftkit.train.grpo import GRPOConfig, _prompts
from graftkit.train.trl_engine import (
    dataset_rows, episode_key, flatten_episode, log_row, make_rollout, run_grpo_trl, trl_args,
)
from graftkit.weights import load_model
from graftkit.weights.hf import stored_dtype

# found, not imported: collecting this module does not load TRL (its tests do)
pytestmark = pytest.mark.skipif(find_spec("trl") is None, reason="TRL is not installed (the trl extra)")

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("click-button", "click-link")


@pytest.fixture(scope="module")
def sft():
    """The default recipe's SFT policy (assets/sft): its sampled episodes on these tasks succeed and fail."""
    return ROOT / "assets" / "sft"


def _cfg(sft: Path, out: Path, **kw) -> GRPOConfig:
    base = dict(init=str(sft), out=str(out), tasks=TASKS, steps=2, prompts_per_step=2, group_size=4,
                max_new_tokens=12, lr=3e-3, threads=1, trainer="trl", device="cpu")
    return GRPOConfig(**{**base, **kw})


@pytest.mark.slow
def test_two_trl_steps_write_a_policy_graftkit_loads(sft, tmp_path):
    cfg = _cfg(sft, tmp_path / "rl", beta=0.05, save_dtype="bfloat16")
    out = run_grpo_trl(cfg)
    assert out == tmp_path / "rl" and not (tmp_path / "rl.trl").exists()
    policy = load_policy(out)
    assert isinstance(policy, Policy) and stored_dtype(out) == torch.bfloat16
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["producer"].startswith("graftkit train grpo --trainer trl (trl 1.")
    assert prov["config"] == cfg.as_dict() and prov["step"] == 2 and prov["processes"] == 1
    assert prov["parents"][0]["role"] == "sft" and prov["base_model"]["path"] == str(sft.resolve())
    assert prov["precision"]["saved_dtype"] == "bfloat16" and prov["precision"]["compute_dtype"] == "float32"
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    for key in ("loss", "reward", "success", "frac_reward_zero_std", "kl_k3_mean", "entropy", "clip_frac_low",
                "clip_frac_high", "grad_norm", "lr", "tokens", "episodes", "gen_seconds", "seconds"):
        assert key in log[-1], key
    assert log[0]["episodes"] == 8 and log[0]["lr"] == 3e-3 and log[1]["seconds"] > log[0]["seconds"]
    items = (out / "train_items.tsv").read_text().splitlines()
    assert items == [f"{t}\t{i}" for s in range(2) for t, _, i in _prompts(cfg, s)]
    base, rl = load_model(sft)[0].state_dict(), policy.model.state_dict()
    assert set(base) == set(rl)
    moved = [n for n in base if not torch.equal(base[n].bfloat16().float(), rl[n])]
    assert any(r["frac_reward_zero_std"] < 1 for r in log) and moved


def test_a_planted_two_turn_episode_flattens_to_one_masked_completion():
    ep = Episode("click-checkboxes", 7, turns=[
        Turn([2, 10, 11], [20, 21, 3], [-0.5, -0.25, -0.125], "click(1)", True),
        Turn([2, 10, 12, 13], [22, 3], [-1.0, -2.0], "click(2)", True),
    ])
    assert flatten_episode(ep) == {
        "prompt_ids": [2, 10, 11],
        "completion_ids": [20, 21, 3, 2, 10, 12, 13, 22, 3],
        "env_mask": [1, 1, 1, 0, 0, 0, 0, 1, 1],
        "logprobs": [-0.5, -0.25, -0.125, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0],
    }
    one = Episode("click-button", 3, turns=[Turn([2, 5], [6, 3], [-0.1, -0.2], "click(4)", True)])
    assert flatten_episode(one) == {"prompt_ids": [2, 5], "completion_ids": [6, 3], "env_mask": [1, 1],
                                    "logprobs": [-0.1, -0.2]}


def test_rollout_func_plays_the_episodes_the_graftkit_engine_plays(sft, tmp_path):
    from accelerate import Accelerator

    cfg = _cfg(sft, tmp_path / "rl", max_turns=2)
    model, tok = load_model(sft)
    seconds: list[float] = []
    func = make_rollout(cfg, tok, sft, seconds)
    step = 1
    plan = _prompts(cfg, step)
    prompts = [episode_key(t, s) for t, s, _ in plan for _ in range(cfg.group_size)]
    trainer = SimpleNamespace(accelerator=Accelerator(cpu=True), state=SimpleNamespace(global_step=step),
                              model_wrapped=model, args=SimpleNamespace(ds3_gather_for_generation=True))
    got = func(prompts, trainer)
    jobs = [(t, s, k) for t, s, _ in plan for k in range(cfg.group_size)]  # train.grpo.generate's jobs
    want = rollout(Policy(model, tok, sft), jobs, Decode(greedy=False, max_new_tokens=12, seed=step), max_turns=2)
    flat = [flatten_episode(e) for e in want]
    for key in ("prompt_ids", "completion_ids", "env_mask"):
        assert got[key] == [f[key] for f in flat], key
    assert got["logprobs"] == [f["logprobs"] for f in flat]  # the same batches, bit for bit
    assert got["episode_success"] == [float(e.success) for e in want]
    assert got["episode_reward"] == got["episode_success"] and len(seconds) == 1
    assert any(len(e.turns) == 2 for e in want)  # a multi-turn episode is among them


def test_knob_mapping_is_exact(sft, tmp_path):
    cfg = _cfg(sft, tmp_path / "rl", prompts_per_step=3, group_size=4, lr=2e-5, beta=0.04, loss="gspo",
               epsilon=3e-4, epsilon_high=4e-4, scale_rewards="batch", temperature=0.7, top_p=0.9,
               max_new_tokens=24, num_iterations=2, grad_clip=0.5, warmup=3, seed=5, steps=10)
    assert trl_args(cfg, "/scratch", world_size=2) == {
        "output_dir": "/scratch", "per_device_train_batch_size": 6, "gradient_accumulation_steps": 1,
        "steps_per_generation": 1, "num_generations": 4, "num_iterations": 2, "max_steps": 20,
        "max_completion_length": 24, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "learning_rate": 2e-5,
        "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 3, "weight_decay": 0.0, "adam_beta1": 0.9,
        "adam_beta2": 0.99, "max_grad_norm": 0.5, "beta": 0.04, "loss_type": "grpo",
        "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4, "scale_rewards": "batch",
        "seed": 5, "data_seed": 5, "shuffle_dataset": False, "bf16": False, "fp16": False,
        "gradient_checkpointing": False, "use_cpu": True, "report_to": "none", "push_to_hub": False,
        "save_strategy": "no", "eval_strategy": "no", "logging_steps": 1, "disable_tqdm": True,
        "log_completions": False, "dataloader_num_workers": 0,
    }
    plain = trl_args(_cfg(sft, tmp_path / "rl", loss="dr_grpo", epsilon=0.2), "/s")
    assert (plain["loss_type"], plain["importance_sampling_level"], plain["epsilon_high"]) == ("dr_grpo", "token", 0.2)
    assert trl_args(_cfg(sft, tmp_path / "rl", dtype="bfloat16"), "/s")["bf16"] is True
    with pytest.raises(GraftkitError, match="do not split over 5 processes"):
        trl_args(cfg, "/s", world_size=5)
    with pytest.raises(GraftkitError, match="--loss gspo_token: TRL's GRPOTrainer has no such loss"):
        trl_args(_cfg(sft, tmp_path / "rl", loss="gspo_token"), "/s")


@pytest.fixture
def vllm_present(monkeypatch):
    """``--engine vllm`` resolves as where vLLM is installed (only TRL's arguments are built here)."""
    import graftkit.agent.engine as E

    monkeypatch.setattr(E, "vllm_installed", lambda: True)


def test_engine_vllm_asks_trl_for_its_vllm_generation_in_the_mode_given(sft, tmp_path, vllm_present, monkeypatch):
    from typer.testing import CliRunner

    import graftkit.cli as cli

    server = trl_args(_cfg(sft, tmp_path / "rl", engine="vllm", vllm_mode="server", vllm_server="10.0.0.5:8123"), "/s")
    assert {k: server[k] for k in ("use_vllm", "vllm_mode", "vllm_server_host", "vllm_server_port")} == {
        "use_vllm": True, "vllm_mode": "server", "vllm_server_host": "10.0.0.5", "vllm_server_port": 8123}
    assert trl_args(_cfg(sft, tmp_path / "rl", engine="vllm", vllm_mode="colocate"), "/s")["vllm_mode"] == "colocate"
    assert trl_args(_cfg(sft, tmp_path / "rl", engine="vllm"), "/s")["vllm_mode"] == "colocate"  # the default mode
    for plain in (_cfg(sft, tmp_path / "rl"), _cfg(sft, tmp_path / "rl", engine="auto")):  # hf: TRL without vLLM
        assert plain.engine_name == "hf" and not {"use_vllm", "vllm_mode"} & set(trl_args(plain, "/s"))
    # the command line builds that config (the run itself is not started here)
    seen = {}

    def capture(cfg, **kw):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr(cli, "run_train_grpo", capture)
    res = CliRunner().invoke(cli.app, ["train", "grpo", "--init", str(sft), "--out", str(tmp_path / "rl"),
                                       "--trainer", "trl", "--engine", "vllm", "--vllm-mode", "server",
                                       "--vllm-server", "10.0.0.5:8123", "--tasks", ",".join(TASKS), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    cfg = seen["cfg"]
    assert (cfg.trainer, cfg.engine, cfg.vllm_mode, cfg.trl_vllm_mode) == ("trl", "vllm", "server", "server")
    args = trl_args(cfg, "/s")
    assert (args["use_vllm"], args["vllm_mode"], args["vllm_server_host"], args["vllm_server_port"]) == (
        True, "server", "10.0.0.5", 8123)


@pytest.mark.parametrize("kw, message", [
    (dict(vllm_mode="server"), "--vllm-mode and --vllm-server need --trainer trl --engine vllm"),
    (dict(engine="auto", vllm_mode="colocate"), "--vllm-mode and --vllm-server need --trainer trl --engine vllm"),
    (dict(vllm_server="10.0.0.5:8000"), "--vllm-mode and --vllm-server need --trainer trl --engine vllm"),
    (dict(trainer="graftkit", engine="vllm", vllm_mode="server"), "need --trainer trl --engine vllm"),
    (dict(engine="vllm", vllm_server="10.0.0.5:8000"), "--vllm-server names the server of --vllm-mode server"),
    (dict(engine="vllm", vllm_mode="remote"), "--vllm-mode 'remote' is not an option"),
])
def test_vllm_mode_and_server_need_trl_with_engine_vllm(sft, tmp_path, vllm_present, kw, message):
    with pytest.raises(GraftkitError, match=message):
        _cfg(sft, tmp_path / "rl", **kw)


def test_dataset_rows_and_log_rows_use_graftkit_names(sft, tmp_path):
    cfg = _cfg(sft, tmp_path / "rl", steps=3)
    rows = dataset_rows(cfg)
    assert [(r["task"], r["env_seed"]) for r in rows] == [(t, s) for k in range(3) for t, s, _ in _prompts(cfg, k)]
    assert rows[0]["prompt"] == f"{rows[0]['task']}@{rows[0]['env_seed']}"
    trl_log = {"step": 2, "loss": 0.5, "reward": 0.25, "success": 0.125, "frac_reward_zero_std": 0.5, "kl": 0.01,
               "entropy": 1.5, "clip_ratio/low_mean": 0.1, "clip_ratio/high_mean": 0.2, "grad_norm": 3.0,
               "learning_rate": 1e-4, "completions/mean_length": 4.5, "num_tokens": 999.0, "epoch": 0.5}
    assert log_row(cfg, trl_log, seconds=7.0, gen_seconds=2.0) == {
        "step": 2, "loss": 0.5, "reward": 0.25, "success": 0.125, "frac_reward_zero_std": 0.5, "kl_k3_mean": 0.01,
        "entropy": 1.5, "clip_frac_low": 0.1, "clip_frac_high": 0.2, "grad_norm": 3.0, "lr": 1e-4, "tokens": 36,
        "episodes": 8, "gen_seconds": 2.0, "seconds": 7.0}


@pytest.mark.parametrize("kw, message", [
    (dict(stages=2), "--stages: TRL's GRPOTrainer has no such variant"),
    (dict(veto_epsilon=0.1), "--veto-epsilon: TRL's GRPOTrainer has no such variant"),
    (dict(focal_gamma=1.0), "--focal-gamma: TRL's GRPOTrainer has no such variant"),
    (dict(verigate=True), "--verigate: TRL's GRPOTrainer has no such variant"),
])
def test_variants_trl_lacks_are_one_clear_error(sft, tmp_path, kw, message):
    with pytest.raises(GraftkitError, match=message):
        _cfg(sft, tmp_path / "rl", **kw)


def test_resume_checkpoints_vllm_and_existing_output_are_clear_errors(sft, tmp_path):
    with pytest.raises(GraftkitError, match="--resume with --trainer trl: TRL's resumable checkpoints hold optimizer"):
        run_grpo_trl(_cfg(sft, tmp_path / "rl"), resume=True)
    with pytest.raises(GraftkitError, match="--checkpoint-every with --trainer trl"):
        run_grpo_trl(_cfg(sft, tmp_path / "rl", checkpoint_every=1))
    with pytest.raises(GraftkitError, match=r"--engine vllm \(--vllm-mode colocate\) with --trainer trl: graftkit's "
                                            "multi-turn rollout"):
        run_grpo_trl(_cfg(sft, tmp_path / "rl", engine="vllm"))
    (tmp_path / "there").mkdir()
    with pytest.raises(GraftkitError, match="already exists"):
        run_grpo_trl(_cfg(sft, tmp_path / "there"))


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes_writes_a_loadable_policy(sft, tmp_path):
    # accelerate's --cpu flag takes its single-process launcher; two CPU processes come from the torchrun
    # launcher of the DDP config, joined over gloo because the run trains on --device cpu
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "GRAFTKIT_RUNS": str(tmp_path / "runs"), "TRL_EXPERIMENTAL_SILENCE": "1"}
    out = tmp_path / "rl"
    argv = [str(Path(sys.executable).parent / "accelerate"), "launch", "--num_processes", "2", "--config_file",
            str(ROOT / "configs" / "accelerate" / "ddp.yaml"), "-m", "graftkit", "train", "grpo", "--trainer", "trl",
            "--init", str(sft), "--out", str(out), "--tasks", "click-button", "--steps", "2",
            "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--device", "cpu", "--json"]
    res = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["processes"] == 2 and prov["step"] == 2
    assert [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()] == [1, 2]
    assert isinstance(load_policy(out), Policy)
    assert (tmp_path / "runs" / "results" / "train-grpo-rl.h5").is_file()
