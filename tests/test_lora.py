"""PEFT LoRA adapters as the RL side (``graftkit.weights.apply_lora``), against PEFT itself.

Every adapter here is made by the installed ``peft`` on a tiny random model, with random non-zero A and
B, and saved with ``save_pretrained(safe_serialization=True)``. The reference is PEFT's own
``merge_and_unload()``: graftkit's merged tensors must match it (fp32: to float rounding, the maximum
difference is printed), untouched tensors must be the base's own bytes, and what graftkit cannot merge
exactly (DoRA, LoRA biases) must be refused by name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

peft = pytest.importorskip("peft")
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.weights import (  # noqa: E402
    OutSpec,
    apply_lora,
    base_of,
    check_pair,
    describe,
    is_lora_folder,
    open_checkpoint,
    open_rl,
    write_checkpoint,
)

# PEFT and transformers warn about their own API changes and about saving embeddings; not ours to fix.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

PREFIX = "base_model.model."
IDS = torch.tensor([[2, 5, 9, 17, 33, 4, 60, 11]])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def make_adapter(tiny_lm, root: Path, arch: str = "llama", *, dtype=torch.float32, base_kw=None,
                 perturb: str | None = None, max_shard_size: str = "5GB", **lora_kw):
    """Save a tiny base model, wrap it with PEFT, randomise the adapter, save it and merge it.

    ``perturb``: a regex of PEFT parameter names that are saved in full (trained biases, an embedding's
    base layer) to change before saving, so a replacement taken from the base instead would show.

    Returns (base folder, adapter folder, PEFT's merged model, names of base tensors PEFT changes).
    """
    base_dir, adapter_dir = root / "base", root / "adapter"
    model = tiny_lm(arch, dtype, **(base_kw or {}))
    model.save_pretrained(base_dir, max_shard_size=max_shard_size)
    pm = get_peft_model(model, LoraConfig(init_lora_weights=False, **lora_kw))
    torch.manual_seed(1234)
    changed = set()
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_magnitude_vector" in name:
                continue
            if "lora_" in name:
                p.copy_(0.2 * torch.randn_like(p))  # non-zero A and B
            elif "modules_to_save" in name or (perturb and re.search(perturb, name)):
                p.add_(0.2 * torch.randn_like(p))  # a trained replacement differs from the base
                changed.add(_base_name(name))
    for name, module in pm.named_modules():
        if isinstance(module, LoraLayer) and (len(module.lora_A) or len(module.lora_embedding_A)):
            changed.add(_base_name(name) + ".weight")
    pm.save_pretrained(adapter_dir, safe_serialization=True)
    merged = pm.merge_and_unload().eval()
    return base_dir, adapter_dir, merged, changed


def _base_name(peft_name: str) -> str:
    """The base model's name of a PEFT parameter or module name."""
    name = peft_name.removeprefix(PREFIX)
    for infix in (".base_layer", ".modules_to_save.default", ".original_module"):
        name = name.replace(infix, "")
    return name


def check_against_merge(ck, base, merged, changed, *, rtol=1e-6, atol=1e-6) -> float:
    """Compare graftkit's merged checkpoint with PEFT's; return the maximum absolute difference."""
    ref = merged.state_dict()
    assert ck.names == base.names
    max_diff = 0.0
    for name in ck.names:
        got, want, orig = ck.read(name), ref[name], base.read(name)
        assert ck.metas[name] == base.metas[name]
        assert got.dtype == want.dtype == orig.dtype and got.shape == want.shape, name
        if name in changed:
            assert not torch.equal(got, orig), f"{name}: adapter had no effect"
            diff = (got.double() - want.double()).abs().max().item()
            max_diff = max(max_diff, diff)
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
            assert name not in ck.raw
        else:
            assert same_bits(got, orig) and same_bits(got, want), name
            assert ck.raw[name] == base.raw[name]  # the base's own bytes, for a kernel copy
    assert set(ck.provenance["lora"]["targets"]) == changed
    return max_diff


CASES = {
    "plain": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    "plain-sharded-base": dict(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj", "up_proj"],
                               max_shard_size="12KB"),
    "plain-qwen3-tied": dict(arch="qwen3", r=4, lora_alpha=16,
                             target_modules=["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"]),
    "rslora": dict(r=4, lora_alpha=16, use_rslora=True, target_modules=["q_proj", "v_proj", "down_proj"]),
    "patterns": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                     rank_pattern={"v_proj": 2, r"layers\.1\.self_attn\.q_\w+": 6},  # PEFT keys are regexes
                     alpha_pattern={"down_proj": 3, "model.layers.0.self_attn.q_proj": 20}),
    "patterns-rslora": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=["q_proj", "v_proj"],
                            rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 5}),
    "embedding": dict(r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"]),
    "embedding-qwen3-tied": dict(arch="qwen3", r=4, lora_alpha=8, target_modules=["embed_tokens", "v_proj"]),
    "modules-to-save": dict(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]),
    "gpt2-fan-in-fan-out": dict(arch="gpt2", r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"],
                                fan_in_fan_out=True),
    "bias-all": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], bias="all",
                     base_kw=dict(attention_bias=True), perturb=r"\.bias$"),
    "embedding-saved-base-layer": dict(r=4, lora_alpha=8, target_modules=["embed_tokens"],
                                       perturb=r"embed_tokens\.base_layer\.weight$"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_apply_lora_matches_peft_merge(tiny_lm, tmp_path, case):
    kw = dict(CASES[case])
    base_dir, adapter_dir, merged, changed = make_adapter(tiny_lm, tmp_path, **kw)
    assert changed
    base = open_checkpoint(base_dir)
    if "max_shard_size" in kw:
        assert len(base.weight_files) >= 3
    ck = apply_lora(base, adapter_dir)
    assert ck.kind == "lora-merged" and ck.config == base.config
    max_diff = check_against_merge(ck, base, merged, changed)
    if base.tied:  # the file holds the embedding once; PEFT's merged head is that same matrix
        emb = merged.get_input_embeddings().weight
        emb_name = next(n for n, p in merged.named_parameters() if p is emb)
        assert "lm_head.weight" not in ck.names
        assert torch.equal(merged.get_output_embeddings().weight, ck.read(emb_name))
    print(f"\n[{case}] {len(changed)} adapted tensors, max |graftkit - peft merge| = {max_diff:.3g}")


def test_rank_and_alpha_patterns_set_the_scale(tiny_lm, tmp_path):
    """The patterns really change the merge: ignoring them would be far off PEFT's answer."""
    kw = dict(CASES["patterns"])
    base_dir, adapter_dir, merged, _ = make_adapter(tiny_lm, tmp_path, **kw)
    base = open_checkpoint(base_dir)
    from graftkit.weights.lora import read_adapter

    _, _, modules, _ = read_adapter(adapter_dir)
    scale = {m.target: m.scale for m in modules}
    assert scale["model.layers.0.self_attn.q_proj.weight"] == 20 / 4
    assert scale["model.layers.1.self_attn.q_proj.weight"] == 8 / 6
    assert scale["model.layers.0.self_attn.v_proj.weight"] == 8 / 2
    assert scale["model.layers.1.mlp.down_proj.weight"] == 3 / 4
    assert apply_lora(base, adapter_dir).names == base.names


def test_bf16_base_within_one_rounding(tiny_lm, tmp_path):
    """bf16 base: graftkit rounds w + Δ once; PEFT rounds Δ to bf16 first, then the sum. One bf16 ulp apart
    at most, and graftkit equals the float64 reference rounded once."""
    base_dir, adapter_dir, merged, changed = make_adapter(
        tiny_lm, tmp_path, dtype=torch.bfloat16, r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"])
    base = open_checkpoint(base_dir)
    ck = apply_lora(base, adapter_dir)
    ref = merged.state_dict()
    adapter = load_file(adapter_dir / "adapter_model.safetensors")
    differing = 0
    for name in changed:
        got, want = ck.read(name), ref[name]
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
        differing += int((got != want).sum())
        module = PREFIX + name.removesuffix(".weight")
        a, b = adapter[module + ".lora_A.weight"].double(), adapter[module + ".lora_B.weight"].double()
        exact = (base.read(name).double() + 2.0 * (b @ a)).to(torch.bfloat16)
        assert (got != exact).float().mean() < 1e-3, name
    print(f"\n[bf16] elements differing from PEFT's double rounding by one ulp: {differing}")
    for name in ck.names:
        if name not in changed:
            assert same_bits(ck.read(name), base.read(name))


def test_lora_checkpoint_exports_and_loads(tiny_lm, tmp_path):
    """base + LoRA streamed to an HF folder (untouched tensors as byte ranges) runs like PEFT's merge."""
    from transformers import AutoModelForCausalLM

    base_dir, adapter_dir, merged, changed = make_adapter(
        tiny_lm, tmp_path, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj", "embed_tokens"],
        modules_to_save=["lm_head"])
    base = open_checkpoint(base_dir)
    ck = apply_lora(base, adapter_dir)
    specs = [OutSpec(n, m.dtype, m.shape, ck.raw.get(n) or (lambda n=n: [ck.read(n)])) for n, m in ck.metas.items()]
    dest = write_checkpoint(tmp_path / "merged", specs, provenance=ck.provenance,
                            inputs=[base_dir, adapter_dir], aux_from=base_dir)
    loaded = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32).eval()
    with torch.no_grad():
        ours, theirs = loaded(input_ids=IDS).logits, merged(input_ids=IDS).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert json.loads((dest / "graftkit.json").read_text())["lora"]["targets"] == sorted(changed)


# --------------------------------------------------------------------------------------- open_rl & co


def test_open_rl_and_pair(tiny_lm, tmp_path):
    from transformers import AutoModelForCausalLM

    base_dir = tmp_path / "base"
    tiny_lm("llama").save_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)  # so the adapter records its base folder
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    adapter_dir = tmp_path / "adapter"
    pm.save_pretrained(adapter_dir, safe_serialization=True)
    assert is_lora_folder(adapter_dir) and not is_lora_folder(base_dir)

    base = open_checkpoint(base_dir)
    rl = open_rl(adapter_dir, base)
    direct = apply_lora(base, adapter_dir)
    assert rl.kind == "lora-merged" and rl.names == base.names
    assert all(same_bits(rl.read(n), direct.read(n)) for n in rl.names)
    check_pair(base, rl, base.taxonomy())
    assert Path(describe(rl)["path"]) == adapter_dir.resolve()
    assert base_of(adapter_dir) == Path(str(base_dir))

    full = open_rl(base_dir, base)
    assert full.kind == "hf-folder"

    with pytest.raises(GraftkitError) as err:
        open_checkpoint(adapter_dir)
    msg = str(err.value)
    assert str(adapter_dir) in msg and "LoRA adapter" in msg and "--from" in msg and "--base" in msg


