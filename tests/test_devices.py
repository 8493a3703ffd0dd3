"""``--device`` and ``--dtype`` on every command that runs a model.

- the rules of :mod:`graftkit.core.devices` (CUDA requests on a machine without CUDA, device indices, what
  ``auto`` means on each device), with ``torch.cuda`` monkeypatched where a GPU is pretended;
- every model-running path in bfloat16 on the CPU (eval, headroom, graft --eval/--sweep, rank --what
  activations, train sft, train grpo, sweep, the demo's stage configs), each recording its placement, and
  float32 beside it;
- in-place grafts into a bfloat16 model equal the exported graft loaded in bfloat16, bit for bit;
- sampled rollouts do not depend on batching in bfloat16 (and where they do, why);
- GRPO resumed from a checkpoint in bfloat16 compute equals the uninterrupted run, its intermediate
  checkpoints holding the float32 master weights;
- on a machine with CUDA: eval, in-place grafts and one GRPO step there (skipped without one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from graftkit.core import devices  # noqa: E402
from graftkit.cli import app  # noqa: E402
from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.results.store import read_result  # noqa: E402
from graftkit.weights import load_model, open_checkpoint, save_model  # noqa: E402

runner = CliRunner()
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
ROOT = Path(__file__).resolve().parents[1]


def _cli(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A tiny float32 policy (nano, the task tokenizer) and an RL child with planted attention and MLP deltas."""
    from graftkit.agent import task_words, tiny_policy
    from graftkit.weights import describe

    root = tmp_path_factory.mktemp("device-policies")
    sft = tiny_policy(task_words(), "nano", seed=0)
    paths = {"sft": save_model(root / "sft", sft.model, sft.tokenizer, provenance={"producer": "test"})}
    d = describe(open_checkpoint(paths["sft"]))
    m = tiny_policy(task_words(), "nano", seed=0).model
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, q in m.named_parameters():
            if (".self_attn." in n or ".mlp." in n) and q.dim() == 2:
                q.add_(0.01 * torch.randn(q.shape, generator=g))
    paths["rl"] = save_model(root / "rl", m, sft.tokenizer, provenance={
        "producer": "test (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    return paths


# ----------------------------------------------------------------------------------- devices.py rules


def test_cuda_without_cuda_is_one_error_naming_the_flag(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for asked in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(GraftkitError) as e:
            devices.resolve_device(asked)
        assert f"--device {asked}: torch sees no CUDA device" in str(e.value)
        assert "use --device cpu" in str(e.value) and "\n" not in str(e.value)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(GraftkitError, match="--sweep-device cuda"):
        devices.resolve_device("cuda", flag="--sweep-device")


def test_cuda_index_out_of_range(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert devices.resolve_device("cuda") == torch.device("cuda", 0)
    assert devices.resolve_device("auto") == torch.device("cuda", 0)
    with pytest.raises(GraftkitError) as e:
        devices.resolve_device("cuda:2")
    assert "--device cuda:2: this machine has 2 CUDA device(s)" in str(e.value) and "cuda:0 … cuda:1" in str(e.value)


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "CUDA", "cuda:", "mps", ""])
def test_device_spelling(bad):
    with pytest.raises(GraftkitError, match="is not a device"):
        devices.check_device(bad)


def test_resolve_dtype_auto_rules(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)  # a device object needs no GPU to exist
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    # CPU: float32 whatever the checkpoint stores
    for stored in (None, torch.float32, torch.bfloat16, torch.float16):
        assert devices.resolve_dtype("auto", cpu, stored) == torch.float32
    # GPU: the stored floating dtype (bf16 stays bf16), float32 when unknown
    assert devices.resolve_dtype("auto", gpu, torch.bfloat16) == torch.bfloat16
    assert devices.resolve_dtype("auto", gpu, torch.float16) == torch.float16
    assert devices.resolve_dtype("auto", gpu, torch.float32) == torch.float32
    assert devices.resolve_dtype("auto", gpu, None) == torch.float32
    assert devices.resolve_dtype("auto", gpu, torch.int8) == torch.float32
    for name, want in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        assert devices.resolve_dtype(name, cpu) == want and devices.resolve_dtype(name, gpu, torch.float32) == want
    with pytest.raises(GraftkitError, match="--dtype 'half' is not an option"):
        devices.resolve_dtype("half", cpu)
    # a GPU without bfloat16: one error that names the GPU and the other choices
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Old GPU")
    with pytest.raises(GraftkitError) as e:
        devices.resolve_dtype("bfloat16", gpu)
    assert "--dtype bfloat16: Old GPU has no bfloat16" in str(e.value) and "float16 or float32" in str(e.value)
    with pytest.raises(GraftkitError, match="Old GPU has no bfloat16"):
        devices.resolve_dtype("auto", gpu, torch.bfloat16)
    assert devices.resolve_dtype("bfloat16", cpu) == torch.bfloat16  # the CPU has it


def test_training_dtype_rules(monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert devices.training_dtype("auto", cpu) == torch.float32
    assert devices.training_dtype("auto", gpu) == torch.bfloat16
    assert devices.training_dtype("bfloat16", cpu) == torch.bfloat16
    assert devices.training_dtype("float16", gpu) == torch.float16
    assert devices.training_dtype("float32", gpu) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert devices.training_dtype("auto", gpu) == torch.float32  # float16 only when asked for (no loss scaling)


def test_autocast_and_describe():
    cpu = torch.device("cpu")
    w, x = torch.randn(4, 4), torch.randn(2, 4)
    with devices.autocast(cpu, torch.float32):
        assert (x @ w).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    with devices.autocast(cpu, torch.bfloat16):
        assert (x @ w).dtype == torch.bfloat16
    assert devices.describe(cpu, torch.bfloat16) == {"device": "cpu", "dtype": "bfloat16", "torch": torch.__version__}


def test_cli_bad_device_or_dtype_is_one_line(policies, tmp_path, monkeypatch):
    for args, message in ((["--device", "gpu"], "--device 'gpu' is not a device"),
                          (["--dtype", "half"], "--dtype 'half' is not an option")):
        res = _cli(["eval", "--model", policies["sft"], "--tasks", "click-button", "--seeds", "1", *args],
                   tmp_path, monkeypatch)
        assert res.exit_code == 2, res.output
        assert message in res.stderr and "Traceback" not in res.output
        assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(CUDA, reason="checks the error of a machine without CUDA")
def test_cli_cuda_without_cuda_is_one_line(policies, tmp_path, monkeypatch):
    res = _cli(["eval", "--model", policies["sft"], "--tasks", "click-button", "--seeds", "1", "--device", "cuda"],
               tmp_path, monkeypatch)
    assert res.exit_code == 2 and "--device cuda: torch sees no CUDA device" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


# ------------------------------------------------------------------------- every path, bf16 on the CPU


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_eval_and_headroom_record_their_placement(policies, tmp_path, monkeypatch, dtype):
    res = _cli(["eval", "--model", policies["sft"], "--tasks", "click-button,focus-text", "--seeds", "2",
                "--episodes", "1", "--device", "cpu", "--dtype", dtype, "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    stored = read_result(json.loads(res.stdout)["files"]["model"])
    assert stored.attrs["placement"] == {"device": "cpu", "dtype": dtype, "torch": torch.__version__, "engine": "hf"}
    assert stored["success"].shape == (2, 2, 1, 1) and stored.attrs["config"]["dtype"] == dtype
    res = _cli(["headroom", "--model", policies["sft"], "--tasks", "click-button", "--k", "2", "--seeds", "2",
                "--episodes", "1", "--dtype", dtype, "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    stored = read_result(json.loads(res.stdout)["file"])
    assert stored.attrs["placement"]["dtype"] == dtype and stored.attrs["placement"]["device"] == "cpu"
    assert stored["success"].shape == (1, 2, 1, 2)


def test_load_policy_rounds_a_float32_checkpoint_once_to_bfloat16(policies):
    from graftkit.agent import load_policy

    pol = load_policy(policies["sft"], device="cpu", dtype="bfloat16")
    assert {p.dtype for p in pol.model.parameters()} == {torch.bfloat16}
    assert pol.placement["dtype"] == "bfloat16"
    ck = open_checkpoint(policies["sft"])
    sd = pol.model.state_dict()
    for name in ck.names:
        P.assert_bit_equal(sd[name], ck.read(name).to(torch.bfloat16), name)
    auto = load_policy(policies["sft"], device="cpu")  # auto on the CPU: float32
    assert {p.dtype for p in auto.model.parameters()} == {torch.float32}


@pytest.mark.slow
def test_graft_eval_and_factorial_sweep_in_bfloat16(policies, tmp_path, monkeypatch):
    common = ["--tasks", "click-button", "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4",
              "--device", "cpu", "--dtype", "bfloat16", "--json"]
    res = _cli(["graft", "--from", policies["rl"], "--sweep", "factorial", "--groups", "attn,mlp", *common],
               tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    sweep = read_result(json.loads(res.stdout)["files"]["A"])
    assert sweep.attrs["placement"] == {"device": "cpu", "dtype": "bfloat16"}
    assert sweep["success"].shape[0] == 5  # base, RL, attn, mlp, attn+mlp (= RL here, as a configuration)
    # base and RL inside the sweep play what the bf16 models play on their own
    from graftkit.agent import Decode, evaluate, load_policy
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL

    decode = Decode(greedy=True, max_new_tokens=4)
    labels = list(sweep.coords["config"])
    for role in ("sft", "rl"):
        out = evaluate(load_policy(policies[role], device="cpu", dtype="bfloat16"), ["click-button"], [0, 1], 1, decode)
        want = out.success.astype(np.int8)[..., 0]  # [task, seed, episode]
        assert (sweep["success"][labels.index(BASE_LABEL if role == "sft" else RL_LABEL)] == want).all(), role
    res = _cli(["graft", "--from", policies["rl"], "--eval", "--groups", "attn", *common], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    one = read_result(tmp_path / "runs" / "results" / "graft-eval-rl.h5")
    assert one.attrs["placement"] == {"device": "cpu", "dtype": "bfloat16"}


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rank_activations_record_their_dtype(policies, tmp_path, monkeypatch, dtype):
    res = _cli(["rank", "--what", "activations", "--model", policies["sft"], "--probes", "6", "--tokens", "all",
                "--device", "cpu",
                "--dtype", dtype, "--json", "--save", tmp_path / f"act-{dtype}.h5"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    saved = read_result(tmp_path / f"act-{dtype}.h5")
    assert saved.attrs["activation_dtype"] == dtype and saved.attrs["config"]["dtype"] == dtype
    assert np.isfinite(saved["value"]).all() and saved.attrs["tokens"] == "all"
    # the numerical-rank tolerance follows the activation dtype (bf16's eps is 2^-7, float32's 2^-23)
    eps = float(torch.finfo(getattr(torch, dtype)).eps)
    assert eps == {"bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}[dtype]


def test_rank_activations_bfloat16_tracks_float32(policies, tmp_path):
    """Effective ranks of bf16 activations stay within 0.2% of the float32 ones on the same probes (random
    nano policy, every token; measured worst 3e-5): bf16 rounds each hidden state by ~2^-8 relative, and
    erank, a smooth function of the whole spectrum, averages that noise out."""
    from graftkit.agent import load_policy
    from graftkit.rank.activations import METRICS, activation_ranks, probe_prompts

    prompts = probe_prompts("all", 12)
    got = {dt: activation_ranks(load_policy(policies["sft"], device="cpu", dtype=dt), None, prompts, "all", tokens="all")
           for dt in ("float32", "bfloat16")}
    k = list(METRICS).index("erank")
    a, b = np.asarray(got["float32"]["value"])[:, k], np.asarray(got["bfloat16"]["value"])[:, k]
    assert np.isfinite(a).all() and np.isfinite(b).all()
    np.testing.assert_allclose(b, a, rtol=2e-3)
    assert not np.array_equal(a, b)  # they did run in different precisions


def _is_bf16_representable(t: torch.Tensor) -> bool:
    return torch.equal(t.float(), t.to(torch.bfloat16).float())


@pytest.mark.parametrize("save, stored", [("bfloat16", torch.bfloat16), ("auto", torch.float32)])
def test_train_sft_in_bfloat16_keeps_float32_master_weights(tmp_path, monkeypatch, save, stored):
    out = tmp_path / "sft"
    res = _cli(["train", "sft", "--out", out, "--size", "nano", "--steps", "3", "--batch-size", "4",
                "--tasks", "click-button", "--threads", "1", "--device", "cpu", "--dtype", "bfloat16",
                "--save-dtype", save, "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    prec = json.loads((out / "graftkit.json").read_text())["precision"]
    assert prec["compute_dtype"] == "bfloat16" and prec["device"] == "cpu"
    assert prec["saved_dtype"] == devices.dtype_name(stored) and "float32 master weights" in prec["convention"]
    ck = open_checkpoint(out)
    assert {ck.metas[n].dtype for n in ck.names} == {stored}
    if stored == torch.float32:
        # three AdamW steps of lr ~1e-4 moved float32 masters off the bf16 grid: they were never bf16
        assert not all(_is_bf16_representable(ck.read(n)) for n in ck.names)


def test_train_sft_float32_still_records_float32(tmp_path, monkeypatch):
    out = tmp_path / "sft32"
    res = _cli(["train", "sft", "--out", out, "--size", "nano", "--steps", "2", "--batch-size", "4",
                "--tasks", "click-button", "--threads", "1", "--device", "cpu", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    prec = json.loads((out / "graftkit.json").read_text())["precision"]
    assert (prec["compute_dtype"], prec["saved_dtype"]) == ("float32", "float32")


GRPO_ARGS = ["--tasks", "click-button", "--steps", "2", "--prompts-per-step", "1", "--group-size", "2",
             "--max-new-tokens", "6", "--threads", "1", "--device", "cpu"]


@pytest.mark.parametrize("dtype, save, stored", [("bfloat16", "bfloat16", torch.bfloat16),
                                                 ("bfloat16", "auto", torch.float32),
                                                 ("float32", "auto", torch.float32)])
def test_train_grpo_records_its_precision(policies, tmp_path, monkeypatch, dtype, save, stored):
    out = tmp_path / "rl"
    res = _cli(["train", "grpo", "--init", policies["sft"], "--out", out, *GRPO_ARGS, "--dtype", dtype,
                "--save-dtype", save, "--lr", "1e-3", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    prov = json.loads((out / "graftkit.json").read_text())
    prec = prov["precision"]
    assert (prec["compute_dtype"], prec["saved_dtype"], prec["device"]) == (dtype, devices.dtype_name(stored), "cpu")
    assert prov["config"]["dtype"] == dtype and prov["config"]["save_dtype"] == save
    ck = open_checkpoint(out)
    assert {ck.metas[n].dtype for n in ck.names} == {stored}
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and all(np.isfinite(m["loss"]) for m in log)


def test_sweep_runs_a_grid_in_bfloat16(policies, tmp_path, monkeypatch):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"out: sweep\ninits:\n  sft: {policies['sft']}\n"
                    "base: {init: sft, steps: 1, tasks: click-button, prompts_per_step: 1, group_size: 2, "
                    "max_new_tokens: 6, dtype: bfloat16, save_dtype: bfloat16}\n"
                    "runs:\n  - {name: a}\n")
    res = _cli(["sweep", grid, "--device", "cpu", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    (run,) = json.loads(res.stdout)["runs"]
    prec = json.loads((Path(run["out"]) / "graftkit.json").read_text())["precision"]
    assert (prec["compute_dtype"], prec["saved_dtype"], prec["device"]) == ("bfloat16", "bfloat16", "cpu")


def test_sweep_device_reaches_every_run(policies, tmp_path, monkeypatch):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"out: sweep\ninits:\n  sft: {policies['sft']}\n"
                    "base: {init: sft, steps: 1, tasks: click-button, prompts_per_step: 1, group_size: 2, "
                    "max_new_tokens: 6}\nruns:\n  - {name: a}\n")
    res = _cli(["sweep", grid, "--device", "cpu", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    (run,) = json.loads(res.stdout)["runs"]
    assert json.loads((Path(run["out"]) / "graftkit.json").read_text())["config"]["device"] == "cpu"


def test_study_passes_its_placement_to_every_stage_that_runs_a_model(policies, tmp_path, monkeypatch):
    """The demo's stages build their commands' configs with the study's --device/--dtype (the run functions
    are replaced by recorders: the stages' wiring is the point, not the training)."""
    import graftkit.graft.commands as graft_commands
    import graftkit.rank.commands as rank_commands
    import graftkit.study.pipeline as study
    import graftkit.train.commands as training

    seen: list = []
    record = lambda cfg, *a, **k: seen.append(cfg)  # noqa: E731
    monkeypatch.setattr(study, "run_headroom", record)
    monkeypatch.setattr(study, "run_eval", record)
    monkeypatch.setattr(training, "run_train_sft", record)
    monkeypatch.setattr(training, "run_train_grpo", record)
    monkeypatch.setattr(graft_commands, "run_graft_experiments", record)
    monkeypatch.setattr(rank_commands, "run_rank", record)
    cfg = study.StudyConfig.preset(str(tmp_path / "demo"), quick=True, device="cpu", dtype="bfloat16", train_sft=True)
    assert cfg.placement == {"device": "cpu", "dtype": "bfloat16"}
    st = study.Study(cfg)
    study.stage_sft(st)
    shutil.copytree(policies["sft"], st.sft)  # the later stages read the SFT policy's taxonomy
    for units in (study.headroom_units, study.sft_b_units, study.grpo_units, study.eval_units, study.graft_units,
                  study.rank_units):
        st.run_units(units(st))  # one worker: in this process, where the recorders are
    kinds = {type(c).__name__ for c in seen}
    assert {"SFTConfig", "HeadroomConfig", "GRPOConfig", "EvalConfig", "GraftConfig", "RankConfig"} <= kinds
    placed = [c for c in seen if not (type(c).__name__ == "RankConfig" and c.what != "activations")]
    assert len(placed) >= len(study.grid(cfg)) + 4
    for c in placed:
        assert (c.device, c.dtype) == ("cpu", "bfloat16"), type(c).__name__
    # weight and delta spectra are read from the stored values (float64 on the CPU): no placement to pass
    assert any(type(c).__name__ == "RankConfig" and c.what == "weights" for c in seen)


# ------------------------------------------------------------------------- in-place grafts, bit for bit


PLANS = [("attn", "mlp"), 0.5], [("attn", "mlp"), 1.0], [("embed", "norm", "lm_head"), 0.5], [("all",), 1.0]


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32], ids=["bf16-pair", "f32-pair"])
def test_inplace_graft_in_a_bfloat16_model_equals_the_exported_graft_loaded_in_bfloat16(tmp_path, stored):
    from graftkit.graft import GraftSpec, InPlaceGraft, export_graft, plan_graft

    pair = P.make_pair(tmp_path, "llama", layers=3, dtype=stored)
    base, rl = open_checkpoint(pair.base), open_checkpoint(pair.rl)
    tax = base.taxonomy()
    model, _ = load_model(pair.base, dtype=torch.bfloat16, need_tokenizer=False)
    original = {n: t.clone() for n, t in model.state_dict().items()}
    with InPlaceGraft(model, base, rl) as session:
        for i, (groups, alpha) in enumerate(PLANS):
            spec = GraftSpec.parse(",".join(groups), alpha=alpha)
            plan = plan_graft(tax, spec)
            session.apply(plan)
            out = export_graft(base, rl, plan, tmp_path / f"export-{i}", force=True)
            want, _ = load_model(out, dtype=torch.bfloat16, need_tokenizer=False)
            got_sd, want_sd = model.state_dict(), want.state_dict()
            assert set(got_sd) == set(want_sd)
            moved = 0
            for n, t in want_sd.items():
                P.assert_bit_equal(got_sd[n], t, f"{spec}: {n}")
                moved += not torch.equal(t, original[n])
            assert moved > 0, spec  # the graft changed something
    for n, t in model.state_dict().items():
        P.assert_bit_equal(t, original[n], f"restored {n}")


# ----------------------------------------------------------------------------- batching independence


def _sampled_actions(policy, batch_size: int):
    from graftkit.agent import Decode, rollout

    jobs = [(t, s, k) for t in ("click-button", "enter-text", "click-tab-2") for s in range(3) for k in range(2)]
    eps = rollout(policy, jobs, Decode(greedy=False, temperature=1.0, max_new_tokens=8, seed=3), batch_size=batch_size)
    return [[tuple(t.action_ids) for t in e.turns] for e in eps]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, attention", [(torch.float32, "sdpa"), (torch.bfloat16, "eager")])
def test_sampled_rollouts_do_not_depend_on_batching(dtype, attention):
    from graftkit.agent import task_words, tiny_policy

    policy = tiny_policy(task_words(), "nano", seed=0)
    policy.model.set_attn_implementation(attention)
    policy.model.to(dtype)
    one, eight = _sampled_actions(policy, 1), _sampled_actions(policy, 8)
    assert one == eight


@pytest.mark.slow
def test_sampled_rollouts_do_not_depend_on_batching_bfloat16_sdpa():
    """torch's fused CPU attention kernel in bfloat16 gives a row a result that depends on its left padding
    (bf16-ulp logit differences flip a sampled token); rollouts use SDPA's math backend there
    (agent.decode.batch_invariant_attention), which is batch-invariant."""
    from graftkit.agent import task_words, tiny_policy

    policy = tiny_policy(task_words(), "nano", seed=0)
    assert policy.model.config._attn_implementation == "sdpa"
    policy.model.to(torch.bfloat16)
    assert _sampled_actions(policy, 1) == _sampled_actions(policy, 8)


# ------------------------------------------------------------------------------------- GRPO resume


def _tensors(folder: Path) -> dict[str, bytes]:
    ck = open_checkpoint(folder)
    return {n: ck.array(n).tobytes() for n in ck.names}


@pytest.mark.slow
def test_grpo_resume_in_bfloat16_equals_the_uninterrupted_run(policies, tmp_path):
    from graftkit.train.grpo import GRPOConfig, latest_checkpoint, run_grpo

    cfg = GRPOConfig(init=str(policies["sft"]), out=str(tmp_path / "straight"), tasks=("click-button",), steps=3,
                     prompts_per_step=1, group_size=2, max_new_tokens=6, lr=1e-3, threads=1, checkpoint_every=1,
                     device="cpu", dtype="bfloat16", save_dtype="bfloat16")
    straight = run_grpo(cfg)
    cut = replace(cfg, out=str(tmp_path / "cut"))
    run_grpo(cut)
    ckpts = Path(cut.out + ".checkpoints")
    steps = sorted(p.name for p in ckpts.glob("step-*"))
    assert steps == ["step-000001", "step-000002"]
    for name in steps:  # the resumable checkpoints hold the float32 masters, whatever --save-dtype says
        ck = open_checkpoint(ckpts / name)
        assert {ck.metas[n].dtype for n in ck.names} == {torch.float32}, name
        assert not all(_is_bf16_representable(ck.read(n)) for n in ck.names), name
        prec = json.loads((ckpts / name / "graftkit.json").read_text())["precision"]
        assert (prec["compute_dtype"], prec["saved_dtype"]) == ("bfloat16", "float32")
    final = open_checkpoint(straight)
    assert {final.metas[n].dtype for n in final.names} == {torch.bfloat16}
    # interrupted after step 1: the final folder and the later checkpoint are gone
    shutil.rmtree(cut.out)
    shutil.rmtree(ckpts / "step-000002")
    assert latest_checkpoint(cut).name == "step-000001"
    resumed = run_grpo(cut, resume=True)
    assert _tensors(resumed) == _tensors(straight)
    strip = lambda path: [{k: v for k, v in json.loads(x).items() if "seconds" not in k}  # noqa: E731
                          for x in (path / "train_log.jsonl").read_text().splitlines()]
    assert strip(resumed) == strip(straight)


# ------------------------------------------------------------------------------------------- on CUDA


@needs_cuda
def test_eval_on_cuda_matches_the_cpu(policies, tmp_path):
    from graftkit.evaluation.commands import EvalConfig, run_eval

    common = dict(model=policies["sft"], tasks="click-button,focus-text,click-tab", seeds=4, episodes=2, run=tmp_path)
    gpu = run_eval(EvalConfig(device="cuda", dtype="float32", save=tmp_path / "gpu.h5", **common)).results["model"]
    cpu = run_eval(EvalConfig(device="cpu", dtype="float32", save=tmp_path / "cpu.h5", **common)).results["model"]
    assert gpu.attrs["placement"]["device"].startswith("cuda") and "gpu" in gpu.attrs["placement"]
    assert cpu.attrs["placement"]["device"] == "cpu"
    # float32 greedy on identical episodes: the devices' arithmetic may flip a near-tie, rarely
    assert (gpu.success == cpu.success).mean() >= 0.9


@needs_cuda
def test_inplace_graft_on_cuda_equals_the_exported_graft_loaded_there(tmp_path):
    from graftkit.graft import GraftSpec, InPlaceGraft, export_graft, plan_graft

    pair = P.make_pair(tmp_path, "qwen3", layers=3, dtype=torch.bfloat16)
    base, rl = open_checkpoint(pair.base), open_checkpoint(pair.rl)
    tax = base.taxonomy()
    model, _ = load_model(pair.base, dtype=torch.bfloat16, need_tokenizer=False)
    model.to("cuda")
    original = {n: t.clone() for n, t in model.state_dict().items()}
    with InPlaceGraft(model, base, rl) as session:
        for i, (groups, alpha) in enumerate(PLANS):
            plan = plan_graft(tax, GraftSpec.parse(",".join(groups), alpha=alpha))
            session.apply(plan)
            want, _ = load_model(export_graft(base, rl, plan, tmp_path / f"e{i}", force=True), dtype=torch.bfloat16,
                                 need_tokenizer=False)
            want_sd = want.to("cuda").state_dict()
            for n, t in model.state_dict().items():
                assert t.is_cuda
                P.assert_bit_equal(t, want_sd[n], f"{groups} α={alpha}: {n}")
    for n, t in model.state_dict().items():
        P.assert_bit_equal(t, original[n], f"restored {n}")


@needs_cuda
def test_one_grpo_step_on_cuda(policies, tmp_path):
    from graftkit.train.grpo import GRPOConfig, run_grpo

    out = run_grpo(GRPOConfig(init=str(policies["sft"]), out=str(tmp_path / "rl"), tasks=("click-button",), steps=1,
                              prompts_per_step=1, group_size=2, max_new_tokens=6, threads=1, device="cuda"))
    prec = json.loads((out / "graftkit.json").read_text())["precision"]
    want = "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    assert prec["device"].startswith("cuda") and prec["compute_dtype"] == want
    assert prec["saved_dtype"] == "float32"  # auto: the init checkpoint's
    assert np.isfinite(json.loads((out / "train_log.jsonl").read_text().splitlines()[0])["loss"])


# --------------------------------------------------------------------------------- the GPU check script


@pytest.mark.slow
def test_gpu_check_small_on_cpu_runs_end_to_end(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--small",
                           "--out", str(tmp_path / "check")], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    summary = lines[lines.index("== summary =="):]
    for key in ("episodes/s", "GRPO s/step", "peak GPU memory"):
        assert any(line.startswith(key) for line in summary), key
    checks = [line for line in summary if line.startswith(("PASS", "FAIL"))]
    assert len(checks) >= 6 and all(line.startswith("PASS") for line in checks), checks
    assert {"eval", "grpo", "graft-inplace", "graft-sweep", "rank-activations"} <= {c.split()[1] for c in checks}
