"""A synthetic Llama base/RL checkpoint pair for the graft benchmarks, generated deterministically.

`make_pair(out_dir)` writes two Hugging Face folders, ``out_dir/base`` and ``out_dir/rl``, each a
``LlamaForCausalLM`` checkpoint: ``config.json`` (``LlamaConfig.to_dict()``, untied lm_head, bf16),
``model-0000k-of-0000n.safetensors`` shards of at most `shard_bytes` and
``model.safetensors.index.json``. ``rl`` is ``base`` plus a small random perturbation of *every*
tensor, so each group (embeddings, attention, MLP, norms, lm_head) moved and a graft that takes the
wrong tensor from the wrong side shows up in a bit-for-bit comparison.

Tensor values come from a generator seeded by (seed, tensor name), so a pair with fewer layers holds
exactly the first layers of a larger one. Tensors are generated one at a time and written one shard
at a time, so memory stays near one shard per side. A manifest (``.synth.json``) records the
parameters; a second call with the same parameters returns at once.

This writes safetensors directly rather than through graftkit's ``weights/`` on purpose: the inputs
of a benchmark must not depend on the code under test.

    python benchmarks/synth.py benchmarks/.work/pair            # defaults: ≈1.9 GB per model
    python benchmarks/synth.py benchmarks/.work/pair-L8 --layers 8
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

SYNTH_VERSION = 1
MANIFEST = ".synth.json"
INDEX = "model.safetensors.index.json"

# Standard deviations: weights like Llama's initializer_range; the RL step is ~10% of a weight's
# scale so every bf16 tensor changes in most entries (norm weights, ≈1, need a larger step to move
# past bf16's 2^-7 spacing there).
WEIGHT_STD = 0.02
NORM_STD = 0.02
DELTA_STD = 0.002
NORM_DELTA_STD = 0.02


@dataclasses.dataclass(frozen=True)
class PairSpec:
    """Shape and seed of a synthetic Llama pair."""

    hidden: int = 2048
    """hidden_size (d_model)."""
    layers: int = 16
    """num_hidden_layers."""
    vocab: int = 32000
    """vocab_size: rows of embed_tokens and lm_head."""
    intermediate: int = 5632
    """intermediate_size (d_mlp) of the SwiGLU MLP."""
    heads: int = 16
    """num_attention_heads; head_dim = hidden // heads."""
    kv_heads: int = 16
    """num_key_value_heads (< heads: grouped-query attention)."""
    dtype: str = "bfloat16"
    """Stored dtype of every tensor."""
    seed: int = 0
    """Base seed; each tensor's generator is seeded by (seed, name)."""
    shard_bytes: int = 1_000_000_000
    """Largest shard file, in bytes of tensor data (HF's max_shard_size)."""

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be a multiple of heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads}")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"dtype={self.dtype!r}: expected bfloat16, float16 or float32")
        if min(self.hidden, self.layers, self.vocab, self.intermediate, self.shard_bytes) <= 0:
            raise ValueError(f"all sizes must be positive: {self}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def tensor_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """LlamaForCausalLM tensor names and shapes, in the order HF's state_dict lists them."""
        h, d_head = self.hidden, self.hidden // self.heads
        kv = self.kv_heads * d_head
        shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            shapes += [
                (f"{p}.self_attn.q_proj.weight", (h, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)),
                (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, h)),
                (f"{p}.mlp.gate_proj.weight", (self.intermediate, h)),
                (f"{p}.mlp.up_proj.weight", (self.intermediate, h)),
                (f"{p}.mlp.down_proj.weight", (h, self.intermediate)),
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.post_attention_layernorm.weight", (h,)),
            ]
        shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (self.vocab, h))]
        return shapes

    def model_bytes(self) -> int:
        item = torch.empty((), dtype=self.torch_dtype).element_size()
        return sum(item * _numel(s) for _, s in self.tensor_shapes())

    def default_dir_name(self) -> str:
        return (f"llama-h{self.hidden}-L{self.layers}-v{self.vocab}-i{self.intermediate}"
                f"-a{self.heads}-kv{self.kv_heads}-{self.dtype}-s{self.seed}")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def llama_config_dict(spec: PairSpec) -> dict:
    """A valid ``LlamaConfig.to_dict()`` for `spec` (transformers imported only here)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        tie_word_embeddings=False,
        architectures=["LlamaForCausalLM"],
    )
    d = config.to_dict()
    # transformers 5 writes `dtype`; readers on 4.x (and mergekit's own checks) look at `torch_dtype`.
    d["dtype"] = spec.dtype
    d["torch_dtype"] = spec.dtype
    d["model_type"] = "llama"
    d["tie_word_embeddings"] = False
    return d


def _generator(spec: PairSpec, name: str, stream: int) -> torch.Generator:
    seed = (spec.seed * 1_000_003 + zlib.crc32(name.encode()) * 4 + stream) % (1 << 63)
    return torch.Generator().manual_seed(seed)


def _tensor_pair(spec: PairSpec, name: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, rl) values of one tensor; rl = base + a small random step, rounded to `spec.dtype`."""
    dt = spec.torch_dtype
    is_norm = len(shape) == 1
    base = torch.randn(shape, generator=_generator(spec, name, 0), dtype=dt)
    base.mul_(NORM_STD if is_norm else WEIGHT_STD)
    if is_norm:
        base.add_(1.0)
    step = torch.randn(shape, generator=_generator(spec, name, 1), dtype=dt)
    step.mul_(NORM_DELTA_STD if is_norm else DELTA_STD)
    rl = base + step
    return base, rl


