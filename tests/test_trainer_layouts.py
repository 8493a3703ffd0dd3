"""Checkpoints as the distributed trainers write them (torch DCP, DeepSpeed ZeRO 0-3, verl FSDP actors), read directly.

The fixtures under ``tests/fixtures/trainers/`` were written on CPU by the real libraries (FSDP2 + ``dcp.save``,
torchtitan's layout, accelerate's ``save_fsdp_model`` under the HF Trainer, DeepSpeed through the Trainer and its raw
engine, verl's ``FSDPCheckpointManager``), each training ``base/`` for 4 AdamW steps at lr 1e-5. Every read here must
equal, bit for bit, the fp32 state dict the library's own conversion gives (``dcp_to_torch_save`` run here; DeepSpeed's
``get_fp32_state_dict_from_zero_checkpoint`` and an fp32 join of verl's shards, stored beside the fixtures), and every
command on a layout must give what it gives on an HF folder of those weights.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.results.store import read_result
from graftkit.weights import open_checkpoint, tensor_bits
from graftkit.weights.checkpoint import READERS, layout_of, recognise
from graftkit.weights.resolve import checkpoints_of

FIX = Path(__file__).parent / "fixtures" / "trainers"
BASE = FIX / "base"
VERL = {v: FIX / "verl" / v / "checkpoints" / "graftkit_fixtures" / f"tiny_llama_{v}" for v in ("fsdp1", "fsdp2")}
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _dcp_ref(folder: Path) -> dict:
    """What torch's own converter makes of a DCP folder: ``dcp_to_torch_save``, nested dicts flattened with '.'."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as d:
        dcp_to_torch_save(folder, Path(d) / "all.pt")
        sd = torch.load(Path(d) / "all.pt", weights_only=True)

    def flat(x, pre=""):
        for k, v in x.items():
            if isinstance(v, dict):
                yield from flat(v, f"{pre}{k}.")
            elif isinstance(v, torch.Tensor):
                yield f"{pre}{k}", v

    # torchtitan saves its optimizer, scheduler and train state beside the model: not weights
    return {k: v for k, v in flat(sd) if k.split(".")[0] not in ("optimizer", "lr_scheduler", "train_state")}


def _ds_ref(fixture: str, step: int) -> dict:
    ref = FIX / "deepspeed" / "reference" / fixture
    trainer = ref / f"checkpoint-{step}__global_step{step}.safetensors"
    return load_file(trainer if trainer.is_file() else ref / f"global_step{step}.safetensors")


#: layout → (what the user passes, relative to the fixtures; the fp32 reference of the checkpoint it means; the
#: source the read states; the dtype read)
LAYOUTS = {
    "fsdp2-dcp": ("dcp/fsdp2-model", lambda: _dcp_ref(FIX / "dcp/fsdp2-model"), "DCP folder", "float32"),
    "torchtitan-run": ("dcp/torchtitan", lambda: _dcp_ref(FIX / "dcp/torchtitan/step-4"), "DCP folder", "float32"),
    "torchtitan-bf16": ("dcp/torchtitan-model-only/step-4",
                        lambda: _dcp_ref(FIX / "dcp/torchtitan-model-only/step-4"), "DCP folder", "bfloat16"),
    "accelerate-fsdp1": ("dcp/accelerate-fsdp1/checkpoint-4",
                         lambda: _dcp_ref(FIX / "dcp/accelerate-fsdp1/checkpoint-4/pytorch_model_fsdp_0"), "DCP folder",
                         "float32"),
    "accelerate-fsdp2-run": ("dcp/accelerate-fsdp2",
                             lambda: _dcp_ref(FIX / "dcp/accelerate-fsdp2/checkpoint-4/pytorch_model_fsdp_0"),
                             "DCP folder", "float32"),
    "trainer-zero2": ("deepspeed/trainer-zero2/checkpoint-4", lambda: _ds_ref("trainer-zero2", 4),
                      "ZeRO-2 optimizer partitions", "float32"),
    "trainer-zero3-run": ("deepspeed/trainer-zero3", lambda: _ds_ref("trainer-zero3", 4),
                          "ZeRO-3 optimizer partitions", "float32"),
    "engine-zero1-bf16": ("deepspeed/engine-zero1-bf16", lambda: _ds_ref("engine-zero1-bf16", 4),
                          "ZeRO-1 bf16 optimizer partitions", "float32"),
    "engine-zero2-bf16": ("deepspeed/engine-zero2-bf16/global_step2", lambda: _ds_ref("engine-zero2-bf16", 2),
                          "ZeRO-2 optimizer partitions", "float32"),
    "engine-zero3-bf16": ("deepspeed/engine-zero3-bf16", lambda: _ds_ref("engine-zero3-bf16", 4),
                          "ZeRO-3 optimizer partitions (2 ranks", "float32"),
    "engine-zero3-3-ranks": ("deepspeed/engine-zero3-bf16-ws3", lambda: _ds_ref("engine-zero3-bf16-ws3", 4),
                             "ZeRO-3 optimizer partitions (3 ranks", "float32"),
    "engine-zero0-fp32": ("deepspeed/engine-zero0-fp32", lambda: _ds_ref("engine-zero0-fp32", 4),
                          "fp32 module states", "float32"),
    "verl-fsdp1-run": (str(VERL["fsdp1"].relative_to(FIX)),
                       lambda: load_file(FIX / "verl/reference/fsdp1/global_step_4.safetensors"),
                       "verl's FSDP1 actor (2 ranks)", "float32"),
    "verl-fsdp2-step": (str((VERL["fsdp2"] / "global_step_2").relative_to(FIX)),
                        lambda: load_file(FIX / "verl/reference/fsdp2/global_step_2.safetensors"),
                        "verl's FSDP2 actor (2 ranks)", "float32"),
    "verl-fsdp2-actor": (str((VERL["fsdp2"] / "global_step_4" / "actor").relative_to(FIX)),
                         lambda: load_file(FIX / "verl/reference/fsdp2/global_step_4.safetensors"),
                         "verl's FSDP2 actor (2 ranks)", "float32"),
}
#: every fp32 layout, for the commands that run a whole pass (graft, delta, rank, eval)
COMMANDS_ON = tuple(k for k in LAYOUTS if LAYOUTS[k][3] == "float32")


