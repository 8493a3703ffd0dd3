"""Tiny random transformers models of every architecture graftkit covers, for tests.

``tiny_model(arch, tied=None)`` builds an initialised model from its config class alone (nothing is
downloaded): hidden 32, 3 decoder layers, 2 vision blocks, vocab 128, so each builds in a few
milliseconds. ``tied`` overrides ``tie_word_embeddings`` where the architecture supports both; ``None``
keeps a fixed per-architecture default (listed in ``ARCHS``).
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 128
HIDDEN = 32
LAYERS = 3  # one layer per band (early, mid, late); differs from VISION_DEPTH
VISION_DEPTH = 2

_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

# arch -> (config class, model class, default tie_word_embeddings, extra config kwargs)
ARCHS: dict[str, tuple[str, str, bool, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", False, {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", False, {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", True, {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", True, {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        False,
        # layer 1 is a dense MLP layer, the others sparse: both kinds of layer in one model
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1]),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        False,
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
             shared_expert_intermediate_size=32, mlp_only_layers=[1]),
    ),
    "mixtral": (
        "MixtralConfig", "MixtralForCausalLM", False, dict(num_local_experts=4, num_experts_per_tok=2)
    ),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", True, {}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", True, dict(sliding_window=16)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", True, dict(sliding_window=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", False, {}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", True, {}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", False, {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", False, {}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", False, dict(sliding_window=16)),
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", False, {}),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", False, {}),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", False, {}),
    "qwen3_vl_moe": (
        "Qwen3VLMoeConfig",
        "Qwen3VLMoeForConditionalGeneration",
        False,
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1]),
    ),
}
VLMS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


def _text_kwargs(arch: str) -> dict:
    kw = dict(_TEXT)
    if arch == "gpt2":
        return dict(
            vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=64,
            bos_token_id=1, eos_token_id=2,
        )
    if arch == "gpt_neox":
        kw.pop("head_dim"), kw.pop("num_key_value_heads")
        return kw
    if arch == "phi3":
        kw.pop("head_dim")
    if arch in VLMS:
        # mrope: the three sections cover head_dim / 2 rotary frequencies
        kw["rope_parameters"] = {
            "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
        }
        if arch.startswith("qwen3_vl"):
            kw["rope_parameters"]["mrope_interleaved"] = True
    return kw


def _vision_kwargs(arch: str) -> dict:
    common = dict(depth=VISION_DEPTH, num_heads=2, patch_size=4, temporal_patch_size=2,
                  spatial_merge_size=2, in_channels=3)
    if arch == "qwen2_vl":
        return dict(common, embed_dim=HIDDEN, hidden_size=HIDDEN, mlp_ratio=2)
    if arch == "qwen2_5_vl":
        return dict(common, hidden_size=HIDDEN, intermediate_size=64, out_hidden_size=HIDDEN,
                    fullatt_block_indexes=[1], window_size=16)
    # qwen3_vl, qwen3_vl_moe: a deepstack merger after each of blocks 0 and 1
    return dict(common, hidden_size=HIDDEN, intermediate_size=64, out_hidden_size=HIDDEN,
                num_position_embeddings=16, deepstack_visual_indexes=[0, 1])


def tiny_config(arch: str, tied: bool | None = None):
    """The config of :func:`tiny_model` (without building weights)."""
    if arch not in ARCHS:
        raise KeyError(f"unknown tiny architecture {arch!r}; known: {', '.join(ARCHS)}")
    cfg_name, _, default_tied, extra = ARCHS[arch]
    tie = default_tied if tied is None else tied
    cfg_cls = getattr(transformers, cfg_name)
    if arch in VLMS:
        return cfg_cls(
            text_config=dict(_text_kwargs(arch), **extra),
            vision_config=_vision_kwargs(arch),
            tie_word_embeddings=tie,
            image_token_id=VOCAB - 3, video_token_id=VOCAB - 4,
            vision_start_token_id=VOCAB - 5, vision_end_token_id=VOCAB - 6,
        )
    return cfg_cls(**_text_kwargs(arch), **extra, tie_word_embeddings=tie)


def tiny_model(arch: str, tied: bool | None = None) -> torch.nn.Module:
    """An initialised tiny random model of ``arch`` (a key of :data:`ARCHS`), in eval mode."""
    cfg = tiny_config(arch, tied)
    torch.manual_seed(0)
    model = getattr(transformers, ARCHS[arch][1])(cfg)
    return model.eval()


def text_config(config):
    """The decoder's config: ``text_config`` for VLMs, the config itself otherwise."""
    return getattr(config, "text_config", None) or config


def decoder_layers(config) -> int:
    return text_config(config).num_hidden_layers


def vision_depth(config) -> int | None:
    vc = getattr(config, "vision_config", None)
    return None if vc is None else vc.depth