def _manifest(spec: PairSpec) -> dict:
    return {"synth_version": SYNTH_VERSION, "spec": dataclasses.asdict(spec)}


def _is_complete(out_dir: Path, spec: PairSpec) -> bool:
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    if manifest.get("synth_version") != SYNTH_VERSION or manifest.get("spec") != dataclasses.asdict(spec):
        return False
    for side in ("base", "rl"):
        files = manifest.get("files", {}).get(side, {})
        if not files:
            return False
        for fname, size in files.items():
            path = out_dir / side / fname
            if not path.is_file() or path.stat().st_size != size:
                return False
    return True


def make_pair(out_dir: str | os.PathLike, hidden: int = 2048, layers: int = 16, vocab: int = 32000,
              intermediate: int = 5632, dtype: str = "bfloat16", heads: int = 16,
              kv_heads: int = 16, seed: int = 0, shard_bytes: int = 1_000_000_000,
              verbose: bool = True) -> tuple[Path, Path]:
    """Write (or reuse) the synthetic pair under `out_dir`; return the (base, rl) folders."""
    spec = PairSpec(hidden=hidden, layers=layers, vocab=vocab, intermediate=intermediate,
                    heads=heads, kv_heads=kv_heads, dtype=str(dtype).removeprefix("torch."),
                    seed=seed, shard_bytes=shard_bytes)
    return make_pair_from_spec(out_dir, spec, verbose=verbose)


def _plan_shards(spec: PairSpec) -> list[list[tuple[str, tuple[int, ...]]]]:
    item = torch.empty((), dtype=spec.torch_dtype).element_size()
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in spec.tensor_shapes():
        nbytes = item * _numel(shape)
        if shards[-1] and size + nbytes > spec.shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def make_pair_from_spec(out_dir: str | os.PathLike, spec: PairSpec,
                        verbose: bool = True) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    base_dir, rl_dir = out_dir / "base", out_dir / "rl"
    if _is_complete(out_dir, spec):
        return base_dir, rl_dir

    start = time.perf_counter()
    if verbose:
        print(f"synth: writing {out_dir} ({2 * spec.model_bytes() / 1e9:.2f} GB, {spec})", flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    tmp = {side: out_dir / f".{side}.tmp" for side in ("base", "rl")}
    for d in tmp.values():
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()

    config = llama_config_dict(spec)
    shards = _plan_shards(spec)
    n = len(shards)
    weight_map: dict[str, str] = {}
    total = 0
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{n:05d}.safetensors"
        base_t: dict[str, torch.Tensor] = {}
        rl_t: dict[str, torch.Tensor] = {}
        for name, shape in shard:
            base_t[name], rl_t[name] = _tensor_pair(spec, name, shape)
            weight_map[name] = fname
            total += base_t[name].numel() * base_t[name].element_size()
        save_file(base_t, str(tmp["base"] / fname), metadata={"format": "pt"})
        save_file(rl_t, str(tmp["rl"] / fname), metadata={"format": "pt"})
        del base_t, rl_t

    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files: dict[str, dict[str, int]] = {}
    for side, d in tmp.items():
        (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (d / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        files[side] = {p.name: p.stat().st_size for p in sorted(d.iterdir())}
        final = out_dir / side
        shutil.rmtree(final, ignore_errors=True)
        d.rename(final)
    (out_dir / MANIFEST).write_text(json.dumps({**_manifest(spec), "files": files}, indent=2) + "\n")
    if verbose:
        print(f"synth: done in {time.perf_counter() - start:.1f} s", flush=True)
    return base_dir, rl_dir


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    defaults = PairSpec()
    for f in dataclasses.fields(PairSpec):
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)),
                        default=getattr(defaults, f.name))
    args = ap.parse_args(argv)
    spec = PairSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PairSpec)})
    base, rl = make_pair_from_spec(args.out_dir, spec)
    print(base)
    print(rl)


if __name__ == "__main__":
    main()
