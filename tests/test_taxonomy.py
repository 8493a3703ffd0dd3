"""The taxonomy tables partition every covered architecture's tensors; layer selection is exact.

Tiny models come from ``tests/models.py`` (``ARCHS``) and, for the families added after it, from
``FAMILIES`` below (same sizes: hidden 32, 3 decoder layers, 2 vision blocks). Names come from three
sources, all collected by :func:`all_cases` so the reachability test (every pattern of every table
matches some tensor) sees exactly what the partition tests see:

- ``saved``: the safetensors files ``save_pretrained()`` writes (transformers renames some tensors on
  save: Qwen2-VL/Qwen2.5-VL go back to the hub layout, per-expert MoE weights, GPT-NeoX ``embed_out``);
- ``state``: ``model.state_dict()`` (a tied model lists ``lm_head.weight`` there as an alias of the
  embedding; the files drop it);
- ``hub``: hand-written name lists of published checkpoints in older layouts, and the layout
  transformers 4.x wrote for LLaVA and Gemma 3 (derived from the tiny model by transformers' own
  renaming rules, ``conversion_mapping.py``), and Mistral's ``consolidated.safetensors``.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from functools import lru_cache  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import ARCHS, HIDDEN, LAYERS, VISION_DEPTH, VOCAB, decoder_layers, tiny_model  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.weights import taxonomy as tx  # noqa: E402
from graftkit.weights.taxonomy import (  # noqa: E402
    BANDS,
    DECODER,
    GROUPS,
    MATCHED_BY,
    VISION,
    UnknownTensors,
    band_of,
    band_rule,
    classify,
    parse_layers,
)

# ------------------------------------------------------------------------------------ name sources


def safetensors_names(folder: Path) -> list[str]:
    """Every tensor name in the ``*.safetensors`` files of ``folder``."""
    from safetensors import safe_open

    names: list[str] = []
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            names.extend(fh.keys())
    return names


class Case:
    """One name list to classify, with what the classification must find."""

    def __init__(self, key, model_type, names, tied, n_layers, n_vision=None, family=None):
        self.key, self.model_type, self.names, self.tied = key, model_type, list(names), tied
        self.n_layers, self.n_vision, self.family = n_layers, n_vision, family

    def __repr__(self) -> str:  # shows in pytest ids and failures
        return f"Case({self.key})"


# ------------------------------------------------------------------ families beyond tests/models.py

_TEXT = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
_FALCON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
# MLA with low-rank queries (q_a_proj, q_b_proj), 4 routed experts + 1 shared; layer 0 dense
_DEEPSEEK = dict(_TEXT, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                 moe_intermediate_size=16, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=16,
                 qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, n_group=1, topk_group=1)
_LLAMA_TEXT = dict(_TEXT, head_dim=8, model_type="llama")
_VISION = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=VISION_DEPTH,
               num_attention_heads=2, image_size=16, patch_size=4)
_CLIP = dict(_VISION, model_type="clip_vision_model", projection_dim=HIDDEN)

# key -> (config class, model class, table family it must get, config kwargs); tie_word_embeddings
# is set everywhere so the tests know which way each is built
FAMILIES: dict[str, tuple[str, str, str, dict]] = {
    "phi": ("PhiConfig", "PhiForCausalLM", "phi", dict(_TEXT, tie_word_embeddings=False)),
    "phi-qk": ("PhiConfig", "PhiForCausalLM", "phi", dict(_TEXT, qk_layernorm=True, tie_word_embeddings=False)),
    # falcon-7b: parallel attention, one norm per layer, multi-query
    "falcon-7b": ("FalconConfig", "FalconForCausalLM", "falcon",
                  dict(_FALCON, multi_query=True, parallel_attn=True, tie_word_embeddings=True)),
    # falcon-40b/180b: ln_attn and ln_mlp
    "falcon-40b": ("FalconConfig", "FalconForCausalLM", "falcon",
                   dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2, tie_word_embeddings=True)),
    # falcon-rw: sequential, biases everywhere, post_attention_layernorm
    "falcon-rw": ("FalconConfig", "FalconForCausalLM", "falcon",
                  dict(_FALCON, multi_query=False, parallel_attn=False, alibi=True, bias=True,
                       tie_word_embeddings=False)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", "starcoder2",
                   dict(_TEXT, tie_word_embeddings=True)),
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", "deepseek",
                    dict(_DEEPSEEK, tie_word_embeddings=False)),
    # DeepSeek-V2-Lite: full-rank queries (q_proj)
    "deepseek_v2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", "deepseek",
                         dict(_DEEPSEEK, q_lora_rank=None, tie_word_embeddings=False)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", "deepseek",
                    dict(_DEEPSEEK, tie_word_embeddings=False)),
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration", "gemma3",
               dict(text_config=dict(_TEXT, head_dim=8, sliding_window=16), vision_config=_VISION,
                    mm_tokens_per_image=4, image_token_index=VOCAB - 3, boi_token_index=VOCAB - 4,
                    eoi_token_index=VOCAB - 5, tie_word_embeddings=True)),
    "llava": ("LlavaConfig", "LlavaForConditionalGeneration", "llava",
              dict(text_config=_LLAMA_TEXT, vision_config=_CLIP, image_token_index=VOCAB - 3,
                   tie_word_embeddings=False)),
    "llava_next": ("LlavaNextConfig", "LlavaNextForConditionalGeneration", "llava",
                   dict(text_config=_LLAMA_TEXT, vision_config=_CLIP, image_token_index=VOCAB - 3,
                        image_grid_pinpoints=[[16, 16], [16, 32]], tie_word_embeddings=False)),
    "idefics3": ("Idefics3Config", "Idefics3ForConditionalGeneration", "idefics3",
                 dict(text_config=_LLAMA_TEXT, vision_config=_VISION, scale_factor=2,
                      image_token_id=VOCAB - 3, tie_word_embeddings=False)),
    "smolvlm": ("SmolVLMConfig", "SmolVLMForConditionalGeneration", "idefics3",
                dict(text_config=dict(_LLAMA_TEXT, tie_word_embeddings=True), vision_config=_VISION,
                     scale_factor=2, image_token_id=VOCAB - 3, tie_word_embeddings=True)),
    # a model type no table lists, named by the common conventions (LayerNorm biases keep the Llama
    # table from claiming it): the generic table's case
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", "generic", dict(_TEXT, tie_word_embeddings=False)),
}
# a model type no table lists whose names the generic table cannot claim (refused; not in all_cases)
UNCOVERED: dict[str, tuple[str, str, str, dict]] = {
    "bloom": ("BloomConfig", "BloomForCausalLM", "", dict(vocab_size=VOCAB, hidden_size=HIDDEN,
                                                          n_layer=LAYERS, n_head=4)),
}


def tiny_family(key: str):
    """An initialised tiny random model of ``key`` (in :data:`FAMILIES` or :data:`UNCOVERED`)."""
    import transformers

    cfg_name, model_name, _, kwargs = {**FAMILIES, **UNCOVERED}[key]
    torch.manual_seed(0)
    return getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kwargs)).eval()


def n_vision_blocks(config) -> int | None:
    """The vision tower's depth (Qwen-VL: ``depth``; CLIP, SigLIP: ``num_hidden_layers``)."""
    vc = getattr(config, "vision_config", None)
    return None if vc is None else getattr(vc, "depth", None) or vc.num_hidden_layers


