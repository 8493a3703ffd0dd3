"""A tiny SFT model and an "RL" model with a planted, known delta (a test fixture).

The RL model is the SFT model plus a delta planted in the late layers' attention and MLP matrices and a
larger one in the token embedding (the study's picture: the embedding dominates the movement). The
tensors are chosen by their taxonomy group and layer, as graftkit itself classifies them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from graftkit.weights import describe, open_checkpoint, save_model

VOCAB = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "click", "type", "(", ")", ",", '"'] + [str(i) for i in range(40)] + [
    "button", "link", "tab", "checkbox", "text", "submit", "ok", "cancel", "enter", "select",
]


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )


def tiny_model(seed: int = 0, hidden: int = 64, layers: int = 6):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )
    return Qwen3ForCausalLM(cfg).eval()


def planted_pair(out: Path, seed: int = 0, force: bool = True) -> tuple[Path, Path]:
    """Write ``out/sft`` and ``out/rl`` (SFT + planted delta); returns both paths."""
    model, tok = tiny_model(seed), tiny_tokenizer()
    sft = save_model(out / "sft", model, tok, provenance={"producer": "graftkit demo (tiny SFT, random init)"},
                     force=force)
    n = model.config.num_hidden_layers
    base = open_checkpoint(sft)
    roles = base.taxonomy().roles
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            role = roles[name]
            if role.group in ("attn", "mlp") and role.stack == "decoder" and role.layer >= 2 * n // 3 and p.dim() == 2:
                p.add_(0.02 * torch.randn(p.shape, generator=g))
            elif role.group == "embed":
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    sft_desc = describe(base)
    rl = save_model(
        out / "rl", model, tok, inputs=[sft], force=force,
        provenance={"producer": "graftkit demo (planted delta: late attn+mlp, embed)",
                    "base_model": {"path": sft_desc["path"], "fingerprint": sft_desc["fingerprint"]}},
    )
    return sft, rl
