"""Checkpoints and what each tensor is. All checkpoint reading and writing goes through here."""

from .checkpoint import PROVENANCE, Checkpoint, TensorMeta, match_names, open_checkpoint, tensor_bits
from .fingerprint import fingerprint
from .lora import apply_lora, is_lora_folder, lora_delta
from .pair import (
    DTYPE_POLICIES,
    FINE_TUNE_RULE,
    PairDistance,
    PairVerdict,
    RECORDED_PARENT_RULE,
    cast_like,
    shared_vocab,
    check_fine_tune,
    judge_pair,
    parent_record,
    check_pair,
    describe,
    describe_later,
    notes,
    open_one,
    open_pair,
    open_rl,
    pair_distance,
    stream_pair_distance,
    guard_pair_distance,
)
from .resolve import base_of, checkpoint_of, checkpoints_of, open_model, recorded_base
from .safetensors_file import SafetensorsFile, TensorEntry, code_of, dtype_name, torch_dtype
from .taxonomy import (
    BANDS,
    GROUPS,
    Taxonomy,
    TensorRole,
    UnknownTensors,
    band_of,
    band_rule,
    classify,
    parse_layers,
)
from .hf import ImageTextProcessor, is_vision_folder, load_model, load_vlm, distinct_tensors, read_tensors, save_model, storage_key, tensors_bytes, write_tensors
from .writer import OutSpec, check_destination, parse_size, write_checkpoint, write_json_atomic

__all__ = [
    "PROVENANCE", "Checkpoint", "tensor_bits", "code_of", "dtype_name", "torch_dtype", "TensorMeta", "open_checkpoint", "match_names", "open_one", "open_pair", "notes", "fingerprint", "apply_lora",
    "is_lora_folder", "lora_delta", "check_pair", "DTYPE_POLICIES", "cast_like", "shared_vocab", "FINE_TUNE_RULE", "PairDistance",
    "pair_distance", "stream_pair_distance", "guard_pair_distance", "check_fine_tune", "judge_pair", "PairVerdict", "RECORDED_PARENT_RULE", "parent_record", "describe", "describe_later", "open_rl", "recorded_base",
    "base_of", "checkpoint_of", "checkpoints_of", "open_model", "SafetensorsFile", "TensorEntry", "BANDS", "GROUPS", "Taxonomy", "TensorRole",
    "UnknownTensors", "band_of", "band_rule", "classify", "parse_layers", "OutSpec",
    "save_model", "load_model", "load_vlm", "is_vision_folder", "ImageTextProcessor", "read_tensors", "tensors_bytes", "write_tensors", "distinct_tensors", "storage_key", "check_destination", "parse_size", "write_checkpoint", "write_json_atomic",
]
