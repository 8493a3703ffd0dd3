"""weights/resolve.py: which checkpoint a path means and which base it is measured against, one branch a test.

The folders are built from a few files (a one-tensor model.safetensors, graftkit.json, adapter_config.json):
resolution reads only those, never the weights, except where a LoRA adapter is merged (:func:`open_model`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graftkit.core.errors import GraftkitError
from graftkit.weights import Checkpoint, open_checkpoint, open_one
from graftkit.core.files import require
from graftkit.weights.resolve import base_of, checkpoint_of, checkpoints_of, open_model, recorded_base

Q = "model.layers.0.self_attn.q_proj.weight"


def _model(folder: Path, parent: Path | None = None, seed: int = 0) -> Path:
    """A folder holding weights (one q_proj matrix), with a graftkit.json naming ``parent`` when given."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    save_file({Q: torch.randn(4, 4, generator=g)}, str(folder / "model.safetensors"))
    if parent is not None:
        (folder / "graftkit.json").write_text(json.dumps({"base_model": {"path": str(parent)}}))
    return folder


def _adapter(folder: Path, base_name: str | None, parent: Path | None = None) -> Path:
    """A PEFT LoRA adapter (r = 2 on q_proj) whose adapter_config names ``base_name``, with a graftkit.json
    naming ``parent`` when given."""
    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(1)
    save_file({f"base_model.model.{Q[:-len('.weight')]}.lora_A.weight": torch.randn(2, 4, generator=g),
               f"base_model.model.{Q[:-len('.weight')]}.lora_B.weight": torch.randn(4, 2, generator=g)},
              str(folder / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    if base_name is not None:
        cfg["base_model_name_or_path"] = base_name
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    if parent is not None:
        (folder / "graftkit.json").write_text(json.dumps({"base_model": {"path": str(parent)}}))
    return folder


def _error(fn, *args, **kw) -> str:
    with pytest.raises(GraftkitError) as err:
        fn(*args, **kw)
    msg = str(err.value)
    assert "\n" not in msg, msg  # one line, as the command line prints it
    return msg


# ------------------------------------------------------------------------------------------ base_of


def test_the_parent_recorded_in_graftkit_json_is_the_base(tmp_path):
    sft = _model(tmp_path / "sft")
    rl = _model(tmp_path / "rl", parent=sft, seed=1)
    assert base_of(rl) == sft and recorded_base(rl) == sft


def test_an_explicit_base_wins_over_every_record(tmp_path):
    sft, other = _model(tmp_path / "sft"), _model(tmp_path / "other", seed=2)
    rl = _model(tmp_path / "rl", parent=sft, seed=1)
    adapter = _adapter(tmp_path / "adapter", str(sft))
    assert base_of(rl, other) == other and base_of(adapter, other, flag="--vs") == other


def test_an_explicit_base_that_does_not_exist_names_the_flag(tmp_path):
    rl = _model(tmp_path / "rl", parent=_model(tmp_path / "sft"), seed=1)
    msg = _error(base_of, rl, tmp_path / "nobase", flag="--vs")
    assert str(tmp_path / "nobase") in msg and "no such file or folder" in msg and "--vs" in msg


def test_a_recorded_parent_that_is_gone_is_an_error_naming_the_flag(tmp_path):
    rl = _model(tmp_path / "rl", parent=tmp_path / "moved", seed=1)
    msg = _error(base_of, rl, flag="--vs")
    assert "no longer exists" in msg and str(tmp_path / "moved") in msg and "--vs" in msg and "--base" not in msg


def test_a_lora_adapter_over_a_local_folder_is_merged_over_it(tmp_path):
    sft = _model(tmp_path / "sft")
    adapter = _adapter(tmp_path / "adapter", str(sft))
    assert base_of(adapter) == sft and recorded_base(adapter) == sft


def test_a_lora_adapter_over_a_hub_id_is_an_error_naming_the_flag(tmp_path):
    adapter = _adapter(tmp_path / "adapter", "Qwen/Qwen3-0.6B")
    msg = _error(base_of, adapter, flag="--vs")
    assert "'Qwen/Qwen3-0.6B'" in msg and "never downloads" in msg and "--vs DIR" in msg and "--base" not in msg
    assert recorded_base(adapter) is None


def test_a_lora_adapter_that_names_no_base_is_an_error(tmp_path):
    msg = _error(base_of, _adapter(tmp_path / "adapter", None))
    assert "names no base model" in msg and "--base DIR" in msg


def test_graftkit_json_comes_before_the_adapter_config(tmp_path):
    """graftkit writes its parent as a resolved path; PEFT keeps the name the base was loaded by (here a hub id,
    which ``rank`` used to refuse while ``delta`` and ``graft`` took the parent)."""
    sft = _model(tmp_path / "sft")
    adapter = _adapter(tmp_path / "adapter", "Qwen/Qwen3-0.6B", parent=sft)
    assert base_of(adapter, flag="--vs") == sft and recorded_base(adapter) == sft


def test_a_model_that_records_no_base_is_an_error_naming_the_flag(tmp_path):
    msg = _error(base_of, _model(tmp_path / "sft"), flag="--vs")
    assert "records no SFT parent" in msg and "--vs SFT_FOLDER" in msg


# ------------------------------------------------------------------------ trainer output_dir, missing paths


def test_a_trainer_output_dir_means_its_last_checkpoint_by_step_number(tmp_path):
    """checkpoint-10 comes after checkpoint-9 (string order would put 9 last); its base is what it records."""
    sft9, sft10 = _model(tmp_path / "sft9"), _model(tmp_path / "sft10", seed=3)
    out = tmp_path / "out"
    nine = _model(out / "checkpoint-9", parent=sft9, seed=1)
    ten = _model(out / "checkpoint-10", parent=sft10, seed=2)
    (out / "checkpoint-11").mkdir()  # a step folder holding no weights (a save that was cut short) is no checkpoint
    assert sorted(p.name for p in out.iterdir())[-1] == "checkpoint-9"
    assert checkpoint_of(out) == ten and checkpoints_of(out) == [ten]
    assert checkpoints_of(out, all_checkpoints=True) == [nine, ten]
    assert checkpoint_of(nine) == nine  # a checkpoint stands for itself
    assert base_of(out) == sft10


def test_all_checkpoints_of_a_folder_that_is_no_trainer_run_is_an_error(tmp_path):
    msg = _error(checkpoints_of, _model(tmp_path / "sft"), all_checkpoints=True)
    assert "not a trainer output_dir" in msg and "--all-checkpoints" in msg


def test_a_missing_path_is_one_error_naming_the_path_what_was_expected_and_the_flag(tmp_path):
    nope = tmp_path / "nope"
    for fn, kw in ((checkpoint_of, {"flag": "--from"}), (checkpoints_of, {"flag": "--from"}),
                   (require, {"flag": "--from"})):
        msg = _error(fn, nope, **kw)
        assert msg.startswith(f"{nope}: no such file or folder (expected ") and "--from" in msg, msg
    msg = _error(base_of, nope)
    assert msg.startswith(f"{nope}: no such file or folder") and "check the path" in msg
    assert _error(open_checkpoint, nope) == msg  # the library's own reader says it the same way


# ----------------------------------------------------------------------------------------- open_model


def test_open_model_merges_an_adapter_over_its_base_and_reads_a_checkpoint_alone(tmp_path):
    sft = _model(tmp_path / "sft")
    adapter = _adapter(tmp_path / "adapter", str(sft))
    merged, base = open_model(adapter), open_checkpoint(sft)
    assert merged.kind == "lora-merged" and merged.provenance["lora"]["base"] == str(sft)
    assert not torch.equal(merged.read(Q), base.read(Q))
    torch.testing.assert_close(merged.read(Q), base.read(Q) + merged.deltas(Q))
    full = open_model(sft)
    assert full.kind == "hf-folder" and torch.equal(full.read(Q), open_one(sft).read(Q))
    hub = _adapter(tmp_path / "hub", "Qwen/Qwen3-0.6B")
    assert "--vs DIR" in _error(open_model, hub, flag="--vs")


def test_a_checkpoint_is_built_by_name_and_never_changed_after(tmp_path):
    ck = open_checkpoint(_model(tmp_path / "sft"))
    with pytest.raises(TypeError):
        Checkpoint(ck.path, ck.kind, ck.metas, ck.reader)  # the fields are keyword-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        ck.notes = ("changed",)
    noted = dataclasses.replace(ck, notes=(*ck.notes, "a note"))
    assert noted.notes[-1] == "a note" and ck.notes == () and noted.read(Q).equal(ck.read(Q))