def _path(layout: str) -> Path:
    return FIX / LAYOUTS[layout][0]


@pytest.fixture(scope="module")
def refs():
    cache = {}

    def get(layout):
        if layout not in cache:
            cache[layout] = LAYOUTS[layout][1]()
        return cache[layout]

    return get


@pytest.fixture(scope="module")
def ref_folders(tmp_path_factory, refs):
    """layout → an HF folder of its fp32 reference weights (base's config and tokenizer; the tied head left out)."""
    root = tmp_path_factory.mktemp("refs")
    made = {}

    def get(layout):
        if layout not in made:
            folder = root / layout
            folder.mkdir()
            for f in CONFIG_FILES:
                shutil.copy(BASE / f, folder / f)
            base_names = set(load_file(BASE / "model.safetensors"))
            sd = {_hf_name(n): t.contiguous() for n, t in refs(layout).items()}
            save_file({n: t for n, t in sd.items() if n in base_names}, folder / "model.safetensors")
            made[layout] = folder
        return made[layout]

    return get


def _hf_name(fqn: str) -> str:
    """A DCP key under HF's name: accelerate saves the Trainer's model under a ``model.`` container."""
    return fqn.removeprefix("model.") if fqn.startswith(("model.model.", "model.lm_head.")) else fqn


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=True)

    invoke.tmp = tmp_path
    return invoke


def _ok(res):
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _bytes(folder) -> dict[str, bytes]:
    ck = open_checkpoint(folder)
    return {n: tensor_bits(ck.read(n)).tobytes() for n in ck.names}


# ------------------------------------------------------------------------------------------ reads


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_reads_the_libraries_own_conversion_bit_for_bit(layout, refs):
    (path,) = checkpoints_of(_path(layout))
    ck = open_checkpoint(path)
    want = refs(layout)
    assert sorted(ck.names) == sorted(want)
    for n, t in want.items():
        got = ck.read(n)
        assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape), n
        assert torch.equal(got, t), n
    p = ck.precision
    assert p["dtype"] == LAYOUTS[layout][3] and LAYOUTS[layout][2] in p["source"] and p["below_trained"] is None


def test_the_masters_are_not_the_module_states_the_engine_saved_in_bf16():
    """The bf16 copies DeepSpeed keeps in its model states round the masters: the reader never takes them."""
    ms = torch.load(FIX / "deepspeed/engine-zero2-bf16/global_step4/mp_rank_00_model_states.pt", weights_only=True)
    ck = open_checkpoint(FIX / "deepspeed/engine-zero2-bf16")
    assert all(t.dtype == torch.bfloat16 for t in ms["module"].values())
    differ = [n for n, t in ms["module"].items() if not torch.equal(t.float(), ck.read(n))]
    assert len(differ) >= 10 and all(torch.equal(ms["module"][n], ck.read(n).bfloat16()) for n in ms["module"])


