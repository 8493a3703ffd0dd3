"""An in-memory transformers model (and its tokenizer) written as an HF folder through this package.

State dicts repeat tied parameters under every name (``lm_head.weight`` is ``embed_tokens.weight``);
like ``save_pretrained``, only the first name of each shared storage is written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from .writer import OutSpec, write_checkpoint


def save_model(
    dest: Path,
    model,
    tokenizer=None,
    *,
    provenance: dict,
    inputs: Sequence[Path] = (),
    force: bool = False,
    max_shard_size: int | str = "5GB",
) -> Path:
    """Write ``model`` (a transformers ``PreTrainedModel``) and ``tokenizer`` atomically to ``dest``."""
    seen: set[tuple[int, int]] = set()
    specs = []
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        t = t.detach().cpu().contiguous()
        specs.append(OutSpec(name, t.dtype, tuple(t.shape), (lambda t=t: [t])))
    config = model.config.to_dict()
    with tempfile.TemporaryDirectory() as aux:
        if tokenizer is not None:
            tokenizer.save_pretrained(aux)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(aux)
        return write_checkpoint(
            dest, specs, provenance=provenance, inputs=inputs, aux_from=Path(aux), config=config,
            force=force, max_shard_size=max_shard_size,
        )