# ------------------------------------------------------------------------------------------- refusals


def _apply_error(base_dir: Path, adapter_dir: Path) -> str:
    with pytest.raises(GraftkitError) as err:
        apply_lora(open_checkpoint(base_dir), adapter_dir)
    return str(err.value)


def test_dora_is_refused(tiny_lm, tmp_path):
    base_dir, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path, r=4, target_modules=["q_proj"], use_dora=True)
    msg = _apply_error(base_dir, adapter_dir)
    assert "DoRA" in msg and str(adapter_dir) in msg and "merge_and_unload" in msg

    # a config that hides it: the magnitude tensors still give it away, by name
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    cfg["use_dora"] = False
    (adapter_dir / "adapter_config.json").write_text(json.dumps(cfg))
    msg = _apply_error(base_dir, adapter_dir)
    assert "DoRA" in msg and "lora_magnitude_vector" in msg


def test_lora_bias_is_refused(tiny_lm, tmp_path):
    base_dir, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path, r=4, target_modules=["q_proj"], lora_bias=True,
                                               base_kw=dict(attention_bias=True))
    msg = _apply_error(base_dir, adapter_dir)
    assert "lora_bias" in msg and "q_proj.lora_B.bias" in msg and "merge_and_unload" in msg


def test_wrong_size_base(tiny_lm, tmp_path):
    _, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path / "a", r=4, target_modules=["q_proj", "down_proj"])
    narrow = tmp_path / "narrow"
    tiny_lm("llama", intermediate_size=48).save_pretrained(narrow)
    msg = _apply_error(narrow, adapter_dir)
    assert "model.layers.0.mlp.down_proj.weight" in msg and "[32, 64]" in msg and "[32, 48]" in msg
    assert str(adapter_dir) in msg and "--base" in msg