def test_a_trainer_checkpoint_with_bf16_weights_beside_its_deepspeed_states(cli):
    """trainer-zero2's checkpoint-N holds the Trainer's bf16 model.safetensors and the ZeRO states: the fp32 masters
    are read; with --no-pickle the bf16 file, said to be below the trained precision."""
    ckpt = FIX / "deepspeed/trainer-zero2/checkpoint-4"
    plain = open_checkpoint(ckpt, no_pickle=True)
    assert plain.kind == "hf-folder" and plain.precision["dtype"] == "bfloat16"
    assert "--no-pickle" in plain.precision["below_trained"] and "DeepSpeed checkpoint" in plain.precision["below_trained"]
    masters = open_checkpoint(ckpt)
    assert masters.kind == "deepspeed" and masters.precision["dtype"] == "float32"
    assert any("not its bf16 HF weights file" in n for n in masters.notes)


def test_only_files_that_hold_weights_are_opened(monkeypatch):
    """rng states, schedulers, training arguments, verl's optimizer and extra states and torchtitan's optimizer
    entries are never read."""
    opened: list[str] = []
    real = torch.load

    def spy(f, *a, **k):
        opened.append(Path(f).name if isinstance(f, (str, os.PathLike)) else "<bytes>")
        return real(f, *a, **k)

    monkeypatch.setattr(torch, "load", spy)
    for path in ("deepspeed/trainer-zero2/checkpoint-4", "verl/fsdp1/checkpoints/graftkit_fixtures/tiny_llama_fsdp1"):
        ck = open_checkpoint(FIX / path)
        for n in ck.names:
            ck.read(n)
    files = set(opened) - {"<bytes>"}
    assert files == {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                     "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "model_world_size_2_rank_0.pt",
                     "model_world_size_2_rank_1.pt"}, files
    from graftkit.weights.trainers import dcp

    chunks: list[str] = []
    real_chunk = dcp._load_chunk
    monkeypatch.setattr(dcp, "_load_chunk", lambda folder, info, fqn: chunks.append(fqn) or real_chunk(folder, info, fqn))
    ck = open_checkpoint(FIX / "dcp/torchtitan/step-4")
    for n in ck.names:
        ck.read(n)
    md = dcp.read_metadata(FIX / "dcp/torchtitan/step-4")
    assert {k.split(".")[0] for k in md.state_dict_metadata} >= {"optimizer", "train_state", "lr_scheduler"}
    assert chunks and not any(c.startswith(("optimizer", "train_state", "lr_scheduler")) for c in chunks)


@pytest.mark.parametrize("layout", ["verl-fsdp2-actor", "engine-zero3-3-ranks"])
def test_files_mapped_anew_while_two_threads_read_give_the_same_values(layout, refs, monkeypatch):
    """A delta reads on two threads; the readers re-map their files after every MAPPED_BUDGET bytes (here after
    every tensor), and a load under torch's process-wide safe_globals must never see another thread's end."""
    from concurrent.futures import ThreadPoolExecutor

    from graftkit.weights.trainers import common

    monkeypatch.setattr(common, "MAPPED_BUDGET", 1)
    loads = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loads.append(f) or real(f, *a, **k))
    (path,) = checkpoints_of(_path(layout))
    ck, want = open_checkpoint(path), refs(layout)
    opened = len(loads)
    names = list(want) * 6
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(ck.read, names))
    assert all(torch.equal(g, want[n]) for g, n in zip(got, names))
    assert len(loads) >= opened * len(names)  # the files were mapped anew after every tensor


# ------------------------------------------------------------------------------------------ commands


@pytest.mark.parametrize("layout", COMMANDS_ON)
def test_a_graft_of_each_layout_equals_the_fp32_splice(layout, cli, ref_folders):
    args = ("--base", BASE, "--groups", "attn,mlp", "--layers", "mid", "--json")
    got = _ok(cli("graft", "--from", _path(layout), "--out", cli.tmp / "direct", *args))
    want = _ok(cli("graft", "--from", ref_folders(layout), "--out", cli.tmp / "ref", *args))
    assert got["selected"] == want["selected"] and sum(s["tensors"] for s in got["selected"]) == 7  # layer 1's
    grafted, ref = _bytes(cli.tmp / "direct"), _bytes(cli.tmp / "ref")
    assert grafted == ref
    rl, base = load_file(ref_folders(layout) / "model.safetensors"), load_file(BASE / "model.safetensors")
    moved = [n for n in rl if ".layers.1." in n and (".self_attn." in n or ".mlp." in n)]
    assert len(moved) == 7 and all(grafted[n] == tensor_bits(rl[n]).tobytes() for n in moved)  # the trainer's fp32
    assert all(grafted[n] == tensor_bits(base[n]).tobytes() for n in base if n not in moved)
    parents = json.loads((cli.tmp / "direct" / "graftkit.json").read_text())["parents"]
    rl_parent = next(p for p in parents if p["role"] == "rl")
    assert rl_parent["precision"]["dtype"] == "float32" and LAYOUTS[layout][2] in rl_parent["precision"]["source"]


