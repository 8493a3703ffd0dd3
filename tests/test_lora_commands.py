"""PEFT LoRA adapters everywhere a model is read: inspect, eval, headroom and rank (weights of the merged
model, and the delta), with the base from --base, the adapter's local base_model_name_or_path, or
one clear error when it names a hub id."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planted import planted_pair  # noqa: E402

from graftkit.cli import app  # noqa: E402
from graftkit.results.store import read_result  # noqa: E402

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
RANK = 4


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A tiny policy, a rank-4 LoRA on q_proj/v_proj over it (recording the local base), the same adapter
    naming a hub id, and PEFT's own merge_and_unload of it saved as a folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("lora")
    base, _ = planted_pair(root / "pair")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    pm = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                          init_lora_weights=False))
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.3 * torch.randn_like(p))
    local = root / "adapter-local"
    pm.save_pretrained(local, safe_serialization=True)
    assert json.loads((local / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    hub = root / "adapter-hub"
    pm.save_pretrained(hub, safe_serialization=True)
    cfg = json.loads((hub / "adapter_config.json").read_text())
    (hub / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": HUB_ID}))
    merged = root / "merged"
    pm.merge_and_unload().save_pretrained(merged, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(merged)
    return {"base": base, "local": local, "hub": hub, "merged": merged}


def run(tmp_path, monkeypatch, *args, code=0):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == code, res.output
    return res


def one_line_error(res, *needles):
    err = res.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in err, (n, err)
    return err


def test_inspect_an_adapter(tmp_path, monkeypatch, adapters):
    info = json.loads(run(tmp_path, monkeypatch, "inspect", adapters["local"], "--json").stdout)
    assert info["kind"] == "lora-merged" and any("LoRA adapter" in n for n in info["notes"])
    err = one_line_error(run(tmp_path, monkeypatch, "inspect", adapters["hub"], code=2), HUB_ID, "--base")
    assert "download" in err
    info = json.loads(run(tmp_path, monkeypatch, "inspect", adapters["hub"], "--base", adapters["base"], "--json").stdout)
    assert info["groups"]["attn"]["tensors"] > 0


def test_eval_and_headroom_of_an_adapter_equal_peft_merge(tmp_path, monkeypatch, adapters):
    ep = ("--tasks", "click-tab,click-button", "--seeds", "3", "--episodes", "2")
    run(tmp_path, monkeypatch, "eval", "--model", adapters["local"], *ep, "--save", tmp_path / "a.h5")
    run(tmp_path, monkeypatch, "eval", "--model", adapters["merged"], *ep, "--save", tmp_path / "m.h5")
    a, m = read_result(tmp_path / "a.h5"), read_result(tmp_path / "m.h5")
    for name in m.data:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(m[name]), err_msg=name)
    one_line_error(run(tmp_path, monkeypatch, "eval", "--model", adapters["hub"], *ep, code=2), HUB_ID, "--base")
    run(tmp_path, monkeypatch, "headroom", "--model", adapters["hub"], "--base", adapters["base"], "--k", "2", *ep)


def test_rank_weights_and_delta_of_an_adapter(tmp_path, monkeypatch, adapters):
    res = json.loads(run(tmp_path, monkeypatch, "rank", "--model", adapters["local"], "--json").stdout)
    ref = json.loads(run(tmp_path, monkeypatch, "rank", "--model", adapters["merged"], "--json").stdout)
    (a,), (m,) = res["models"].values(), ref["models"].values()
    for ra, rm in zip(a["layers"], m["layers"]):
        assert ra["erank"] == pytest.approx(rm["erank"], rel=1e-5)
    one_line_error(run(tmp_path, monkeypatch, "rank", "--what", "delta", "--model", adapters["hub"], code=2),
                   HUB_ID, "--base")
    out = run(tmp_path, monkeypatch, "rank", "--what", "delta", "--model", adapters["hub"], "--base", adapters["base"],
              "--metric", "numerical_rank", "--json").stdout
    (d,) = json.loads(out)["models"].values()
    ranks = {r["layer"]: r["groups"]["attn"]["numerical_rank"] for r in d["layers"]}
    assert set(ranks.values()) == {RANK}  # q_proj and v_proj moved by a rank-4 update, each reads 4


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory):
    """A LoRA on the embedded SFT policy (it solves some episodes), and PEFT's merge of it as a folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graftkit.study.pipeline import EMBEDDED_SFT

    root = tmp_path_factory.mktemp("sft-lora")
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(EMBEDDED_SFT, dtype=torch.float32),
                        LoraConfig(r=RANK, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(0.15 * torch.randn_like(p))
    pm.save_pretrained(root / "adapter", safe_serialization=True)
    pm.merge_and_unload().save_pretrained(root / "merged", safe_serialization=True)
    AutoTokenizer.from_pretrained(EMBEDDED_SFT).save_pretrained(root / "merged")
    return {"base": EMBEDDED_SFT, "adapter": root / "adapter", "merged": root / "merged"}


def test_graft_eval_merges_the_adapter_into_the_loaded_base(tmp_path, monkeypatch, sft_adapter):
    """graft --eval of all groups plays the adapter's merged policy: its outcomes equal eval of PEFT's merge."""
    ep = ("--tasks", "click-tab,click-button", "--seeds", "6", "--episodes", "2")
    out = json.loads(run(tmp_path, monkeypatch, "graft", "--from", sft_adapter["adapter"], "--base", sft_adapter["base"],
                         "--groups", "all", "--eval", *ep, "--json").stdout)
    g = read_result(out["files"]["A"])
    run(tmp_path, monkeypatch, "eval", "--model", sft_adapter["merged"], *ep, "--save", tmp_path / "m.h5")
    merged = np.asarray(read_result(tmp_path / "m.h5")["success"])[..., 0]
    k = list(g.coords["config"]).index("all (rl)")
    assert 0 < merged.mean() < 1  # a policy that solves some episodes and not others: the check can fail
    np.testing.assert_array_equal(np.asarray(g["success"][k]), merged)


def test_rank_of_an_adapter_delta_is_taken_on_the_exact_update(tmp_path, monkeypatch, adapters):
    """delta = s·B@A from the adapter's own A and B (s = alpha / r = 2), not merged − base: the rank result's
    tolerance of q_proj is the matrix rule on that product."""
    from safetensors.torch import load_file

    from graftkit.weights.resolve import open_model

    ck = open_model(adapters["local"])
    ab = load_file(adapters["local"] / "adapter_model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    want = 2.0 * (ab[f"{key}.lora_B.weight"].float() @ ab[f"{key}.lora_A.weight"].float())
    assert torch.equal(ck.deltas(name), want)
    assert ck.deltas("model.layers.0.mlp.up_proj.weight") is None  # not adapted
    run(tmp_path, monkeypatch, "rank", "--what", "delta", "--model", adapters["local"], "--save", tmp_path / "r.h5")
    res = read_result(tmp_path / "r.h5")
    i = [str(t) for t in res.coords["tensor"]].index(name)
    sigma1 = float(torch.linalg.svdvals(want.double())[0])
    assert float(res["tol"][i]) == pytest.approx(max(want.shape) * float(torch.finfo(torch.float32).eps) * sigma1, rel=1e-6)