def test_wrong_size_modules_to_save(tiny_lm, tmp_path):
    _, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path / "a", r=4, target_modules=["q_proj"],
                                        modules_to_save=["lm_head"])
    wide = tmp_path / "wide"
    tiny_lm("llama", vocab=72).save_pretrained(wide)
    msg = _apply_error(wide, adapter_dir)
    assert "lm_head" in msg and "[64, 32]" in msg and "[72, 32]" in msg


def test_wrong_architecture_base(tiny_lm, tmp_path):
    _, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path / "a", r=4, target_modules=["q_proj"])
    gpt2 = tmp_path / "gpt2"
    tiny_lm("gpt2").save_pretrained(gpt2)
    msg = _apply_error(gpt2, adapter_dir)
    assert "does not have" in msg and "model.layers.0.self_attn.q_proj.weight" in msg


def test_pickled_adapter_is_refused(tiny_lm, tmp_path):
    base_dir = tmp_path / "base"
    model = tiny_lm("llama")
    model.save_pretrained(base_dir)
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    adapter_dir = tmp_path / "adapter"
    pm.save_pretrained(adapter_dir, safe_serialization=False)
    assert (adapter_dir / "adapter_model.bin").is_file()
    msg = _apply_error(base_dir, adapter_dir)
    assert "adapter_model.bin" in msg and "safe_serialization=True" in msg