@pytest.mark.parametrize("layout", COMMANDS_ON)
def test_inspect_delta_and_rank_of_each_layout_equal_those_of_its_fp32_weights(layout, cli, ref_folders):
    def delta(rl, save, *flags):
        j = _ok(cli("delta", "--from", rl, "--base", BASE, "--save", save, "--json", *flags))
        return j, read_result(save)

    j, got = delta(_path(layout), cli.tmp / "direct.h5")
    _, want = delta(ref_folders(layout), cli.tmp / "ref.h5")
    for name in want.data:
        w, g = np.asarray(want[name]), np.asarray(got[name])
        assert (g.tobytes() == w.tobytes()) if w.dtype.kind in "fiub" else g.tolist() == w.tolist(), name
    (run,) = j["runs"].values()
    assert run["precision"]["exact"] and LAYOUTS[layout][2] in run["precision"]["source"]
    info = _ok(cli("inspect", _path(layout), "--config", BASE, "--json"))
    want_params = sum(t.numel() for n, t in load_file(ref_folders(layout) / "model.safetensors").items())
    assert sum(g["params"] for g in info["groups"].values()) == want_params and info["tied_embeddings"]
    assert LAYOUTS[layout][2] in info["precision"]["source"]
    _ok(cli("rank", "--what", "delta", "--model", _path(layout), "--base", BASE, "--json",
            "--save", cli.tmp / "rank.h5"))
    _ok(cli("rank", "--what", "delta", "--model", ref_folders(layout), "--base", BASE, "--json",
            "--save", cli.tmp / "rank-ref.h5"))
    a, b = read_result(cli.tmp / "rank.h5"), read_result(cli.tmp / "rank-ref.h5")
    assert len(b.data) > 0 and list(a.data) == list(b.data)
    for name in b.data:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert (x.tobytes() == y.tobytes()) if y.dtype.kind in "fiub" else x.tolist() == y.tolist(), name


def test_inspect_states_each_family_and_its_precision(cli):
    got = {k: _ok(cli("inspect", _path(k), "--json"))
           for k in ("torchtitan-run", "trainer-zero3-run", "verl-fsdp2-actor", "torchtitan-bf16")}
    assert got["trainer-zero3-run"]["kind"] == "deepspeed" and got["verl-fsdp2-actor"]["kind"] == "verl"
    assert got["trainer-zero3-run"]["precision"]["source"].startswith("fp32 master weights from ZeRO-3 optimizer")
    assert got["torchtitan-bf16"]["precision"]["dtype"] == "bfloat16"
    for k, info in got.items():
        assert sum(g["params"] for g in info["groups"].values()) > 0, k
    assert got["torchtitan-run"]["checkpoints"] == {"2": str(FIX / "dcp/torchtitan/step-2"),
                                                     "4": str(FIX / "dcp/torchtitan/step-4")}
    table = cli("inspect", _path("trainer-zero3-run"))
    assert table.exit_code == 0
    line = " ".join(table.stdout.split())
    assert "precision: float32, fp32 master weights from ZeRO-3 optimizer partitions (2 ranks;" in line


@pytest.mark.parametrize("layout", COMMANDS_ON)
def test_eval_builds_the_policy_from_the_layout_with_its_own_config(layout, refs):
    """A policy from a layout holds the trainer's fp32 weights; its config and tokenizer are the layout's own (a
    Trainer's checkpoint-N, verl's huggingface/), or --config where it has none (DCP folders, a raw engine's)."""
    from graftkit.core.errors import GraftkitError
    from graftkit.weights.hf import load_model

    (path,) = checkpoints_of(_path(layout))
    config = None
    if open_checkpoint(path).config_from is None:
        with pytest.raises(GraftkitError, match="pass --config"):
            load_model(path)
        config = BASE
    model, tok = load_model(path, config_dir=config)
    sd, want = model.state_dict(), {_hf_name(n): t for n, t in refs(layout).items()}
    assert tok is not None and set(want) <= set(sd)
    assert all(torch.equal(sd[n], t) for n, t in want.items())


@pytest.mark.slow
def test_eval_runs_on_a_layout_and_records_its_precision(cli):
    j = _ok(cli("eval", "--model", _path("verl-fsdp2-actor"), "--tasks", "click-button",
                "--seeds", "1", "--episodes", "1", "--json", "--save", cli.tmp / "ev.h5"))
    assert j["tasks"][0]["task"] == "click-button"
    model = read_result(cli.tmp / "ev.h5").attrs["model"]
    assert model["kind"] == "verl" and model["precision"]["source"].startswith("fp32 shards of verl's FSDP2 actor")


# ------------------------------------------------------------------------------------------ trajectories


