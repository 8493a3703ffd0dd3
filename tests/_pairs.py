"""Base/RL checkpoint pairs with a planted, known delta, for the graft, delta, store and CLI tests.

A *pair* is a tiny random decoder (Qwen3 or Llama; hidden 32, vocab 64, a few layers) saved as ``base``
with :func:`graftkit.weights.save_model`, and an "RL" model = base + a delta planted per group and
layer, saved the same way with ``graftkit.json`` naming the base (``base_model.path`` and ``fingerprint``), so
``--base`` defaults work. Nothing is downloaded.

Which group and layer a tensor belongs to is decided here by a few regular expressions of our own, not
by graftkit's taxonomy tables, so the tests that use it are an independent check of the taxonomy.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Fingerprint cache out of the user's home (one per test process).
os.environ.setdefault("GRAFTKIT_CACHE", tempfile.mkdtemp(prefix="graftkit-test-cache-"))

import torch  # noqa: E402
import transformers  # noqa: E402

from graftkit.weights import describe, open_checkpoint, save_model  # noqa: E402

VOCAB = 64
HIDDEN = 32
TEXT_GROUPS = ("embed", "attn", "mlp", "norm", "lm_head")

# name pattern -> group, first match wins (q_norm/k_norm sit under self_attn: attention, not norm)
_GROUP_RULES = (
    (re.compile(r"^model\.embed_tokens\."), "embed"),
    (re.compile(r"^lm_head\."), "lm_head"),
    (re.compile(r"\.self_attn\."), "attn"),
    (re.compile(r"\.mlp\."), "mlp"),
    (re.compile(r"norm\.weight$"), "norm"),
)
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

#: Default planted scales: every group moves, by a different amount, and attention by layer.
ALL_GROUPS_SCALES: dict[str, float | Callable[[int], float]] = {
    "embed": 0.05,
    "attn": lambda layer: 0.01 * (layer + 1),
    "mlp": 0.02,
    "norm": 0.03,
    "lm_head": 0.04,
}


def group_of(name: str) -> str:
    for rx, g in _GROUP_RULES:
        if rx.search(name):
            return g
    raise KeyError(f"no test rule for tensor {name}")


def layer_of(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m[1]) if m else None


def tiny_model(arch: str = "qwen3", layers: int = 4, tied: bool = False, dtype=torch.float32,
               seed: int = 0, vocab: int = VOCAB):
    """A random tiny decoder built from its transformers config class alone."""
    common = dict(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    cfg_cls, model_cls = {
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**common)).eval()
    # Norm weights start at exactly 1; give them random values so a graft that mixes up norms shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape))
    return model.to(dtype)


def stored_state(model, tied: bool) -> dict[str, torch.Tensor]:
    """The tensors as the files hold them (a tied head is not stored), cloned."""
    sd = model.state_dict()
    return {n: t.detach().clone() for n, t in sd.items() if not (tied and n == "lm_head.weight")}


def planted_deltas(model, scales: Mapping[str, float | Callable[[int], float]], seed: int = 1,
                   tied: bool = False) -> dict[str, torch.Tensor]:
    """A float32 delta per stored tensor: ``scale(group, layer) · N(0, 1)``; zero where no scale."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in stored_state(model, tied).items():
        s = scales.get(group_of(name), 0.0)
        if callable(s):
            s = s(layer_of(name))
        noise = torch.randn(t.shape, generator=g)  # drawn for every tensor: deltas stay reproducible
        out[name] = s * noise
    return out


def apply_deltas(model, deltas: Mapping[str, torch.Tensor], sign: float = 1.0):
    """A copy of ``model`` with ``θ ← round(θ + sign·Δ)`` (computed in float32, rounded to θ's dtype)."""
    rl = copy.deepcopy(model)
    params = dict(rl.named_parameters())
    with torch.no_grad():
        for name, d in deltas.items():
            p = params[name]
            if bool((d != 0).any()):
                p.copy_((p.float() + sign * d).to(p.dtype))
    return rl


def save_base(dest: Path, model, max_shard_size: str = "5GB") -> Path:
    return save_model(dest, model, provenance={"producer": "graftkit tests (tiny base)"},
                      max_shard_size=max_shard_size, force=True)


def save_rl(dest: Path, model, base_path: Path, max_shard_size: str = "5GB", note: str = "planted") -> Path:
    """Save ``model`` as an RL child of ``base_path`` (graftkit.json names the base and its fingerprint)."""
    d = describe(open_checkpoint(base_path))
    return save_model(
        dest, model, inputs=[base_path], force=True, max_shard_size=max_shard_size,
        provenance={"producer": f"graftkit tests ({note})",
                    "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}},
    )


@dataclass
class Pair:
    """A saved base and RL model, their in-memory tensors, and what was planted."""

    base: Path
    rl: Path
    base_sd: dict[str, torch.Tensor]
    rl_sd: dict[str, torch.Tensor]
    deltas: dict[str, torch.Tensor]
    n_layers: int
    tied: bool
    dtype: torch.dtype
    model: object = field(repr=False, default=None)  # the base model, to derive more RL runs from

    @property
    def names(self) -> list[str]:
        return list(self.base_sd)

    def groups_present(self) -> list[str]:
        return sorted({group_of(n) for n in self.names}, key=TEXT_GROUPS.index)


def make_pair(root: Path, arch: str = "qwen3", layers: int = 4, dtype=torch.float32, tied: bool = False,
              scales: Mapping | None = None, max_shard_size: str = "5GB", seed: int = 0,
              mutate: Callable[[dict[str, torch.nn.Parameter]], None] | None = None) -> Pair:
    """Write ``root/base`` and ``root/rl`` (base + planted delta); ``mutate`` may edit the RL in place."""
    root = Path(root)
    model = tiny_model(arch, layers, tied, dtype, seed)
    deltas = planted_deltas(model, ALL_GROUPS_SCALES if scales is None else scales, seed + 1, tied)
    rl_model = apply_deltas(model, deltas)
    if mutate is not None:
        with torch.no_grad():
            mutate(dict(rl_model.named_parameters()))
    base = save_base(root / "base", model, max_shard_size)
    rl = save_rl(root / "rl", rl_model, base, max_shard_size)
    return Pair(base, rl, stored_state(model, tied), stored_state(rl_model, tied), deltas, layers, tied,
                dtype, model)


# ------------------------------------------------------------------------------------ comparisons

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns of ``t`` as a same-width integer tensor."""
    return t.contiguous().view(_INT[t.element_size()])


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.equal(a, b), f"{what}: values differ"
    assert torch.equal(bits(a), bits(b)), f"{what}: bits differ"


def read_all(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a written checkpoint, copied out of its memory map."""
    ck = open_checkpoint(path)
    return {n: ck.read(n).clone() for n in ck.metas}


def assert_checkpoint_equals(path: Path, expected: Mapping[str, torch.Tensor]) -> None:
    got = read_all(path)
    assert set(got) == set(expected), set(got) ^ set(expected)
    for n, t in expected.items():
        assert_bit_equal(got[n], t, n)


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns mapped so adjacent floats differ by 1 (for ulp distances); int64."""
    b = bits(t).to(torch.int64)
    width = 8 * t.element_size()
    sign = 1 << (width - 1)
    b = b & ((1 << width) - 1)  # as unsigned
    return torch.where(b >= sign, -(b - sign), b)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    assert a.dtype == b.dtype
    return (ordered_bits(a) - ordered_bits(b)).abs()