def test_missing_adapter_weights_and_other_types(tiny_lm, tmp_path):
    base_dir, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path, r=2, target_modules=["q_proj"])
    cfg_path = adapter_dir / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps(dict(cfg, peft_type="IA3")))
    msg = _apply_error(base_dir, adapter_dir)
    assert "IA3" in msg and "not supported" in msg
    cfg_path.write_text(json.dumps(cfg))

    weights = adapter_dir / "adapter_model.safetensors"
    tensors = load_file(weights)
    orphan = next(k for k in tensors if k.endswith("lora_A.weight"))
    save_file({k: v for k, v in tensors.items() if k != orphan}, weights)
    msg = _apply_error(base_dir, adapter_dir)
    assert orphan.replace("lora_A", "lora_B") in msg

    weights.unlink()
    msg = _apply_error(base_dir, adapter_dir)
    assert "adapter_model.safetensors is missing" in msg

    cfg_path.write_text("{broken")
    msg = _apply_error(base_dir, adapter_dir)
    assert str(cfg_path) in msg


def test_adapter_inputs_untouched(tiny_lm, tmp_path):
    import hashlib

    base_dir, adapter_dir, _, _ = make_adapter(tiny_lm, tmp_path, r=4, target_modules=["q_proj", "embed_tokens"])

    def tree():
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
                for d in (base_dir, adapter_dir) for p in sorted(d.rglob("*")) if p.is_file()}

    before = tree()
    ck = apply_lora(open_checkpoint(base_dir), adapter_dir)
    for n in ck.names:
        ck.read(n).mul_(0)
    specs = [OutSpec(n, m.dtype, m.shape, ck.raw.get(n) or (lambda n=n: [ck.read(n)])) for n, m in ck.metas.items()]
    write_checkpoint(tmp_path / "out", specs, provenance={}, inputs=[base_dir, adapter_dir], aux_from=base_dir)
    for dest in (adapter_dir, adapter_dir / "merged", base_dir / "merged"):
        with pytest.raises(GraftkitError, match="overlaps"):
            write_checkpoint(dest, specs, provenance={}, inputs=[base_dir, adapter_dir], force=True)
    assert tree() == before