@pytest.mark.parametrize("run, steps, label", [
    (VERL["fsdp1"], [2, 4], "tiny_llama_fsdp1-global_step_{}"),
    (FIX / "deepspeed/engine-zero3-bf16", [2, 4], "engine-zero3-bf16-global_step{}"),
    (FIX / "deepspeed/trainer-zero2", [2, 4], "trainer-zero2-checkpoint-{}"),
    (FIX / "dcp/torchtitan", [2, 4], "torchtitan-step-{}"),
    (FIX / "dcp/accelerate-fsdp1", [2, 4], "accelerate-fsdp1-checkpoint-{}"),
])
def test_a_runs_step_folders_are_its_trajectory(run, steps, label, cli):
    j = _ok(cli("delta", "--from", run, "--base", BASE, "--all-checkpoints", "--json",
                "--save", cli.tmp / "traj.h5"))
    assert list(j["runs"]) == [label.format(s) for s in steps]
    res = read_result(cli.tmp / "traj.h5")
    assert list(res.attrs["steps"]) == steps
    movement = [j["runs"][label.format(s)]["total"]["fro_delta"] for s in steps]
    assert 0 < movement[0] < movement[1]  # four steps move the weights further than two
    assert all(j["runs"][label.format(s)]["precision"]["exact"] for s in steps)


def test_accelerates_deepspeed_save_state_layout(tmp_path):
    """accelerate's save_state under DeepSpeed: ``checkpoint_N/pytorch_model/`` (the engine's tag) and ``latest``
    naming it; a project folder of ``checkpoint_N`` is a run."""
    for step in (2, 4):
        ckpt = tmp_path / "checkpoints" / f"checkpoint_{step // 2 - 1}"
        shutil.copytree(FIX / f"deepspeed/engine-zero3-bf16/global_step{step}", ckpt / "pytorch_model")
        (ckpt / "latest").write_text("pytorch_model")
    paths = checkpoints_of(tmp_path / "checkpoints", all_checkpoints=True)
    assert [p.name for p in paths] == ["checkpoint_0", "checkpoint_1"]
    for p, step in zip(paths, (2, 4)):
        ck = open_checkpoint(p)
        assert all(torch.equal(ck.read(n), t) for n, t in _ds_ref("engine-zero3-bf16", step).items())


def test_the_trajectory_reads_each_step_as_its_reference(refs):
    """Step 2 of a run is the step-2 reference, not the latest one."""
    paths = checkpoints_of(FIX / "deepspeed/engine-zero3-bf16", all_checkpoints=True)
    assert [p.name for p in paths] == ["global_step2", "global_step4"]
    ck = open_checkpoint(paths[0])
    want = _ds_ref("engine-zero3-bf16", 2)
    assert all(torch.equal(ck.read(n), t) for n, t in want.items())
    vp = checkpoints_of(VERL["fsdp2"], all_checkpoints=True)
    assert [p.name for p in vp] == ["global_step_2", "global_step_4"]


# ------------------------------------------------------------------------------------------ precision


def _bf16_figures(rl: dict, base: dict, names) -> tuple[float, float]:
    """(share of moved entries whose bf16 roundings equal base's, ‖bf16(W') − W'‖ / ‖Δ‖) over ``names``, in torch."""
    moved = erased = 0
    rnd = dd = 0.0
    for n in names:
        r, b = rl[n].double(), base[n].double()
        m = rl[n] != base[n]
        moved += int(m.sum())
        erased += int((m & (rl[n].bfloat16() == base[n].bfloat16())).sum())
        rnd += float(((rl[n].bfloat16().double() - r) ** 2).sum())
        dd += float(((r - b) ** 2).sum())
    return erased / moved, (rnd / dd) ** 0.5


def test_delta_measures_what_bf16_storage_erases_exactly_when_it_reads_the_masters(cli, refs):
    base = load_file(BASE / "model.safetensors")
    rl = refs("engine-zero3-bf16")
    j = _ok(cli("delta", "--from", _path("engine-zero3-bf16"), "--base", BASE, "--json",
                "--save", cli.tmp / "d.h5"))
    (p,) = [r["precision"] for r in j["runs"].values()]
    erased, ratio = _bf16_figures(rl, base, list(base))
    assert p["exact"] and p["probe"] == "bf16"
    assert p["frac_erased"] == pytest.approx(erased, rel=1e-12) and p["round_to_delta"] == pytest.approx(ratio, rel=1e-5)
    mlp = [n for n in base if ".mlp." in n]
    erased_mlp, ratio_mlp = _bf16_figures(rl, base, mlp)
    assert p["groups"]["mlp"]["frac_erased"] == pytest.approx(erased_mlp, rel=1e-12)
    assert p["groups"]["mlp"]["round_to_delta"] == pytest.approx(ratio_mlp, rel=1e-5)
    # at lr 1e-5 over four steps, bf16 storage erases most of the update's entries
    assert 0.5 < erased < 0.95
    table = cli("delta", "--from", _path("engine-zero3-bf16"), "--base", BASE, "--save", cli.tmp / "t.h5")
    line = " ".join(table.stdout.split())
    assert (f"Stored in bf16, rounding would erase {100 * p['frac_erased']:.2f}% of the moved entries (bf16 copies of "
            f"both sides show {100 * p['frac_unchanged_bf16']:.2f}% of entries unchanged) and add noise of "
            f"{p['round_to_delta']:.3g}× ‖Δ‖_F") in line