@lru_cache(maxsize=None)
def model_cases(arch: str, tied: bool | None = None) -> tuple[Case, Case]:
    """(saved, state) cases of the tiny ``arch`` model (a key of ``ARCHS``, ``FAMILIES`` or
    ``UNCOVERED``); built once per process."""
    model = tiny_family(arch) if arch in FAMILIES or arch in UNCOVERED else tiny_model(arch, tied)
    cfg = model.config
    is_tied = bool(cfg.tie_word_embeddings)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        saved = safetensors_names(Path(d))
    state = list(model.state_dict())
    common = dict(n_layers=decoder_layers(cfg), n_vision=n_vision_blocks(cfg))
    tag = f"{arch}{'' if tied is None else ('-tied' if tied else '-untied')}"
    family = FAMILIES[arch][2] if arch in FAMILIES else None
    return (
        Case(f"{tag}/saved", cfg.model_type, saved, is_tied, family=family, **common),
        Case(f"{tag}/state", cfg.model_type, state, is_tied, family=family, **common),
    )


def _qwen_vl_hub(n_layers: int, depth: int, tied: bool, v25: bool) -> list[str]:
    """Qwen2-VL / Qwen2.5-VL as published (transformers 4.x layout): ``model.layers``, ``visual.``."""
    names = ["model.embed_tokens.weight", "model.norm.weight", "visual.patch_embed.proj.weight"]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{m}_proj.{w}" for m in "qkv" for w in ("weight", "bias")]
        names += [p + "self_attn.o_proj.weight"]
        names += [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    wb = ("weight", "bias")
    for b in range(depth):
        p = f"visual.blocks.{b}."
        names += [p + f"attn.{m}.{w}" for m in ("qkv", "proj") for w in wb]
        if v25:  # RMSNorm, SwiGLU
            names += [p + "norm1.weight", p + "norm2.weight"]
            names += [p + f"mlp.{m}_proj.{w}" for m in ("gate", "up", "down") for w in wb]
        else:
            names += [p + f"{n}.{w}" for n in ("norm1", "norm2") for w in wb]
            names += [p + f"mlp.{m}.{w}" for m in ("fc1", "fc2") for w in wb]
    names += [f"visual.merger.mlp.{k}.{w}" for k in (0, 2) for w in wb]
    names += ["visual.merger.ln_q.weight"] if v25 else [f"visual.merger.ln_q.{w}" for w in wb]
    if not tied:
        names.append("lm_head.weight")
    return names


def _gpt2_hub(n_layers: int, prefix: str, buffers: tuple[str, ...]) -> list[str]:
    wb = ("weight", "bias")
    names = [f"{prefix}wte.weight", f"{prefix}wpe.weight"] + [f"{prefix}ln_f.{w}" for w in wb]
    for i in range(n_layers):
        p = f"{prefix}h.{i}."
        names += [p + f"{n}.{w}" for n in ("ln_1", "ln_2") for w in wb]
        names += [p + f"attn.{m}.{w}" for m in ("c_attn", "c_proj") for w in wb]
        names += [p + f"mlp.{m}.{w}" for m in ("c_fc", "c_proj") for w in wb]
        names += [p + f"attn.{b}" for b in buffers]
    return names


def _neox_hub(n_layers: int) -> list[str]:
    """EleutherAI/pythia as published: attention buffers saved, output head called ``embed_out``."""
    wb = ("weight", "bias")
    names = ["gpt_neox.embed_in.weight", "embed_out.weight"]
    names += [f"gpt_neox.final_layer_norm.{w}" for w in wb]
    for i in range(n_layers):
        p = f"gpt_neox.layers.{i}."
        names += [p + f"{n}.{w}" for n in ("input_layernorm", "post_attention_layernorm") for w in wb]
        names += [p + f"attention.{m}.{w}" for m in ("query_key_value", "dense") for w in wb]
        names += [p + f"attention.{b}" for b in ("bias", "masked_bias", "rotary_emb.inv_freq")]
        names += [p + f"mlp.{m}.{w}" for m in ("dense_h_to_4h", "dense_4h_to_h") for w in wb]
    return names


def _llama_old_hub(n_layers: int) -> list[str]:
    """A Llama-2 checkpoint converted by transformers < 4.31: ``rotary_emb.inv_freq`` saved per layer."""
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{m}_proj.weight" for m in "qkvo"]
        names += [p + "self_attn.rotary_emb.inv_freq"]
        names += [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return names


def _transformers4_layout(names: list[str], head: bool) -> list[str]:
    """LLaVA / Gemma 3 names as transformers 4.x saved them (and as the published checkpoints have them):
    the inverse of the renaming rules transformers 5 applies on load (``conversion_mapping.py``,
    "llava", "llava_next" and CLIPVisionModel's ``vision_model`` prefix)."""
    rules = ((r"^model\.language_model\.", "language_model.model."), (r"^lm_head\.", "language_model.lm_head."),
             (r"^model\.vision_tower\.", "vision_tower.vision_model."),
             (r"^model\.multi_modal_projector\.", "multi_modal_projector."),
             (r"^model\.image_newline$", "image_newline"))
    out = []
    for n in names:
        if n.startswith("lm_head.") and not head:
            continue  # a tied head is not saved
        for pattern, repl in rules:
            n = re.sub(pattern, repl, n)
        out.append(n)
    return out


def _mistral_consolidated(n_layers: int) -> list[str]:
    """Mistral's own ``consolidated.safetensors`` (no config.json, so no model_type)."""
    names = ["tok_embeddings.weight", "norm.weight", "output.weight"]
    for i in range(n_layers):
        p = f"layers.{i}."
        names += [p + f"attention.w{m}.weight" for m in "qkvo"]
        names += [p + f"feed_forward.w{m}.weight" for m in "123"]
        names += [p + "attention_norm.weight", p + "ffn_norm.weight"]
    return names


VLM_HUB = ("llava", "llava_next", "gemma3")


@lru_cache(maxsize=None)
def vlm_hub_case(arch: str) -> Case:
    """``arch`` (one of ``VLM_HUB``) in the transformers 4.x layout, from its tiny model."""
    state = model_cases(arch)[1]
    names = _transformers4_layout(state.names, head=not state.tied)
    return Case(f"hub/{arch}-4.x", state.model_type, names, state.tied, state.n_layers, state.n_vision,
                FAMILIES[arch][2])


HUB_CASES: tuple[Case, ...] = (
    # Qwen2-VL-2B ties its head; 7B and Qwen2.5-VL-7B do not
    Case("hub/qwen2-vl-2b", "qwen2_vl", _qwen_vl_hub(28, 32, True, v25=False), True, 28, 32, "qwen_vl"),
    Case("hub/qwen2-vl-7b", "qwen2_vl", _qwen_vl_hub(28, 32, False, v25=False), False, 28, 32, "qwen_vl"),
    Case("hub/qwen2.5-vl", "qwen2_5_vl", _qwen_vl_hub(28, 32, False, v25=True), False, 28, 32, "qwen_vl"),
    # openai-community/gpt2: no prefix, attn.bias buffers (older .bin files also have masked_bias)
    Case("hub/gpt2", "gpt2", _gpt2_hub(12, "", ("bias",)), True, 12, family="gpt2"),
    Case("hub/gpt2-bin", "gpt2", _gpt2_hub(12, "", ("bias", "masked_bias")), True, 12, family="gpt2"),
    Case("hub/gpt2-prefixed", "gpt2", _gpt2_hub(6, "transformer.", ("bias",)), True, 6, family="gpt2"),
    Case("hub/pythia-70m", "gpt_neox", _neox_hub(6), False, 6, family="gpt_neox"),
    Case("hub/llama-2-old", "llama", _llama_old_hub(4), False, 4, family="llama"),
    Case("hub/mistral-consolidated", None, _mistral_consolidated(4), False, 4, family="mistral_consolidated"),
)

TIED_ARCHS = ("llama", "qwen3")  # built both ways in test 2


def all_cases() -> list[Case]:
    """Every name list the tests classify (the reachability test runs over exactly these)."""
    out: list[Case] = []
    for arch in ARCHS:
        out.extend(model_cases(arch))
    for arch in TIED_ARCHS:
        for tied in (True, False):
            out.extend(model_cases(arch, tied))
    for arch in FAMILIES:
        out.extend(model_cases(arch))
    return out + list(HUB_CASES) + [vlm_hub_case(arch) for arch in VLM_HUB]


# ----------------------------------------------------------------------------------- the partition

_DECODER_INDEX = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")
_VISION_INDEX = re.compile(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.")  # inside a vision tower


def expected_group(name: str) -> str | None:
    """The group a tensor belongs to, judged from its name's segments independently of the tables
    (a second opinion: a pattern filed under the wrong group fails here)."""
    segs = name.split(".")
    if {"lm_head", "embed_out"} & set(segs) or name == "output.weight":
        return "lm_head"
    if {"merger", "deepstack_merger_list", "multi_modal_projector", "connector", "image_newline"} & set(segs):
        return "projector"
    if {"visual", "vision_tower", "vision_model"} & set(segs):
        return "vision"
    if len(segs) >= 2 and segs[-2] in {"embed_tokens", "wte", "wpe", "embed_in", "word_embeddings",
                                       "tok_embeddings"}:
        return "embed"
    if {"self_attn", "attn", "attention", "self_attention"} & set(segs):
        return "attn"
    if {"mlp", "block_sparse_moe", "feed_forward"} & set(segs):
        return "mlp"
    if any(s.endswith(("norm", "layernorm", "layer_norm")) or s.startswith("ln_") for s in segs):
        return "norm"
    return None


def assert_partition(case: Case, tax: tx.Taxonomy, *, head_expected: bool) -> None:
    names = case.names
    assert len(set(names)) == len(names), "duplicate tensor names in the source"
    assert tax.unknown == ()
    assert set(tax.roles) == set(names)
    for n, r in tax.roles.items():
        want = expected_group(n)
        assert r.group == want, f"{case.key}: {n} is {r.group}, expected {want}"
    # exactly one group per tensor: the group lists are disjoint and cover every name
    groups = tax.group_names()
    flat = [n for members in groups.values() for n in members]
    assert sorted(flat) == sorted(names)

    expected = {"embed", "attn", "mlp", "norm"}
    if head_expected:
        expected.add("lm_head")
    if case.n_vision is not None:
        expected |= {"vision", "projector"}
    assert set(groups) == expected, f"{case.key}: groups {sorted(groups)} != {sorted(expected)}"

    # the layer index is the one in the name, in the right stack; nothing else is layered
    for n, r in tax.roles.items():
        in_vision = expected_group(n) == "vision"
        dec = None if in_vision else _DECODER_INDEX.search(n)
        vis = _VISION_INDEX.search(n) if in_vision else None
        if dec:
            assert (r.stack, r.layer) == (DECODER, int(dec[1])), n
        elif vis:
            assert (r.stack, r.layer) == (VISION, int(vis[1])), n
            assert r.group == "vision", n
        else:
            assert (r.stack, r.layer) == (None, None), n
    decoder = {r.layer for r in tax.roles.values() if r.stack == DECODER}
    assert decoder == set(range(case.n_layers))
    assert tax.n_layers[DECODER] == case.n_layers
    if case.n_vision is None:
        assert VISION not in tax.n_layers
    else:
        vision = {r.layer for r in tax.roles.values() if r.stack == VISION}
        assert vision == set(range(case.n_vision))
        assert tax.n_layers[VISION] == case.n_vision


@pytest.mark.parametrize("arch", list(ARCHS))
def test_saved_files_partition(arch):
    saved, _ = model_cases(arch)
    tax = classify(saved.names, model_type=saved.model_type, tied=saved.tied)
    assert tax.tied is saved.tied
    assert_partition(saved, tax, head_expected=not saved.tied)
    # the files alone say the same about the head: no lm_head tensor means tied
    assert classify(saved.names, model_type=saved.model_type).tied is saved.tied


@pytest.mark.parametrize("arch", list(ARCHS))
def test_state_dict_partition(arch):
    _, state = model_cases(arch)
    tax = classify(state.names, model_type=state.model_type, tied=state.tied)
    assert tax.tied is state.tied
    # state_dict() always lists lm_head.weight, for a tied model as an alias of the embedding
    assert_partition(state, tax, head_expected=True)


def test_model_types_are_the_real_ones():
    """Every tiny model's config.model_type is listed by exactly one table (none for the generic case)."""
    for arch in [*ARCHS, *FAMILIES, *UNCOVERED]:
        mt = model_cases(arch)[0].model_type
        owners = [t.family for t in tx.tables() if mt in t.model_types]
        expected = 0 if arch in UNCOVERED or FAMILIES.get(arch, (0, 0, ""))[2] == "generic" else 1
        assert len(owners) == expected, (arch, mt, owners)
    assert model_cases("gemma3_text")[0].model_type == "gemma3_text"


def test_moe_experts_fused_in_state_dict_per_expert_in_files():
    saved, state = model_cases("qwen3_moe")
    assert "model.layers.0.mlp.experts.gate_up_proj" in state.names
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in saved.names
    for names in (saved.names, state.names):
        roles = classify(names, model_type="qwen3_moe").roles
        experts = [r for n, r in roles.items() if ".experts." in n or ".gate." in n]
        assert experts and all(r.group == "mlp" for r in experts)
    # the dense layer (mlp_only_layers=[1]) and the shared expert of Qwen2-MoE are mlp too
    dense = classify(saved.names, "qwen3_moe").roles["model.layers.1.mlp.up_proj.weight"]
    assert dense.group == "mlp"
    qwen2_moe = model_cases("qwen2_moe")[0]
    roles = classify(qwen2_moe.names, "qwen2_moe").roles
    assert roles["model.layers.0.mlp.shared_expert_gate.weight"].group == "mlp"


# --------------------------------------------------------------------- families added as data


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_partition(arch):
    """Saved files and state_dict of each added family: every tensor claimed once, by the table its
    model_type names (the generic case: by the generic table, saying so)."""
    saved, state = model_cases(arch)
    matched_by = "generic" if saved.family == "generic" else "model_type"
    for case, head in ((saved, not saved.tied), (state, True)):
        tax = classify(case.names, model_type=case.model_type, tied=case.tied)
        assert (tax.family, tax.matched_by) == (case.family, matched_by)
        assert tax.tied is case.tied
        assert_partition(case, tax, head_expected=head)
    # the files alone say the same about the head: no lm_head tensor means tied
    assert classify(saved.names, model_type=saved.model_type).tied is saved.tied


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_family_head_as_the_config_says(arch):
    """lm_head is its own tensor in the files exactly when the config unties it."""
    saved, state = model_cases(arch)
    tied = FAMILIES[arch][3]["tie_word_embeddings"]
    assert saved.tied is tied
    roles = classify(saved.names, model_type=saved.model_type).roles
    heads = [n for n, r in roles.items() if r.group == "lm_head"]
    assert bool(heads) is (not tied)
    model = tiny_family(arch)
    shared = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert shared is tied


def _role(arch: str, which: int, name: str) -> tx.TensorRole:
    case = model_cases(arch)[which]
    return classify(case.names, model_type=case.model_type).roles[name]


SAVED, STATE = 0, 1


def test_deepseek_mla_experts_and_router():
    L = "model.layers"
    for arch in ("deepseek_v2", "deepseek_v3"):
        for name in ("self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight",
                     "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight",
                     "self_attn.q_a_layernorm.weight", "self_attn.kv_a_layernorm.weight"):  # MLA, its norms too
            assert _role(arch, STATE, f"{L}.2.{name}") == tx.TensorRole(f"{L}.2.{name}", "attn", 2, DECODER)
        for name in ("mlp.shared_experts.down_proj.weight", "mlp.gate.weight", "mlp.experts.gate_up_proj"):
            assert _role(arch, STATE, f"{L}.1.{name}") == tx.TensorRole(f"{L}.1.{name}", "mlp", 1, DECODER)
        # the files hold one tensor per routed expert
        assert _role(arch, SAVED, f"{L}.2.mlp.experts.3.up_proj.weight").group == "mlp"
        assert _role(arch, SAVED, f"{L}.2.mlp.experts.3.up_proj.weight").layer == 2
        # layer 0 is dense (first_k_dense_replace=1): a plain MLP, no experts
        assert _role(arch, SAVED, f"{L}.0.mlp.gate_proj.weight") == tx.TensorRole(
            f"{L}.0.mlp.gate_proj.weight", "mlp", 0, DECODER)
        assert not [n for n in model_cases(arch)[SAVED].names if n.startswith(f"{L}.0.mlp.experts")]
    bias = f"{L}.1.mlp.gate.e_score_correction_bias"
    assert _role("deepseek_v3", SAVED, bias) == tx.TensorRole(bias, "mlp", 1, DECODER)
    assert bias not in model_cases("deepseek_v2")[SAVED].names
    # V2-Lite: full-rank queries
    assert _role("deepseek_v2-lite", SAVED, f"{L}.1.self_attn.q_proj.weight").group == "attn"
    assert not [n for n in model_cases("deepseek_v2-lite")[SAVED].names if "q_a_proj" in n]


def test_vision_towers_and_projectors():
    # Gemma 3: SigLIP blocks are the vision stack, its post-norm and pooling head vision without a layer
    enc = "model.vision_tower.encoder.layers.1.self_attn.out_proj.weight"
    assert _role("gemma3", STATE, enc) == tx.TensorRole(enc, "vision", 1, VISION)
    assert _role("gemma3", STATE, "model.vision_tower.post_layernorm.weight") == tx.TensorRole(
        "model.vision_tower.post_layernorm.weight", "vision")
    assert _role("gemma3", STATE, "model.vision_tower.head.probe").group == "vision"
    norm = "model.multi_modal_projector.mm_soft_emb_norm.weight"
    assert _role("gemma3", STATE, norm) == tx.TensorRole(norm, "projector")
    assert _role("gemma3", STATE, "model.language_model.layers.2.pre_feedforward_layernorm.weight").layer == 2
    gemma3 = classify(model_cases("gemma3")[SAVED].names, model_type="gemma3")
    assert dict(gemma3.n_layers) == {DECODER: LAYERS, VISION: VISION_DEPTH}
    # LLaVA: CLIP tower, two-layer projector; LLaVA-NeXT's image_newline is projector too
    for arch in ("llava", "llava_next"):
        assert _role(arch, STATE, "model.vision_tower.pre_layrnorm.weight").group == "vision"
        assert _role(arch, STATE, "model.vision_tower.encoder.layers.0.mlp.fc1.weight") == tx.TensorRole(
            "model.vision_tower.encoder.layers.0.mlp.fc1.weight", "vision", 0, VISION)
        assert _role(arch, STATE, "model.multi_modal_projector.linear_2.weight").group == "projector"
        assert _role(arch, STATE, "lm_head.weight").group == "lm_head"
    assert _role("llava_next", STATE, "model.image_newline") == tx.TensorRole("model.image_newline", "projector")
    # Idefics3 / SmolVLM: vision_model, connector, text_model
    for arch in ("idefics3", "smolvlm"):
        ln = "model.vision_model.encoder.layers.1.layer_norm1.weight"
        assert _role(arch, SAVED, ln) == tx.TensorRole(ln, "vision", 1, VISION)
        proj = "model.connector.modality_projection.proj.weight"
        assert _role(arch, SAVED, proj) == tx.TensorRole(proj, "projector")
        assert _role(arch, SAVED, "model.text_model.layers.2.mlp.up_proj.weight").layer == 2
    assert "lm_head.weight" in model_cases("idefics3")[SAVED].names
    assert "lm_head.weight" not in model_cases("smolvlm")[SAVED].names  # tied


def test_phi_falcon_starcoder2_roles():
    assert _role("phi", SAVED, "lm_head.bias") == tx.TensorRole("lm_head.bias", "lm_head")
    assert _role("phi", SAVED, "model.final_layernorm.bias") == tx.TensorRole("model.final_layernorm.bias", "norm")
    assert _role("phi", SAVED, "model.layers.1.self_attn.dense.bias").group == "attn"
    qk = "model.layers.2.self_attn.k_layernorm.weight"
    assert _role("phi-qk", SAVED, qk) == tx.TensorRole(qk, "attn", 2, DECODER)
    assert _role("falcon-40b", SAVED, "transformer.h.2.ln_mlp.bias") == tx.TensorRole(
        "transformer.h.2.ln_mlp.bias", "norm", 2, DECODER)
    assert _role("falcon-7b", SAVED, "transformer.h.0.self_attention.query_key_value.weight").group == "attn"
    assert _role("falcon-rw", SAVED, "transformer.h.1.mlp.dense_4h_to_h.bias").group == "mlp"
    assert _role("falcon-rw", SAVED, "lm_head.weight").group == "lm_head"
    assert _role("starcoder2", SAVED, "model.layers.1.mlp.c_fc.bias") == tx.TensorRole(
        "model.layers.1.mlp.c_fc.bias", "mlp", 1, DECODER)
    assert _role("starcoder2", SAVED, "model.norm.bias").group == "norm"


@pytest.mark.parametrize("arch", VLM_HUB)
def test_vlm_transformers4_layout(arch):
    """The layout the published LLaVA and Gemma 3 checkpoints use gets the same roles."""
    case = vlm_hub_case(arch)
    tax = classify(case.names, model_type=case.model_type)
    assert (tax.family, tax.matched_by, tax.tied) == (case.family, "model_type", case.tied)
    assert_partition(case, tax, head_expected=not case.tied)
    enc = "vision_tower.vision_model.encoder.layers.1.layer_norm2.bias"
    assert tax.roles[enc] == tx.TensorRole(enc, "vision", 1, VISION)
    assert tax.roles["language_model.model.layers.2.mlp.down_proj.weight"].layer == 2
    if not case.tied:
        assert tax.roles["language_model.lm_head.weight"].group == "lm_head"


def test_mistral_consolidated_by_names_alone():
    names = _mistral_consolidated(4)
    tax = classify(names)
    assert (tax.family, tax.matched_by, tax.tied) == ("mistral_consolidated", "names", False)
    assert tax.roles["layers.3.attention.wk.weight"] == tx.TensorRole(
        "layers.3.attention.wk.weight", "attn", 3, DECODER)
    assert tax.roles["layers.0.feed_forward.w2.weight"] == tx.TensorRole(
        "layers.0.feed_forward.w2.weight", "mlp", 0, DECODER)
    assert tax.roles["layers.1.ffn_norm.weight"].group == "norm"
    assert tax.roles["tok_embeddings.weight"] == tx.TensorRole("tok_embeddings.weight", "embed")
    assert tax.roles["output.weight"] == tx.TensorRole("output.weight", "lm_head")
    assert tax.roles["norm.weight"] == tx.TensorRole("norm.weight", "norm")
    assert [t.family for t in tx.tables() if not t.unclaimed(names)] == ["mistral_consolidated"]
    # a config naming a listed model type is authoritative: its table must claim the names
    with pytest.raises(UnknownTensors, match="llama.json"):
        classify(names, model_type="mistral")


# ---------------------------------------------------------------------------- the generic table


def test_generic_table_claims_conventional_names_and_says_so():
    saved = model_cases("stablelm")[SAVED]
    assert not any(saved.model_type in t.model_types for t in tx.tables())
    # no family table claims every name (LayerNorm biases), so it falls to the generic table
    assert [t.family for t in tx.tables() if not t.unclaimed(saved.names)] == ["generic"]
    for model_type in ("stablelm", None):
        tax = classify(saved.names, model_type=model_type)
        assert (tax.family, tax.matched_by) == ("generic", "generic")
    roles = classify(saved.names, model_type="stablelm").roles
    b = "model.layers.2.post_attention_layernorm.bias"
    assert roles[b] == tx.TensorRole(b, "norm", 2, DECODER)
    assert roles["model.layers.0.self_attn.o_proj.weight"] == tx.TensorRole(
        "model.layers.0.self_attn.o_proj.weight", "attn", 0, DECODER)
    assert roles["model.norm.bias"] == tx.TensorRole("model.norm.bias", "norm")
    assert roles["lm_head.weight"].group == "lm_head"


def test_generic_table_only_when_no_table_lists_the_model_type():
    stablelm = model_cases("stablelm")[SAVED].names
    # a listed model type keeps its table even though the generic one would claim everything
    with pytest.raises(UnknownTensors, match="weights/architectures/llama.json") as err:
        classify(stablelm, model_type="llama")
    assert "model.norm.bias" in err.value.names
    # a family table that claims every name comes before the generic one
    llama = model_cases("llama")[SAVED].names
    generic = next(t for t in tx.tables() if t.generic)
    assert not generic.unclaimed(llama)
    tax = classify(llama, model_type="llama_like_unlisted")
    assert (tax.family, tax.matched_by) == ("llama", "names")
    assert classify(llama, model_type="llama").matched_by == "model_type"
    assert set(MATCHED_BY) == {"model_type", "names", "generic"}


def test_generic_table_refuses_names_it_cannot_claim():
    odd = "model.layers.1.router_logit_scale"
    names = [*model_cases("stablelm")[SAVED].names, odd]
    with pytest.raises(GraftkitError, match="no taxonomy table covers model_type 'stablelm'") as err:
        classify(names, model_type="stablelm")
    assert f"generic table leaves 1 of {len(names)} unclaimed: {odd}" in str(err.value)
    assert not isinstance(err.value, UnknownTensors)
    assert "add weights/architectures/<family>.json" in str(err.value)
    # a real model no table lists (BLOOM): the Falcon table misses its embedding layernorm, the
    # generic table claims nothing
    bloom = model_cases("bloom")[SAVED]
    falcon = next(t for t in tx.tables() if t.family == "falcon")
    assert set(falcon.unclaimed(bloom.names)) == {"transformer.word_embeddings_layernorm.weight",
                                                  "transformer.word_embeddings_layernorm.bias"}
    with pytest.raises(GraftkitError, match="no taxonomy table covers model_type 'bloom'") as err:
        classify(bloom.names, model_type="bloom")
    assert f"generic table leaves {len(bloom.names)} of {len(bloom.names)} unclaimed" in str(err.value)
    with pytest.raises(GraftkitError, match=r"no taxonomy table covers this checkpoint \(no model_type\)"):
        classify(bloom.names)


def test_inspect_says_which_table_matched_and_how(tmp_path):
    """``run_inspect``'s result names the table (family) and how it was found (matched_by)."""
    from safetensors.torch import save_file

    from graftkit.weights.commands import InspectConfig, run_inspect

    tiny_family("stablelm").save_pretrained(tmp_path / "stablelm")
    tiny_model("llama").save_pretrained(tmp_path / "llama")
    torch.manual_seed(0)
    save_file({n: torch.randn(4, 4) for n in _mistral_consolidated(2)}, str(tmp_path / "consolidated.safetensors"))
    found = {k: run_inspect(InspectConfig(model=tmp_path / k))
             for k in ("stablelm", "llama", "consolidated.safetensors")}
    assert {k: (j["family"], j["matched_by"]) for k, j in found.items()} == {
        "stablelm": ("generic", "generic"),
        "llama": ("llama", "model_type"),
        "consolidated.safetensors": ("mistral_consolidated", "names"),
    }
    assert found["stablelm"]["model_type"] == "stablelm"
    assert found["consolidated.safetensors"]["layers"] == {DECODER: 2}
    assert found["consolidated.safetensors"]["groups"]["lm_head"]["tensors"] == 1


# -------------------------------------------------------------------------------- tied embeddings


@pytest.mark.parametrize("arch", TIED_ARCHS)
@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied(arch, tied):
    saved, state = model_cases(arch, tied)
    assert saved.tied is tied
    for inferred in (None, tied):  # from the config, or inferred from the files
        tax = classify(saved.names, model_type=saved.model_type, tied=inferred)
        assert tax.tied is tied
        assert ("lm_head" in tax.group_names()) is (not tied)
        assert_partition(saved, tax, head_expected=not tied)
    tax = classify(state.names, model_type=state.model_type, tied=tied)
    assert tax.tied is tied
    assert tax.roles["lm_head.weight"].group == "lm_head"
    model = tiny_model(arch, tied)
    shared = model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert shared is tied


# ------------------------------------------------------------------------------------- hub layouts


@pytest.mark.parametrize("case", HUB_CASES, ids=lambda c: c.key)
def test_hub_layouts(case):
    tax = classify(case.names, model_type=case.model_type)
    assert tax.family == case.family
    assert tax.tied is case.tied
    assert_partition(case, tax, head_expected=not case.tied)
    # with no model_type the names alone find the same table
    assert classify(case.names).family == case.family


def test_hub_buffers_are_attention():
    gpt2 = classify(_gpt2_hub(2, "", ("bias", "masked_bias")), model_type="gpt2")
    assert gpt2.roles["h.1.attn.bias"] == tx.TensorRole("h.1.attn.bias", "attn", 1, DECODER)
    assert gpt2.roles["h.0.attn.masked_bias"].group == "attn"
    assert gpt2.roles["h.0.attn.c_attn.bias"].group == "attn"
    assert gpt2.roles["h.0.mlp.c_proj.bias"].group == "mlp"
    assert gpt2.roles["wpe.weight"].group == "embed"
    neox = classify(_neox_hub(2), model_type="gpt_neox")
    assert neox.roles["gpt_neox.layers.1.attention.rotary_emb.inv_freq"].layer == 1
    assert neox.roles["gpt_neox.layers.1.attention.rotary_emb.inv_freq"].group == "attn"
    assert neox.roles["embed_out.weight"].group == "lm_head"
    qvl = classify(_qwen_vl_hub(2, 2, tied=False, v25=True), model_type="qwen2_5_vl")
    assert qvl.roles["visual.blocks.1.norm2.weight"] == tx.TensorRole(
        "visual.blocks.1.norm2.weight", "vision", 1, VISION
    )
    assert qvl.roles["visual.merger.ln_q.weight"].group == "projector"
    assert qvl.roles["model.layers.1.input_layernorm.weight"].layer == 1


def test_qwen3_vl_deepstack_mergers_are_projector():
    for case in model_cases("qwen3_vl"):
        roles = classify(case.names, model_type="qwen3_vl").roles
        deep = [r for n, r in roles.items() if "deepstack_merger_list" in n]
        assert deep and all(r.group == "projector" and r.layer is None for r in deep)
        assert roles["model.visual.pos_embed.weight"].group == "vision"


# ------------------------------------------------------------------------------------ unknown names


def test_unknown_tensor_is_an_error_listing_it():
    names = list(model_cases("llama")[0].names) + ["model.layers.0.self_attn.mystery.weight"]
    with pytest.raises(UnknownTensors) as err:
        classify(names, model_type="llama")
    assert "model.layers.0.self_attn.mystery.weight" in str(err.value)
    assert err.value.names == ["model.layers.0.self_attn.mystery.weight"]
    assert "keep-base" in str(err.value)
    assert isinstance(err.value, GraftkitError)


def test_unknown_keep_base_records_it():
    odd = "model.layers.0.self_attn.mystery.weight"
    names = list(model_cases("llama")[0].names) + [odd]
    tax = classify(names, model_type="llama", unknown="keep-base")
    assert tax.unknown == (odd,)
    assert tax.roles[odd].group == "unknown"
    assert odd not in [n for members in tax.group_names().values() for n in members]
    assert tax.roles["model.norm.weight"].group == "norm"


def test_unknown_message_truncates_long_lists():
    odd = [f"extra.{i}.weight" for i in range(11)]
    with pytest.raises(UnknownTensors) as err:
        classify(["model.embed_tokens.weight", *odd], model_type="llama")
    assert err.value.names == odd
    assert "extra.0.weight" in str(err.value) and "3 more" in str(err.value)


def test_bad_unknown_option_and_unknown_model_type():
    with pytest.raises(GraftkitError, match="--unknown"):
        classify(["model.embed_tokens.weight"], model_type="llama", unknown="drop")
    with pytest.raises(GraftkitError, match="no taxonomy table covers model_type 'martian'"):
        classify(["brain.weight"], model_type="martian")


# ------------------------------------------------------------------------------- layer selection


def test_parse_layers_all():
    for spec in ("all", "ALL", " all ", ""):
        assert parse_layers(spec, 12) is None


def test_parse_layers_bands():
    assert parse_layers("early", 12) == frozenset(range(0, 4))
    assert parse_layers("mid", 12) == frozenset(range(4, 8))
    assert parse_layers("late", 12) == frozenset(range(8, 12))
    assert parse_layers("early", 28) == frozenset(range(0, 10))
    assert parse_layers("mid", 28) == frozenset(range(10, 19))
    assert parse_layers("late", 28) == frozenset(range(19, 28))


def test_parse_layers_lists_ranges_and_mixed():
    assert parse_layers("0-3,10", 12) == frozenset({0, 1, 2, 3, 10})
    assert parse_layers("5", 12) == frozenset({5})
    assert parse_layers("2-2", 12) == frozenset({2})
    assert parse_layers("early, 10", 12) == frozenset({0, 1, 2, 3, 10})
    assert parse_layers("late,0-1,mid", 12) == frozenset({0, 1, *range(4, 12)})
    assert parse_layers("Early,LATE", 6) == frozenset({0, 1, 4, 5})
    assert parse_layers("0-11", 12) == frozenset(range(12))


@pytest.mark.parametrize("spec", ["12", "0-12", "11-12", "100", "3-1"])
def test_parse_layers_out_of_range(spec):
    with pytest.raises(GraftkitError, match="outside the model's decoder layers 0–11"):
        parse_layers(spec, 12)


@pytest.mark.parametrize(
    "spec", ["first", "1-", "-1", "1.5", "0-3,,4", "0;1", "1-2-3", "middle", "0-3,x"]
)
def test_parse_layers_garbage(spec):
    with pytest.raises(GraftkitError, match="cannot read"):
        parse_layers(spec, 12)


def test_parse_layers_without_decoder_layers():
    with pytest.raises(GraftkitError, match="no decoder layers"):
        parse_layers("early", 0)
    assert parse_layers("all", 0) is None


def test_band_rule_text():
    assert band_rule(12) == "band(i) = ⌊3i/n⌋ with n = 12: early 0–3, mid 4–7, late 8–11"
    assert band_rule(28) == "band(i) = ⌊3i/n⌋ with n = 28: early 0–9, mid 10–18, late 19–27"
    assert band_rule(2) == "band(i) = ⌊3i/n⌋ with n = 2: early 0–0, mid 1–1, late none"
    assert band_rule(1) == "band(i) = ⌊3i/n⌋ with n = 1: early 0–0, mid none, late none"


@pytest.mark.parametrize("n", range(1, 41))
def test_bands_partition_every_stack(n):
    bands = [sorted(i for i in range(n) if band_of(i, n) == b) for b in BANDS]
    assert sorted(i for b in bands for i in b) == list(range(n))  # partition
    for members in bands:  # contiguous
        if members:
            assert members == list(range(members[0], members[-1] + 1))
    flat = [i for b in bands for i in b]
    assert flat == list(range(n))  # ordered: early before mid before late
    sizes = [len(b) for b in bands]
    assert max(sizes) - min(sizes) <= 1
    assert sizes[2] <= sizes[0]
    for b, members in zip(BANDS, bands):
        if members:
            assert parse_layers(b, n) == frozenset(members)
        else:
            assert parse_layers(b, n) == frozenset()


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 80).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1), min_size=1))
    )
)
def test_parse_layers_round_trips_index_lists(n_and_layers):
    n, layers = n_and_layers
    # spell the set as runs: 0-3,5,7-9
    runs, order = [], sorted(layers)
    for i in order:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    spec = ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)
    assert parse_layers(spec, n) == frozenset(layers)


