"""Single-file PyTorch checkpoints (Lightning .ckpt, nanoGPT .pt, DDP, plain .pth) as either side of a pair.

The planted RL folder's state dict is written in each style with ``torch.save``; delta, graft (export and
``--eval``) and rank on each must give exactly what the same command gives on the RL safetensors folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.results.store import read_result
from graftkit.weights import open_checkpoint, read_tensors, tensor_bits
from planted import planted_pair


class HyperParameters:
    """A custom class in a checkpoint's pickle, as Lightning's hyper-parameters often are."""

    lr = 1e-5


#: style -> (file name, how the state dict is wrapped)
STYLES = {
    "lightning": ("rl.ckpt", lambda sd: {"state_dict": {f"model.{k}": v for k, v in sd.items()}, "epoch": 3,
                                         "global_step": 12}),
    "nanogpt": ("ckpt.pt", lambda sd: {"model": {f"_orig_mod.{k}": v for k, v in sd.items()}, "iter_num": 10,
                                       "model_args": {"n_layer": 6}, "best_val_loss": torch.tensor(1.5)}),
    "ddp": ("ddp.bin", lambda sd: {f"module.{k}": v for k, v in sd.items()}),
    "plain": ("plain.pth", lambda sd: dict(sd)),
}
PREFIX = {"lightning": "'model.'", "nanogpt": "'_orig_mod.'", "ddp": "'module.'", "plain": "no prefix"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("single")
    sft, rl = planted_pair(root / "pair")
    sd = read_tensors(rl / "model.safetensors")
    files = {}
    for style, (name, wrap) in STYLES.items():
        files[style] = root / name
        torch.save(wrap(sd), files[style])
    files["legacy"] = root / "legacy.pt"  # the pre-zip format: read without mmap
    torch.save(sd, files["legacy"], _use_new_zipfile_serialization=False)
    files["sft"] = root / "sft.pth"
    torch.save(read_tensors(sft / "model.safetensors"), files["sft"])
    return {"root": root, "sft": sft, "rl": rl, "files": files, "sd": sd}


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
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _tensors(folder) -> dict[str, bytes]:
    ck = open_checkpoint(folder)
    return {n: tensor_bits(ck.read(n)).tobytes() for n in ck.names}


def _delta(cli, rl, base, save):
    j = _ok(cli("delta", "--from", rl, "--base", base, "--save", save, "--json"))
    (run,) = j["runs"].values()
    return j, run, read_result(save)


STYLE_IDS = [*STYLES, "legacy"]


@pytest.mark.parametrize("style", STYLE_IDS)
def test_delta_of_a_single_file_equals_the_folders(world, cli, style):
    _, want, want_res = _delta(cli, world["rl"], world["sft"], cli.tmp / "folder.h5")
    j, got, got_res = _delta(cli, world["files"][style], world["sft"], cli.tmp / "file.h5")
    read_from = got.pop("precision").pop("source"), want.pop("precision").pop("source")
    assert read_from == ("float32 tensors as stored (a pickled state dict), read through graftkit's restricted "
                         "unpickler (weights_only, allowlisted classes)", "float32 tensors as stored (safetensors files)")
    assert got == want
    for name in want_res.data:
        w, g = np.asarray(want_res[name]), np.asarray(got_res[name])
        assert (g.tobytes() == w.tobytes()) if w.dtype.kind in "fiub" else g.tolist() == w.tolist(), name
    note = " ".join(j["notes"])
    assert f"{PREFIX.get(style, 'no prefix')} stripped" in note and str(world["sft"]) in note
    if style == "lightning":
        assert "state dict under 'state_dict'" in note
    table = cli("delta", "--from", world["files"][style], "--base", world["sft"], "--save", cli.tmp / "t.h5")
    assert table.exit_code == 0 and "note: " in table.stdout and "stripped" in table.stdout


@pytest.mark.parametrize("style", STYLE_IDS)
def test_graft_export_of_a_single_file_is_bit_exact_and_loads(world, cli, style):
    from transformers import AutoModelForCausalLM

    args = ("--base", world["sft"], "--groups", "attn,mlp", "--layers", "late", "--json")
    want = _ok(cli("graft", "--from", world["rl"], "--out", cli.tmp / "ref", *args))
    got = _ok(cli("graft", "--from", world["files"][style], "--out", cli.tmp / "out", *args))
    assert got["selected"] == want["selected"] and any("stripped" in n for n in got["notes"])
    assert _tensors(cli.tmp / "out") == _tensors(cli.tmp / "ref")
    for f in ("config.json", "tokenizer.json"):
        assert (cli.tmp / "out" / f).read_bytes() == (world["sft"] / f).read_bytes()
    model = AutoModelForCausalLM.from_pretrained(cli.tmp / "out")
    assert torch.equal(model.state_dict()["model.layers.5.mlp.up_proj.weight"],
                       world["sd"]["model.layers.5.mlp.up_proj.weight"])


def test_graft_eval_of_a_single_file_equals_the_folders(world, cli):
    args = ("--base", world["sft"], "--groups", "attn,mlp", "--eval", "--tasks", "click-tab", "--seeds", "1",
            "--episodes", "1", "--max-new-tokens", "4", "--json")
    want = _ok(cli("graft", "--from", world["rl"], *args, "--save", cli.tmp / "ref.h5"))
    got = _ok(cli("graft", "--from", world["files"]["lightning"], *args, "--save", cli.tmp / "file.h5"))
    (w,), (g,) = want["runs"].values(), got["runs"].values()
    assert [c["success"] for c in g["configs"]] == [c["success"] for c in w["configs"]]
    assert any("'model.' stripped" in n for n in got["notes"])


@pytest.mark.parametrize("style", STYLE_IDS)
def test_rank_of_a_single_file_equals_the_folders(world, cli, style):
    f = world["files"][style]
    for what in (("--what", "weights"), ("--what", "delta", "--base", world["sft"])):
        want = _ok(cli("rank", "--model", world["rl"], *what, "--save", cli.tmp / "ref.h5", "--json"))
        got = _ok(cli("rank", "--model", f, *what, "--save", cli.tmp / "f.h5", "--json"))
        (w,), (g,) = want["models"].values(), got["models"].values()
        assert g["layers"] == w["layers"] and g["outside_decoder"] == w["outside_decoder"]
        assert any("stripped" in n for n in g["notes"])


def test_a_single_file_base_takes_the_rl_folders_names_and_config(world, cli):
    _, want, _ = _delta(cli, world["rl"], world["sft"], cli.tmp / "ref.h5")
    _, got, _ = _delta(cli, world["rl"], world["files"]["sft"], cli.tmp / "f.h5")
    assert got == want
    args = ("--groups", "attn,mlp", "--json")
    _ok(cli("graft", "--from", world["rl"], "--base", world["sft"], "--out", cli.tmp / "ref", *args))
    _ok(cli("graft", "--from", world["rl"], "--base", world["files"]["sft"], "--out", cli.tmp / "out", *args))
    assert _tensors(cli.tmp / "out") == _tensors(cli.tmp / "ref")
    assert (cli.tmp / "out" / "config.json").read_bytes() == (world["rl"] / "config.json").read_bytes()


def test_config_option_names_the_config_folder(world, cli):
    j = _ok(cli("inspect", world["files"]["lightning"], "--config", world["sft"], "--json"))
    assert j["model_type"] == "qwen3" and j["layers"]["decoder"] == 6
    assert any(f"config from {world['sft']}" in n for n in j["notes"])
    _one_line_error(cli("inspect", world["files"]["plain"], "--config", cli.tmp),
                    "--config", "no config.json")


def test_refused_objects_are_one_line_naming_them(world, cli):
    bad = cli.tmp / "lightning.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in world["sd"].items()}, "hyper_parameters": HyperParameters()},
               bad)
    line = _one_line_error(cli("graft", "--from", bad, "--base", world["sft"], "--groups", "attn"),
                           "HyperParameters", "weights_only=True", "safetensors")
    assert "add_safe_globals" not in line and "weights_only=False" not in line


def test_no_pickle_refuses_every_style_naming_its_file(world, cli):
    for style in STYLES:
        _one_line_error(cli("delta", "--from", world["files"][style], "--base", world["sft"], "--no-pickle"),
                        "--no-pickle", str(world["files"][style]), "safetensors only")
    # a pickled base too
    _one_line_error(cli("delta", "--from", world["rl"], "--base", world["files"]["sft"], "--no-pickle"),
                    "--no-pickle", str(world["files"]["sft"]))


def test_tensors_that_match_nothing_are_one_error_or_ignored_with_keep_base(world, cli):
    f = cli.tmp / "extra.ckpt"
    sd = {f"model.{k}": v for k, v in world["sd"].items()}
    torch.save({"state_dict": {**sd, "model.value_head.weight": torch.zeros(1, 64)}}, f)
    args = ("graft", "--from", f, "--base", world["sft"], "--groups", "attn,mlp")
    _one_line_error(cli(*args, "--out", cli.tmp / "x"), "model.value_head.weight", "--unknown keep-base")
    _one_line_error(cli(*args, "--unknown", "keep-base", "--out", cli.tmp, "--force"), "overlaps the input")
    got = _ok(cli(*args, "--unknown", "keep-base", "--out", cli.tmp / "out", "--json"))  # beside the file: fine
    assert any("value_head" in n and "ignored" in n for n in got["notes"])
    _ok(cli("graft", "--from", world["rl"], "--base", world["sft"], "--groups", "attn,mlp", "--out", cli.tmp / "ref",
            "--json"))
    assert _tensors(cli.tmp / "out") == _tensors(cli.tmp / "ref")
    other = cli.tmp / "other.pt"
    torch.save({"model": {f"encoder.{k}": v for k, v in world["sd"].items()}}, other)
    _one_line_error(cli("delta", "--from", other, "--base", world["sft"], "--unknown", "keep-base"),
                    "match no tensor", "expected names like")


def test_no_state_dict_inside_is_one_line(world, cli):
    f = cli.tmp / "opt.pt"
    torch.save({"optimizer": {"lr": 0.1}, "epoch": 3}, f)
    _one_line_error(cli("delta", "--from", f, "--base", world["sft"]),
                    "not a state dict of tensors", "'optimizer'")


def test_a_tied_head_saved_twice_is_one_tensor(tmp_path, cli):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from graftkit.weights import save_model
    from planted import tiny_tokenizer

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    base = save_model(tmp_path / "base", model, tiny_tokenizer(), provenance={"producer": "test"})
    assert "lm_head.weight" not in open_checkpoint(base).metas and "lm_head.weight" in model.state_dict()
    torch.save(model.state_dict(), tmp_path / "tied.pth")
    j, run, _ = _delta(cli, tmp_path / "tied.pth", base, tmp_path / "d.h5")
    assert run["total"]["fro_delta"] == 0 and any("lm_head.weight left out" in n for n in j["notes"])


# ---------------------------------------------------------------------- policies run from a single file

EPISODES = ("--tasks", "click-tab", "--seeds", "2", "--episodes", "1")


def _arrays(path) -> dict[str, np.ndarray]:
    res = read_result(path)
    return {n: np.asarray(res[n]) for n in res.data}


def test_a_policy_from_a_single_file_is_the_folders_model(world):
    from graftkit.agent import load_policy

    want = load_policy(world["rl"])
    for style in STYLE_IDS:
        got = load_policy(world["files"][style], config=world["sft"])
        w, g = want.model.state_dict(), got.model.state_dict()
        assert list(g) == list(w) and all(torch.equal(g[n], w[n]) for n in w), style
        assert got.tokenizer.get_vocab() == want.tokenizer.get_vocab()


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLE_IDS)
def test_eval_and_headroom_of_a_single_file_equal_the_folders(world, cli, style):
    f, config = world["files"][style], ("--config", world["sft"])
    for cmd, more in (("eval", ()), ("headroom", ("--k", "2"))):
        want = _ok(cli(cmd, "--model", world["rl"], *EPISODES, *more, "--save", cli.tmp / f"{cmd}-ref.h5", "--json"))
        got = _ok(cli(cmd, "--model", f, *EPISODES, *more, *config, "--save", cli.tmp / f"{cmd}-f.h5", "--json"))
        w, g = _arrays(cli.tmp / f"{cmd}-ref.h5"), _arrays(cli.tmp / f"{cmd}-f.h5")
        assert "success" in g and list(g) == list(w), cmd
        assert all(np.array_equal(g[n], w[n]) for n in w), cmd
        # the random policies write no action, and both runs say so; the file's run also says how it was read
        said = [n for n in want["notes"] if "no turn parsed as an action" in n]
        assert got["tasks"] == want["tasks"] and len(said) == 1 and want["notes"] == said
        note = " ".join(got["notes"])
        assert f"{PREFIX.get(style, 'no prefix')} stripped" in note and f"config from {world['sft']}" in note
        assert read_result(cli.tmp / f"{cmd}-f.h5").attrs["model"]["notes"] + said == got["notes"]
        table = cli(cmd, "--model", f, *EPISODES, *more, *config, "--save", cli.tmp / f"{cmd}-t.h5")
        assert table.exit_code == 0 and "note: " in table.stdout and "stripped" in table.stdout, table.output


@pytest.mark.parametrize("style", ["lightning", "plain"])
def test_rank_activations_of_a_single_file_equal_the_folders(world, cli, style):
    args = ("rank", "--what", "activations", "--probes", "8", "--tokens", "all", "--tasks", "click-tab", "--json")
    want = _ok(cli(*args, "--model", world["rl"], "--save", cli.tmp / "ref.h5"))
    got = _ok(cli(*args, "--model", world["files"][style], "--config", world["sft"],
                  "--save", cli.tmp / "f.h5"))
    (w,), (g,) = want["models"].values(), got["models"].values()
    assert g["layers"] == w["layers"] and g["n_prompts"] == w["n_prompts"]
    value = _arrays(cli.tmp / "ref.h5")["value"]
    assert np.isfinite(value).any() and np.array_equal(_arrays(cli.tmp / "f.h5")["value"], value, equal_nan=True)
    assert any(f"{PREFIX[style]} stripped" in n for n in g["notes"]) and w["notes"] == []
    table = cli(*args[:-1], "--model", world["files"][style], "--config", world["sft"],
                "--save", cli.tmp / "t.h5")
    assert table.exit_code == 0 and "note: " in table.stdout, table.output


def test_a_single_file_base_runs_graft_eval(world, cli):
    args = ("--from", world["rl"], "--groups", "attn,mlp", "--eval", *EPISODES, "--max-new-tokens", "4",
            "--json")
    want = _ok(cli("graft", "--base", world["sft"], *args, "--save", cli.tmp / "ref.h5"))
    got = _ok(cli("graft", "--base", world["files"]["sft"], *args, "--save", cli.tmp / "f.h5"))
    (w,), (g,) = want["runs"].values(), got["runs"].values()
    assert [c["success"] for c in g["configs"]] == [c["success"] for c in w["configs"]]
    assert np.array_equal(_arrays(cli.tmp / "f.h5")["success"], _arrays(cli.tmp / "ref.h5")["success"])
    assert any(f"config from {world['rl']}" in n for n in got["notes"])


def test_a_policy_file_needs_config_and_no_pickle_refuses_it(world, cli):
    f = world["files"]["lightning"]
    for cmd in (("eval", "--model", f, *EPISODES), ("headroom", "--model", f, *EPISODES, "--k", "2"),
                ("rank", "--what", "activations", "--model", f)):
        _one_line_error(cli(*cmd), "--config", str(f))
        _one_line_error(cli(*cmd, "--no-pickle"), "--no-pickle", f.name)
        _one_line_error(cli(*cmd, "--config", cli.tmp), "--config", "no config.json")


def test_a_policy_file_of_another_shape_is_one_line(world, cli, tmp_path):
    from transformers import Qwen3Config

    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (world["sft"] / name).is_file():
            (other / name).write_bytes((world["sft"] / name).read_bytes())
    cfg = Qwen3Config.from_pretrained(world["sft"])
    cfg.intermediate_size *= 2
    cfg.save_pretrained(other)
    _one_line_error(cli("eval", "--model", world["files"]["plain"], *EPISODES, "--config", other),
                    "mlp", "expects", "--config")
    short = tmp_path / "short.pt"
    torch.save({k: v for k, v in world["sd"].items() if "layers.5." not in k}, short)
    _one_line_error(cli("eval", "--model", short, *EPISODES, "--config", world["sft"]),
                    "holds no tensor for", "layers.5")


def test_a_vision_policy_from_a_single_file_is_the_folders(tmp_path):
    from graftkit.agent import VisionPolicy, load_policy, task_words
    from graftkit.agent.vlm import tiny_vlm_policy
    from graftkit.weights import save_model

    p = tiny_vlm_policy(task_words())
    folder = save_model(tmp_path / "vlm", p.model, processor=p.processor, provenance={"producer": "test"})
    torch.save({"module": {f"module.{k}": v for k, v in p.model.state_dict().items()}}, tmp_path / "vlm.pt")
    got = load_policy(tmp_path / "vlm.pt", config=folder, obs="som")
    want, back = p.model.state_dict(), got.model.state_dict()
    assert isinstance(got, VisionPolicy) and list(back) == list(want)
    assert all(torch.equal(back[n], want[n]) for n in want)