def test_a_bf16_copy_says_its_movement_may_be_rounding_and_bounds_it(cli, refs):
    """The Trainer's bf16 model.safetensors of trainer-zero2 (what most published RL checkpoints are), read with
    --no-pickle: the rounding is bounded, never counted, and the bound holds against the masters."""
    ckpt = FIX / "deepspeed/trainer-zero2/checkpoint-4"
    j = _ok(cli("delta", "--from", ckpt, "--base", BASE, "--no-pickle", "--json", "--save", cli.tmp / "d.h5"))
    (run,) = j["runs"].values()
    p = run["precision"]
    assert p["dtype"] == "bfloat16" and not p["exact"] and p["frac_erased"] is None and "--no-pickle" in p["below_trained"]
    bf16, masters = load_file(ckpt / "model.safetensors"), refs("trainer-zero2")
    base = load_file(BASE / "model.safetensors")
    names = list(base)
    rounding = sum(float(((bf16[n].double() - masters[n].double()) ** 2).sum()) for n in names) ** 0.5
    measured = run["total"]["fro_delta"]
    assert rounding / measured <= p["round_to_delta"]
    assert p["round_to_delta"] > 0.1  # at this step size the bound is no small share of the delta
    table = cli("delta", "--from", ckpt, "--base", BASE, "--no-pickle", "--save", cli.tmp / "t.h5")
    line = " ".join(table.stdout.split())
    assert f"may be up to {p['round_to_delta']:.3g}× ‖Δ‖_F" in line and "may be rounding artefacts" in line
    # the sparsity a bf16 copy shows is not the trainer's: entries bitwise unchanged differ per group
    exact = _ok(cli("delta", "--from", ckpt, "--base", BASE, "--json", "--save", cli.tmp / "e.h5"))
    (truth,) = exact["runs"].values()
    assert truth["groups"]["norm"]["frac_unchanged"] != run["groups"]["norm"]["frac_unchanged"]


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("layout, convert", [
    ("fsdp2-dcp", "dcp_to_torch"), ("trainer-zero3-run", "zero_to_fp32.py"), ("verl-fsdp1-run", "verl.model_merger"),
])
def test_no_pickle_refuses_every_layout_naming_its_converter(layout, convert, cli):
    _one_line_error(cli("delta", "--from", _path(layout), "--base", BASE, "--no-pickle"), "--no-pickle", convert,
                    "pickles", "restricted unpickler")


def test_allow_pickle_is_accepted_and_changes_nothing(cli):
    """Scripts written when pickles needed --allow-pickle still run: the flag is accepted, and reads what is read
    without it."""
    for layout in ("trainer-zero3-run", "verl-fsdp2-actor"):
        plain = _ok(cli("inspect", _path(layout), "--json"))
        assert _ok(cli("inspect", _path(layout), "--allow-pickle", "--json")) == plain
        assert "restricted unpickler" in plain["precision"]["source"]
    ckpt = FIX / "deepspeed/trainer-zero2/checkpoint-4"
    assert open_checkpoint(ckpt, allow_pickle=True).precision == open_checkpoint(ckpt).precision
    assert "changes nothing" in " ".join(cli("delta", "--help").stdout.split())