# ------------------------------------------------------------------------------------- the tables


def test_tables_are_well_formed():
    import json

    seen: dict[str, str] = {}
    files = sorted(Path(tx.__file__).parent.joinpath("architectures").glob("*.json"))
    assert len(files) == len(tx.tables()) >= 7
    for path, table in zip(files, tx.tables()):
        raw = json.loads(path.read_text())
        assert {"family", "model_types", "groups"} <= set(raw) <= {"family", "model_types", "groups",
                                                                    "fallback_priority", "generic", "notes"}, path
        assert table.generic is raw.get("generic", False)
        assert not (table.generic and table.model_types), path
        assert raw["family"] == path.stem == table.family
        assert set(raw["groups"]) <= set(GROUPS)
        patterns = [p for ps in raw["groups"].values() for p in ps]
        assert len(patterns) == len(set(patterns)), f"{path.name}: a pattern is listed twice"
        for mt in raw["model_types"]:
            assert mt not in seen, f"model_type {mt} in both {seen[mt]} and {table.family}"
            seen[mt] = table.family


def test_model_type_count():
    """19 model types before the families of weights/architectures/{phi,falcon,starcoder2,deepseek,
    gemma3,llava,idefics3}.json (10 more); mistral_consolidated and generic list none."""
    listed = [mt for t in tx.tables() for mt in t.model_types]
    assert len(listed) == len(set(listed)) == 29
    assert [t.family for t in tx.tables() if not t.model_types] == ["generic", "mistral_consolidated"]
    assert [t.family for t in tx.tables() if t.generic] == ["generic"]
    assert len(tx.tables()) == 16


