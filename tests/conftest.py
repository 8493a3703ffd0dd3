"""Shared test setup: offline hub, quiet transformers, and tiny random models and tokenizers.

Nothing is downloaded: models are built from their config classes (hidden 32, 2 layers, vocabulary 64)
and the tokenizer is a WordLevel model over a fixed word list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the fixtures' modules: planted, _pairs, models
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The end-to-end runs and simulations (``slow``) first, in their modules' order, then the unit tests: the long
    tests start while every xdist worker is free, and the short ones fill the tail instead of a long one holding it
    (``--dist loadgroup`` hands out the ``xdist_group`` groups first, the largest first, then tests in this order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    """Under ``--dist loadgroup`` each xdist worker names a grouped test's group in its node id (``test@group``), which
    is what keeps a group on one worker: its module fixtures built once, its engines and worker processes one set at
    a time. pytest 9.2's structured node ids ignore that with pytest-xdist ≤ 3.8 (pytest-dev/pytest-xdist#1386), and
    the groups would spread silently: the run stops here instead."""
    if config.getoption("dist", "no") != "loadgroup":
        return
    from importlib.metadata import version

    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(version("pytest-xdist")) < Version("3.9"):
        raise pytest.UsageError(f"--dist loadgroup does not group tests with pytest {pytest.__version__} and "
                                f"pytest-xdist {version('pytest-xdist')} (pytest-dev/pytest-xdist#1386): install "
                                "pytest<9.2 (make setup does)")


TINY_VOCAB = 64
TINY_WORDS = ["[PAD]", "[UNK]", "<s>", "</s>"] + [f"w{i}" for i in range(TINY_VOCAB - 4)]


def make_tiny_lm(arch: str = "qwen3", dtype: torch.dtype = torch.float32, *, tied: bool | None = None,
                 seed: int = 0, vocab: int = TINY_VOCAB, **overrides):
    """A tiny random causal LM in eval mode: ``arch`` in {"qwen3", "llama", "gpt2"}."""
    import transformers

    common = dict(vocab_size=vocab, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    if arch == "gpt2":
        kw = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
        cfg_cls, cls, default_tied = transformers.GPT2Config, transformers.GPT2LMHeadModel, True
    else:
        kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, **common)
        if arch == "qwen3":
            cfg_cls, cls, default_tied = transformers.Qwen3Config, transformers.Qwen3ForCausalLM, True
        elif arch == "llama":
            cfg_cls, cls, default_tied = transformers.LlamaConfig, transformers.LlamaForCausalLM, False
        else:
            raise KeyError(f"unknown tiny arch {arch!r}")
    kw.update(overrides)
    cfg = cfg_cls(**kw, tie_word_embeddings=default_tied if tied is None else tied)
    torch.manual_seed(seed)
    model = cls(cfg)
    # Non-trivial norms, so a norm tensor taken from the wrong place would show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(dtype).eval()


def make_tiny_tokenizer():
    """A WordLevel tokenizer over :data:`TINY_WORDS`, wrapped for transformers."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(TINY_WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="<s>", eos_token="</s>")


def planted_policies(root: Path, children=(("rl", ".self_attn.", 1), ("rl2", ".mlp.", 2))) -> dict[str, Path]:
    """A tiny SFT policy under ``root`` and RL children, each ``(name, where, seed)`` moved by 0.5·N(0, 1) in
    the matrices whose name holds ``where`` (planted), with its SFT parent recorded. Returns name → folder."""
    from graftkit.agent import task_words, tiny_policy
    from graftkit.weights import describe, open_checkpoint, save_model

    sft = tiny_policy(task_words(), "nano", seed=0)
    paths = {"sft": save_model(root / "sft", sft.model, sft.tokenizer, provenance={"producer": "test"})}
    d = describe(open_checkpoint(paths["sft"]))
    for name, where, seed in children:
        m = tiny_policy(task_words(), "nano", seed=0).model
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, q in m.named_parameters():
                if where in n and q.dim() == 2:
                    q.add_(0.5 * torch.randn(q.shape, generator=g))
        paths[name] = save_model(root / name, m, sft.tokenizer, provenance={
            "producer": "test (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    return paths


@pytest.fixture(scope="session")
def tiny_lm():
    """Factory: ``tiny_lm(arch="qwen3", dtype=torch.float32, tied=None, seed=0, **config_overrides)``."""
    return make_tiny_lm


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(autouse=True)
def _graftkit_cache(tmp_path_factory, monkeypatch):
    """Fingerprint caches go to a per-session temporary folder, never to the user's home."""
    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path_factory.getbasetemp() / "graftkit-cache"))