def test_every_reader_is_registered_recognised_and_recorded(cli, tmp_path):
    """Each reader of the registry recognises what it reads (and no earlier reader takes it), its kind is what the
    provenance of every result records, its precision line says when the values were unpickled, and --no-pickle
    refuses every reader that loads pickles; a reader that refuses is one line whatever the flags."""
    from graftkit.weights import describe

    sd = load_file(BASE / "model.safetensors")
    (tmp_path / "pt").mkdir()
    shutil.copy(BASE / "config.json", tmp_path / "pt" / "config.json")
    torch.save(sd, tmp_path / "pt" / "pytorch_model.bin")
    torch.save({"state_dict": sd}, tmp_path / "rl.ckpt")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    mega = tmp_path / "iter_0000010"
    mega.mkdir()
    (mega / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    reads = {"safetensors-file": [BASE / "model.safetensors"], "hf-folder": [BASE],
             "pickle": [tmp_path / "rl.ckpt", tmp_path / "pt"], "dcp": [_path("fsdp2-dcp")],
             "deepspeed": [_path("engine-zero2-bf16")], "verl": [_path("verl-fsdp2-actor")]}
    refuses = {"layout-piece": FIX / "dcp/fsdp2-model/__0_0.distcp",
               "trainer-state": FIX / "deepspeed/trainer-zero2/checkpoint-4/training_args.bin",
               "lora-adapter": tmp_path / "adapter", "megatron": mega}
    assert {r.kind for r in READERS if not r.refuses} == set(reads)
    assert {r.kind for r in READERS if r.refuses} == set(refuses)
    recognisers = [recognise(p)[0] for ps in reads.values() for p in ps] + [recognise(p)[0] for p in refuses.values()]
    assert sorted(map(id, recognisers)) == sorted(map(id, READERS))  # every reader, each once
    for kind, paths in reads.items():
        for path in paths:
            reader = recognise(path)[0]
            record = describe(open_checkpoint(path))
            assert reader.kind == kind == record["kind"], path
            assert ("restricted unpickler" in record["precision"]["source"]) == reader.pickled, path
            info = _ok(cli("inspect", path, "--config", BASE, "--json"))
            assert info["kind"] == kind and info["precision"] == record["precision"], path
            refused = cli("inspect", path, "--config", BASE, "--no-pickle", "--json")
            if reader.pickled:
                _one_line_error(refused, "--no-pickle", path.name, "safetensors only")
            else:
                assert _ok(refused) == info, path
    from graftkit.core.errors import GraftkitError

    for kind, path in refuses.items():
        for no_pickle in (False, True):
            with pytest.raises(GraftkitError) as err:
                open_checkpoint(path, no_pickle=no_pickle)
            assert str(path) in str(err.value) and "\n" not in str(err.value), kind


@pytest.mark.parametrize("part, says", [
    ("dcp/fsdp2-model/__0_0.distcp", "one file of a torch.distributed.checkpoint folder"),
    ("dcp/fsdp2-model/.metadata", "one file of a torch.distributed.checkpoint folder"),
    ("deepspeed/engine-zero3-bf16/global_step4/zero_pp_rank_0_mp_rank_00_model_states.pt", "one file of a DeepSpeed"),
    ("verl/fsdp2/checkpoints/graftkit_fixtures/tiny_llama_fsdp2/global_step_4/actor/model_world_size_2_rank_0.pt",
     "one file of a verl FSDP actor checkpoint"),
    ("dcp/accelerate-fsdp1/checkpoint-4/rng_state_0.pth", "holds no model weights"),
    ("deepspeed/trainer-zero2/checkpoint-4/training_args.bin", "holds no model weights"),
])
def test_a_part_of_a_layout_names_what_to_pass(part, says, cli):
    _one_line_error(cli("inspect", FIX / part), says)


def _copy(src: Path, dst: Path, skip=()) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*skip))
    return dst


def test_zero3_placeholders_are_never_weights_and_bf16_module_states_say_so(cli, tmp_path):
    z3 = _copy(FIX / "deepspeed/engine-zero3-bf16/global_step4", tmp_path / "z3/global_step4", ("*optim_states.pt",))
    _one_line_error(cli("inspect", z3), "ZeRO-3", "placeholders", "zero_to_fp32.py")
    z2 = _copy(FIX / "deepspeed/engine-zero2-bf16/global_step4", tmp_path / "z2/global_step4", ("*optim_states.pt",))
    j = _ok(cli("delta", "--from", z2, "--base", BASE, "--json", "--save", tmp_path / "z2.h5"))
    (p,) = [r["precision"] for r in j["runs"].values()]
    assert p["dtype"] == "bfloat16" and "bf16 module states" in p["source"] and "no optimizer files" in p["below_trained"]