def test_every_listed_model_type_is_tested():
    """A model_type in a table without a tiny model or hub list would be an unproven claim."""
    covered = {c.model_type for c in all_cases()}
    listed = {mt for t in tx.tables() for mt in t.model_types}
    assert listed <= covered, f"untested model types: {sorted(listed - covered)}"


def test_every_pattern_is_reachable():
    """Each pattern of each table matches at least one tensor of a test model or hub list."""
    by_family: dict[str, set[str]] = {}
    for case in all_cases():
        family = tx.table_for(case.model_type, case.names)[0].family
        by_family.setdefault(family, set()).update(case.names)
    dead = []
    for table in tx.tables():
        names = by_family.get(table.family, set())
        for group, pattern, rx in table.rules:
            if not any(rx.match(n) for n in names):
                dead.append(f"{table.family}.json {group}: {pattern}")
    assert not dead, "patterns no test tensor matches:\n" + "\n".join(dead)


def test_tables_agree_where_they_overlap():
    """A name two tables both claim gets the same role from each, so the model_type-less fallback
    (the first table that claims every name) cannot change a tensor's group or layer."""
    names = {n for case in all_cases() for n in case.names}
    for n in sorted(names):
        roles = {(r.group, r.layer, r.stack) for t in tx.tables() if (r := t.role(n)) is not None}
        assert len(roles) <= 1, (n, roles)