def test_incomplete_or_foreign_checkpoints_are_one_clear_error(cli, tmp_path):
    actor = _copy(VERL["fsdp1"] / "global_step_4" / "actor", tmp_path / "global_step_4" / "actor",
                  ("model_world_size_2_rank_1.pt",))
    _one_line_error(cli("inspect", actor.parent), "no model file for rank(s) 1")
    zero = _copy(FIX / "deepspeed/engine-zero2-bf16/global_step4", tmp_path / "zero/global_step4",
                 ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",))
    _one_line_error(cli("inspect", zero), "2 ranks but 1 optimizer files")
    cut = _copy(FIX / "dcp/fsdp2-model", tmp_path / "cut")
    shard = cut / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    _one_line_error(cli("delta", "--from", cut, "--base", BASE, "--save", tmp_path / "x.h5"),
                    "ends before tensor")
    mega = tmp_path / "iter_0000010"
    mega.mkdir()
    (mega / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    (mega / "__0_0.distcp").write_bytes(b"\0")
    _one_line_error(cli("inspect", mega), "Megatron-Core", "model_merger merge --backend megatron")


def test_a_folder_with_no_model_tensors_never_exits_0(cli, tmp_path):
    import torch.distributed.checkpoint as dcp

    dcp.save({"optimizer": {"state": {"m": torch.zeros(3)}}, "train_state": {"step": torch.tensor(4)}},
             storage_writer=dcp.FileSystemWriter(tmp_path / "opt-only"), no_dist=True)
    _one_line_error(cli("inspect", tmp_path / "opt-only"), "holds no model tensors")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_dcp_metadata_admits_only_dcps_own_classes(cli, tmp_path):
    folder = _copy(FIX / "dcp/fsdp2-model", tmp_path / "evil")
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload()))
    _one_line_error(cli("inspect", folder), "no class of DCP's metadata")
    assert not (tmp_path / "PWNED").exists()
    # a dotted name reaches through an admitted module to what it imports: filesystem's os.system
    module, name, arg = (x.encode() for x in ("torch.distributed.checkpoint.filesystem", "os.system", "touch PWNED"))
    (folder / ".metadata").write_bytes(b"\x80\x04" + b"\x8c" + bytes([len(module)]) + module + b"\x8c"
                                       + bytes([len(name)]) + name + b"\x93" + b"\x8c" + bytes([len(arg)]) + arg
                                       + b"\x85R.")
    _one_line_error(cli("inspect", folder), "no class of DCP's metadata")
    assert not (tmp_path / "PWNED").exists()
    from graftkit.weights.trainers.dcp import _MetadataUnpickler

    assert not _MetadataUnpickler._own_class("torch.distributed.checkpoint.filesystem", "os")
    assert _MetadataUnpickler._own_class("torch.distributed.checkpoint.metadata", "Metadata")


def test_a_verl_shard_pickle_with_foreign_classes_is_refused(cli, tmp_path):
    actor = _copy(VERL["fsdp2"] / "global_step_4" / "actor", tmp_path / "global_step_4" / "actor")
    torch.save({"w": _Payload()}, actor / "model_world_size_2_rank_1.pt")
    _one_line_error(cli("inspect", actor), "weights_only=True", "verl.model_merger")
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_layouts_are_recognised_by_what_is_on_disk():
    for k, (rel, *_) in LAYOUTS.items():
        (path,) = checkpoints_of(_path(k))
        family = "dcp" if rel.startswith("dcp") else rel.split("/")[0]
        reader = next(r for r in READERS if r.layout and r.recognise(path) is not None)
        assert reader.kind == family and layout_of(path) == reader.recognise(path), k
        assert recognise(path)[0] is reader or recognise(path)[0].kind == "hf-folder", k  # a Trainer's bf16 copy beside
    assert recognise(BASE)[0].kind == "hf-folder" and layout_of(BASE) is None and recognise(FIX / "dcp") is None
    assert layout_of(FIX / "dcp/torchtitan") is None  # a run: its step folders are the checkpoints
    assert layout_of(VERL["fsdp1"]).where == VERL["fsdp1"] / "global_step_4" / "actor"  # via its latest file


# ------------------------------------------------------------------------------------------ the writers


@pytest.mark.slow
def test_the_dcp_writer_writes_what_the_fixtures_hold(tmp_path):
    """write_dcp.py regenerates the DCP fixtures with torch and transformers alone (both in this environment; it checks
    its folders against the live model and dcp_to_torch_save itself): graftkit reads what it wrote as torch's converter
    does, bit for bit, and the values are the committed ones up to the last bits of float sums."""
    out = subprocess.run([sys.executable, str(FIX / "dcp" / "write_dcp.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for rel, inner in (("fsdp2-model", ""), ("torchtitan/step-4", ""), ("torchtitan-model-only/step-4", ""),
                       ("accelerate-fsdp2/checkpoint-4", "pytorch_model_fsdp_0")):
        a, b = open_checkpoint(tmp_path / rel), open_checkpoint(FIX / "dcp" / rel)
        want = _dcp_ref(tmp_path / rel / inner)
        assert sorted(a.names) == sorted(want) == sorted(b.names), rel
        assert all(torch.equal(a.read(n), t) for n, t in want.items()), rel
        assert all(torch.allclose(a.read(n).float(), b.read(n).float(), rtol=0, atol=1e-6) for n in want), rel


@pytest.mark.slow
@pytest.mark.parametrize("library, writer", [("deepspeed", "deepspeed/write_deepspeed.py"), ("verl", "verl/write_verl.py")])
def test_the_deepspeed_and_verl_writers_where_their_libraries_are_installed(library, writer, tmp_path):
    """deepspeed and verl are not installed by `make test` (the fixtures they wrote are committed, with the
    versions and the commands in each README); where they are, the writer regenerates the fixtures and checks
    them against the library's own conversion."""
    pytest.importorskip(library)
    out = subprocess.run([sys.executable, str(FIX / writer), "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=1800)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
