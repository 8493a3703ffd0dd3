"""Checkpoint reading and writing (``graftkit.weights``): layouts, exact round trips, atomic and safe
writes, one clear error per kind of bad input, pair checks, fingerprints, and untouched inputs.

The reference implementations are transformers (``save_pretrained`` / ``from_pretrained``, logits) and
the ``safetensors`` library (``safe_open``); every value comparison is bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from blake3 import blake3
from safetensors import safe_open
from safetensors.torch import save_file

from graftkit.core.errors import GraftkitError
from graftkit.weights import (
    OutSpec,
    check_pair,
    describe,
    fingerprint,
    open_checkpoint,
    parse_size,
    save_model,
    write_checkpoint,
)
from graftkit.weights.checkpoint import INDEX, PROVENANCE
from graftkit.weights.safetensors_file import MAX_HEADER_BYTES
from graftkit.weights.writer import plan_shards

fingerprint_mod = sys.modules["graftkit.weights.fingerprint"]  # the package re-exports a function by that name

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
IDS = torch.tensor([[2, 5, 9, 17, 33, 4, 60, 11, 8, 3]])
SHARD_FILE = "model-{i:05d}-of-{n:05d}.safetensors"


# ------------------------------------------------------------------------------------------ helpers


def unique_state(model) -> dict[str, torch.Tensor]:
    """The model's state dict without tied duplicates (the first name of each shared storage)."""
    seen, out = set(), {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def sha_tree(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (or of ``folder`` itself when it is a file)."""
    folder = Path(folder)
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    return {str(p.relative_to(folder.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def load_hf(folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def raw_safetensors(path: Path, header: dict, data: bytes = b"", *, n: int | None = None) -> Path:
    """Write a hand-made safetensors file (header dict as given, header length ``n`` if forced)."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw) if n is None else n) + raw + data)
    return path


def header_of(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def specs_from(ck, tensor_names=()) -> list[OutSpec]:
    """Output specs for every tensor of ``ck``: raw byte ranges, except ``tensor_names`` given as
    tensors in row chunks (the two kinds of source the writer accepts)."""
    specs = []
    for name, m in ck.metas.items():
        if name in tensor_names or name not in ck.raw:
            src = (lambda name=name: list(torch.chunk(ck.read(name), 3)) if ck.read(name).dim()
                   else [ck.read(name)])
        else:
            src = ck.raw[name]
        specs.append(OutSpec(name, m.dtype, m.shape, src))
    return specs


# ----------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def models(tiny_lm):
    """One tiny tied Qwen3 per dtype (the same random init, cast)."""
    return {dt: tiny_lm("qwen3", dt) for dt in DTYPES}


@pytest.fixture(scope="module")
def saved(models, tiny_tokenizer, tmp_path_factory):
    """save_pretrained folders per dtype (with the tokenizer): a single-file one and a sharded one (≥ 3
    shards)."""
    root = tmp_path_factory.mktemp("saved")
    out = {}
    for dt, name in zip(DTYPES, DTYPE_IDS):
        single, sharded = root / f"{name}-single", root / f"{name}-sharded"
        models[dt].save_pretrained(single)
        models[dt].save_pretrained(sharded, max_shard_size="12KB")
        for folder in (single, sharded):
            tiny_tokenizer.save_pretrained(folder)
        out[dt] = {"single": single, "sharded": sharded}
    return out


@pytest.fixture()
def src(saved, tmp_path):
    """A private copy of the fp32 single-file folder, for tests that may damage their input."""
    dst = tmp_path / "src"
    shutil.copytree(saved[torch.float32]["single"], dst)
    return dst


# ------------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("layout", ["single", "sharded", "file"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_open_checkpoint_matches_model_bit_for_bit(models, saved, layout, dtype):
    model = models[dtype]
    folder = saved[dtype]["sharded" if layout == "sharded" else "single"]
    path = folder / "model.safetensors" if layout == "file" else folder
    if layout == "sharded":
        shards = sorted(folder.glob("model-*-of-*.safetensors"))
        assert len(shards) >= 3 and (folder / INDEX).is_file()

    ck = open_checkpoint(path)

    expected = unique_state(model)
    assert "lm_head.weight" not in expected  # tied: the head is the embedding
    assert set(ck.names) == set(expected)
    for name, t in expected.items():
        meta = ck.metas[name]
        assert meta.dtype == t.dtype == dtype
        assert meta.shape == tuple(t.shape)
        assert meta.nbytes == t.numel() * t.element_size()
        got = ck.read(name)
        assert same_bits(got, t), name
        assert ck.raw[name].nbytes == meta.nbytes
    if layout == "file":
        assert ck.kind == "safetensors-file" and ck.config is None
        assert ck.weight_files == (path,)
    else:
        assert ck.kind == "hf-folder"
        assert ck.model_type == "qwen3" and ck.tied is True
        assert len(ck.weight_files) == (len(shards) if layout == "sharded" else 1)
    assert ck.provenance is None  # not written by graftkit
    assert ck.nbytes == sum(t.numel() * t.element_size() for t in expected.values())


def test_reader_is_private_and_lazy(src):
    """A read tensor is a view of a private mapping: writing into it never reaches the file."""
    before = sha_tree(src)
    ck = open_checkpoint(src)
    t = ck.read("model.embed_tokens.weight")
    original = t.clone()
    t.add_(1.0)  # a careless caller modifying the view
    assert not torch.equal(t, original)
    assert sha_tree(src) == before
    fresh = open_checkpoint(src).read("model.embed_tokens.weight")
    assert same_bits(fresh, original)


def test_unaligned_header_and_empty_tensor(tmp_path):
    """Headers whose length is not a multiple of 8 and zero-size tensors read correctly."""
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    b = torch.tensor([1, -2, 3], dtype=torch.int16)
    data = a.numpy().tobytes() + b.numpy().tobytes()
    header = {
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "I16", "shape": [3], "data_offsets": [24, 30]},
        "empty": {"dtype": "BF16", "shape": [0, 4], "data_offsets": [30, 30]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8 + 3)  # deliberately misaligned
    assert len(raw) % 8 == 3
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    ck = open_checkpoint(path)
    assert torch.equal(ck.read("a"), a) and torch.equal(ck.read("b"), b)
    assert ck.read("empty").shape == (0, 4) and ck.read("empty").dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------ writing


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_save_model_round_trip(models, saved, tiny_tokenizer, tmp_path, dtype):
    from transformers import AutoTokenizer

    model = models[dtype]
    dest = tmp_path / "out"
    prov = {"produced_by": "test", "parents": [], "config": {"alpha": 1.0}}
    assert save_model(dest, model, tiny_tokenizer, provenance=prov) == dest.resolve()

    names = sorted(p.name for p in dest.iterdir())
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors", PROVENANCE):
        assert f in names, names
    assert json.loads((dest / PROVENANCE).read_text()) == prov
    assert not any(n.startswith(".") for n in os.listdir(tmp_path))  # no temp folder left

    ck = open_checkpoint(dest)
    assert ck.provenance == prov
    expected = unique_state(model)
    assert set(ck.names) == set(expected)
    for name, t in expected.items():
        assert same_bits(ck.read(name), t), name

    loaded = load_hf(dest, dtype)
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    # The reference is transformers' own round trip: a model cast with .to(bf16) also casts its rotary
    # buffers, which from_pretrained keeps in fp32, so only the fp32 source computes identically.
    assert torch.equal(logits(loaded), logits(load_hf(saved[dtype]["single"], dtype)))
    if dtype == torch.float32:
        assert torch.equal(logits(loaded), logits(model))

    tok = AutoTokenizer.from_pretrained(dest)
    text = "<s> w1 w7 w59 nope </s>"
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"] == [2, 5, 11, 63, 1, 3]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_save_model_of_save_pretrained_gives_same_bytes(models, saved, tmp_path, dtype):
    """The two writers agree tensor by tensor, and safetensors reads graftkit's output."""
    dest = save_model(tmp_path / "out", models[dtype], provenance={"t": 1})
    ours = dest / "model.safetensors"
    theirs = saved[dtype]["single"] / "model.safetensors"
    n, _ = header_of(ours)
    assert (8 + n) % 8 == 0  # data region aligned
    with safe_open(ours, "pt") as a, safe_open(theirs, "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for k in a.keys():
            assert same_bits(a.get_tensor(k), b.get_tensor(k)), k


@pytest.mark.parametrize("input_layout", ["single", "sharded", "file", "graftkit-sharded"])
def test_write_checkpoint_from_checkpoint(models, saved, tiny_tokenizer, tmp_path, input_layout):
    """Streaming a checkpoint through write_checkpoint (byte ranges and tensor chunks) is exact, whether
    transformers or graftkit wrote the input."""
    folder = saved[torch.bfloat16]["sharded" if input_layout == "sharded" else "single"]
    if input_layout == "graftkit-sharded":
        folder = save_model(tmp_path / "gk", models[torch.bfloat16], tiny_tokenizer, provenance={"in": 1},
                            max_shard_size=6000)
    path = folder / "model.safetensors" if input_layout == "file" else folder
    ck = open_checkpoint(path)
    if input_layout == "graftkit-sharded":
        assert ck.provenance == {"in": 1} and len(ck.weight_files) >= 3
    chunked = {"model.layers.0.mlp.down_proj.weight", "model.norm.weight", "model.embed_tokens.weight"}
    seen = []
    dest = write_checkpoint(
        tmp_path / "out", specs_from(ck, chunked), provenance={"kind": "copy"}, inputs=[path],
        aux_from=folder, config=ck.config, on_tensor=lambda s: seen.append(s.name),
    )
    assert seen == ck.names
    out = open_checkpoint(dest)
    assert out.names == ck.names
    for n in ck.names:
        assert out.metas[n] == ck.metas[n]
        assert same_bits(out.read(n), ck.read(n)), n
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        assert (dest / f).is_file(), f
    assert not (dest / INDEX).exists()  # the input's index is not copied over a one-file output
    assert json.loads((dest / PROVENANCE).read_text()) == {"kind": "copy"}
    assert torch.equal(logits(load_hf(dest, torch.bfloat16)), logits(load_hf(folder, torch.bfloat16)))


def test_sharded_output_follows_hf_layout_and_rule(models, tiny_tokenizer, tmp_path):
    model = models[torch.float32]
    max_size = 5000  # smaller than the 64×32 fp32 embedding (8192 bytes): one shard must exceed it
    dest = save_model(tmp_path / "out", model, tiny_tokenizer, provenance={"t": 1}, max_shard_size=max_size)
    shards = sorted(dest.glob("*.safetensors"))
    n = len(shards)
    assert n >= 3
    assert [p.name for p in shards] == [SHARD_FILE.format(i=i, n=n) for i in range(1, n + 1)]
    assert not (dest / "model.safetensors").exists()

    index = json.loads((dest / INDEX).read_text())
    expected = unique_state(model)
    total = sum(t.numel() * t.element_size() for t in expected.values())
    assert index["metadata"]["total_size"] == total
    assert set(index["weight_map"]) == set(expected)

    sizes, in_shard = [], []
    for p in shards:
        with safe_open(p, "pt") as f:
            keys = list(f.keys())
            for k in keys:
                assert index["weight_map"][k] == p.name
                assert same_bits(f.get_tensor(k), expected[k]), k
        _, header = header_of(p)
        header.pop("__metadata__", None)
        order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
        in_shard.append([header[k]["data_offsets"][1] - header[k]["data_offsets"][0] for k in order])
        sizes.append(sum(in_shard[-1]))
    oversized = 0
    for i, (size, tensors) in enumerate(zip(sizes, in_shard)):
        if size > max_size:  # HF's rule: only a single tensor larger than the limit may overflow
            assert len(tensors) == 1 and tensors[0] > max_size
            oversized += 1
        if i + 1 < n:  # a new shard starts only when the next tensor would not fit
            assert size + in_shard[i + 1][0] > max_size
    assert oversized >= 1

    assert torch.equal(logits(load_hf(dest, torch.float32)), logits(model))
    ck = open_checkpoint(dest)
    assert len(ck.weight_files) == n and set(ck.names) == set(expected)


@pytest.mark.parametrize("copied", [0, 100], ids=["no-copy_file_range", "partial-copy_file_range"])
def test_copy_without_kernel_copy(src, tmp_path, monkeypatch, copied):
    """Where copy_file_range fails (another file system, an old kernel), the copy finishes in user space."""
    real = os.copy_file_range
    budget = [copied]

    def flaky(in_fd, out_fd, count, offset_src=None, *args):
        if budget[0] <= 0:
            raise OSError(18, "Invalid cross-device link")
        n = real(in_fd, out_fd, min(count, budget[0]), offset_src, *args)
        budget[0] -= n
        return n

    monkeypatch.setattr(os, "copy_file_range", flaky)
    ck = open_checkpoint(src)
    dest = write_checkpoint(tmp_path / "out", specs_from(ck), provenance={}, inputs=[src], max_shard_size=6000)
    out = open_checkpoint(dest)
    assert out.names == ck.names
    assert all(same_bits(out.read(n), ck.read(n)) for n in ck.names)


def test_plan_shards_rule():
    def spec(name, nbytes):
        return OutSpec(name, torch.uint8, (nbytes,), lambda: [])

    specs = [spec(f"t{i}", s) for i, s in enumerate([3, 3, 3, 10, 1, 1, 6, 7])]
    plan = [[s.out.nbytes for s in shard] for shard in plan_shards(specs, 6)]
    assert plan == [[3, 3], [3], [10], [1, 1], [6], [7]]
    assert plan_shards([], 6) == []
    assert len(plan_shards(specs, 10**9)) == 1


@pytest.mark.parametrize(
    "text,value",
    [("5GB", 5 * 10**9), ("2GiB", 2 * 2**30), ("500MB", 500 * 10**6), ("10KB", 10_000), ("1.5kib", 1536),
     ("123", 123), (4096, 4096)],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_parse_size_refuses_garbage():
    with pytest.raises(GraftkitError, match="not a size"):
        parse_size("five gigs")


def test_all_dtypes_round_trip(tmp_path):
    """Every dtype keeps its code and bytes through write_checkpoint, as the safetensors library reads it."""
    torch.manual_seed(1)
    tensors = {
        "f64": torch.randn(3, 5, dtype=torch.float64),
        "f32": torch.randn(4, 3),
        "f16": torch.randn(7).half(),
        "bf16": torch.randn(2, 2, 3).bfloat16(),
        "f8e4m3": torch.randn(8, 2).to(torch.float8_e4m3fn),
        "f8e5m2": torch.randn(5).to(torch.float8_e5m2),
        "i64": torch.randint(-(2**40), 2**40, (3,)),
        "i32": torch.randint(-1000, 1000, (2, 3), dtype=torch.int32),
        "i16": torch.randint(-1000, 1000, (3,), dtype=torch.int16),
        "i8": torch.randint(-100, 100, (9,), dtype=torch.int8),
        "u8": torch.randint(0, 255, (4,), dtype=torch.uint8),
        "u16": torch.tensor([1, 60000, 7], dtype=torch.uint16),
        "u32": torch.tensor([1, 4_000_000_000], dtype=torch.uint32),
        "u64": torch.tensor([2**63 + 5], dtype=torch.uint64),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
    }
    specs = [OutSpec(k, t.dtype, tuple(t.shape), (lambda t=t: [t])) for k, t in tensors.items()]
    dest = write_checkpoint(tmp_path / "out", specs, provenance={}, inputs=[])
    ck = open_checkpoint(dest)
    with safe_open(dest / "model.safetensors", "pt") as f:
        for k, t in tensors.items():
            assert ck.metas[k].dtype == t.dtype and ck.metas[k].shape == tuple(t.shape)
            assert same_bits(ck.read(k), t), k
            assert same_bits(f.get_tensor(k), t), k


# ------------------------------------------------------------------------------ atomicity and safety


def failing_specs(ck, fail_at: int, exc: BaseException) -> list[OutSpec]:
    specs = specs_from(ck)

    def boom():
        raise exc

    s = specs[fail_at]
    specs[fail_at] = OutSpec(s.name, s.dtype, s.shape, boom)
    return specs


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()], ids=["error", "interrupt"])
@pytest.mark.parametrize("max_shard_size", ["5GB", 5000], ids=["single", "sharded"])
def test_failed_write_leaves_nothing(src, tmp_path, exc, max_shard_size):
    ck = open_checkpoint(src)
    parent = tmp_path / "parent"
    parent.mkdir()
    with pytest.raises(type(exc)):
        write_checkpoint(parent / "out", failing_specs(ck, len(ck.names) - 2, exc), provenance={},
                         inputs=[src], aux_from=src, max_shard_size=max_shard_size)
    assert list(parent.iterdir()) == []


def test_failed_forced_rewrite_keeps_old_destination(src, models, tmp_path):
    dest = save_model(tmp_path / "out", models[torch.float32], provenance={"version": "old"})
    before = sha_tree(dest)
    ck = open_checkpoint(src)
    with pytest.raises(RuntimeError, match="mid-write"):
        write_checkpoint(dest, failing_specs(ck, 5, RuntimeError("mid-write")), provenance={"version": "new"},
                         inputs=[src], force=True)
    assert sha_tree(dest) == before
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]

    # and a successful forced rewrite replaces it, leaving no old copy behind
    write_checkpoint(dest, specs_from(ck), provenance={"version": "new"}, inputs=[src], aux_from=src, force=True)
    assert json.loads((dest / PROVENANCE).read_text()) == {"version": "new"}
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]


def test_destination_overlapping_an_input_is_refused(src, models, tmp_path):
    model = models[torch.float32]
    ck = open_checkpoint(src)
    before = sha_tree(src)
    outer = tmp_path / "outer"
    nested_input = outer / "models" / "sft"
    shutil.copytree(src, nested_input)
    cases = [
        (src, [src]),  # the input itself
        (src / "graft", [src]),  # inside the input
        (outer, [nested_input]),  # containing the input
        (src / "sub", [src / "model.safetensors"]),  # inside a single-file input's folder
        (tmp_path / "x" / ".." / "src", [src]),  # the same folder spelled differently
    ]
    for dest, inputs in cases:
        with pytest.raises(GraftkitError, match="overlaps the input") as err:
            write_checkpoint(dest, specs_from(ck), provenance={}, inputs=inputs, force=True)
        assert str(Path(inputs[0]).resolve()) in str(err.value)
        with pytest.raises(GraftkitError, match="overlaps"):
            save_model(dest, model, provenance={}, inputs=inputs, force=True)
    assert sha_tree(src) == before
    assert not (src / "graft").exists() and not (src / "sub").exists()


def test_existing_destination_needs_force(src, models, tmp_path):
    model = models[torch.float32]
    dest = save_model(tmp_path / "out", model, provenance={"n": 1})
    with pytest.raises(GraftkitError, match="--force") as err:
        save_model(dest, model, provenance={"n": 2})
    assert str(dest) in str(err.value) and "already exists" in str(err.value)
    assert json.loads((dest / PROVENANCE).read_text()) == {"n": 1}
    save_model(dest, model, provenance={"n": 2}, force=True)
    assert json.loads((dest / PROVENANCE).read_text()) == {"n": 2}

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GraftkitError, match="--force"):
        save_model(empty, model, provenance={})
    save_model(empty, model, provenance={}, force=True)  # an empty folder holds nothing to lose
    assert (empty / "model.safetensors").is_file()


def test_foreign_folder_is_never_replaced(src, models, tmp_path):
    model = models[torch.float32]
    foreign = tmp_path / "thesis"
    foreign.mkdir()
    (foreign / "chapter1.tex").write_text("irreplaceable")
    for force in (False, True):
        with pytest.raises(GraftkitError) as err:
            save_model(foreign, model, provenance={}, force=force)
        if force:
            assert "not written by graftkit" in str(err.value)
    assert os.listdir(foreign) == ["chapter1.tex"]
    # a save_pretrained folder (no graftkit.json) is foreign too
    with pytest.raises(GraftkitError, match="not written by graftkit"):
        save_model(src, model, provenance={}, force=True)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(GraftkitError, match="not written by graftkit"):
        save_model(a_file, model, provenance={}, force=True)
    assert a_file.read_text() == "x"


# ------------------------------------------------------------------------------------- bad input


def _err(path, **kw) -> str:
    with pytest.raises(GraftkitError) as err:
        open_checkpoint(path, **kw)
    return str(err.value)


def test_missing_path(tmp_path):
    msg = _err(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in msg and "no such file or folder" in msg


def test_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    msg = _err(tmp_path)
    assert str(tmp_path) in msg and "no weights found" in msg


def test_not_a_checkpoint_file(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    msg = _err(p)
    assert str(p) in msg and "not a checkpoint" in msg


def test_corrupt_config_json(src):
    (src / "config.json").write_text("{ not json")
    msg = _err(src)
    assert str(src / "config.json") in msg and "JSON" in msg


def test_index_listing_a_missing_shard(saved, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(saved[torch.float32]["sharded"], folder)
    shards = sorted(folder.glob("model-*.safetensors"))
    shards[1].unlink()
    msg = _err(folder)
    assert shards[1].name in msg and "missing" in msg and INDEX in msg
    for other in (shards[0], shards[2]):
        assert other.name not in msg


@pytest.mark.parametrize("damage", ["extra", "moved"])
def test_index_disagreeing_with_shards(saved, tmp_path, damage):
    """A tensor the index lists must be in the shard it names (else a tensor would vanish silently)."""
    folder = tmp_path / "sharded"
    shutil.copytree(saved[torch.float32]["sharded"], folder)
    index = json.loads((folder / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    if damage == "extra":
        name = "model.layers.1.mlp.extra_proj.weight"
        index["weight_map"][name] = shards[0]
    else:
        name = next(n for n, f in index["weight_map"].items() if f == shards[-1])
        index["weight_map"][name] = shards[0]
    (folder / INDEX).write_text(json.dumps(index))
    msg = _err(folder)
    assert f"tensor {name} " in msg and shards[0] in msg and INDEX in msg
    if damage == "moved":
        assert shards[-1] in msg


def test_index_without_weight_map(src):
    (src / INDEX).write_text(json.dumps({"metadata": {}}))
    msg = _err(src)
    assert INDEX in msg and "weight_map" in msg


def test_same_tensor_in_two_files(tmp_path):
    save_file({"a": torch.zeros(2), "b": torch.ones(2)}, tmp_path / "part1.safetensors")
    save_file({"a": torch.ones(2)}, tmp_path / "part2.safetensors")
    msg = _err(tmp_path)
    assert "tensor a" in msg and "part1.safetensors" in msg and "part2.safetensors" in msg


def test_truncated_in_data_region(src):
    f = src / "model.safetensors"
    n, header = header_of(f)
    header.pop("__metadata__", None)
    last = max(header, key=lambda k: header[k]["data_offsets"][1])
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size - 10)
    msg = _err(src)
    assert str(f) in msg and "truncated" in msg and f"tensor {last} " in msg
    msg = _err(f)  # the file on its own
    assert str(f) in msg and last in msg


def test_truncated_in_header(src):
    f = src / "model.safetensors"
    n, _ = header_of(f)
    with open(f, "r+b") as fh:
        fh.truncate(8 + n // 2)
    msg = _err(f)
    assert str(f) in msg and "truncated" in msg and "header" in msg


@pytest.mark.parametrize("nbytes", [0, 5])
def test_shorter_than_length_prefix(tmp_path, nbytes):
    f = tmp_path / "tiny.safetensors"
    f.write_bytes(b"\x01" * nbytes)
    msg = _err(f)
    assert str(f) in msg and "truncated" in msg and "8-byte" in msg


@pytest.mark.parametrize(
    "raw", [b"{this is not json", b"[1, 2, 3]", b"\xff\xfe\xfd\xfc", b'"a string"'],
    ids=["syntax", "list", "binary", "string"],
)
def test_corrupt_header_json(tmp_path, raw):
    f = tmp_path / "bad.safetensors"
    raw += b" " * (-len(raw) % 8)
    f.write_bytes(struct.pack("<Q", len(raw)) + raw)
    msg = _err(f)
    assert str(f) in msg and "corrupt safetensors header" in msg


def test_header_length_over_limit(tmp_path):
    f = raw_safetensors(tmp_path / "huge.safetensors", {}, n=MAX_HEADER_BYTES + 1)
    msg = _err(f)
    assert str(f) in msg and f"{MAX_HEADER_BYTES + 1:,}" in msg and "100,000,000" in msg
    f = raw_safetensors(tmp_path / "huger.safetensors", {}, n=2**63)
    assert str(f) in _err(f)


@pytest.mark.parametrize(
    "spec",
    [
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]},  # too short for its shape
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 28]},  # too long
        {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]},  # sized for F32
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [24, 0]},  # reversed
        {"dtype": "F32", "shape": [2, 3], "data_offsets": [-4, 20]},  # negative
    ],
    ids=["short", "long", "wrong-dtype-size", "reversed", "negative"],
)
def test_data_offsets_inconsistent_with_shape(tmp_path, spec):
    f = raw_safetensors(tmp_path / "bad.safetensors", {"w.weight": spec}, b"\0" * 64)
    msg = _err(f)
    assert str(f) in msg and "w.weight" in msg and "data_offsets" in msg


@pytest.mark.parametrize(
    "spec",
    [
        {"dtype": "F32", "shape": [2]},  # no offsets
        {"dtype": "F32", "shape": "two", "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0]},
        {"dtype": "F32", "shape": [2], "data_offsets": ["0", "x"]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0, None]},
        {"dtype": "F32", "shape": [-2, -1], "data_offsets": [0, 8]},
        {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]},
        "not an object",
    ],
    ids=["no-offsets", "shape-string", "one-offset", "string-offsets", "null-offset", "negative-shape",
         "list-dtype", "float-shape", "string-entry"],
)
def test_malformed_header_entry(tmp_path, spec):
    f = raw_safetensors(tmp_path / "bad.safetensors", {"w.weight": spec}, b"\0" * 8)
    msg = _err(f)
    assert str(f) in msg and "w.weight" in msg


@pytest.mark.parametrize("code", ["F4", "C64", "f32", "Q8_0"])
def test_unsupported_dtype(tmp_path, code):
    f = raw_safetensors(tmp_path / "bad.safetensors", {"w.weight": {"dtype": code, "shape": [2], "data_offsets": [0, 8]}},
                        b"\0" * 8)
    msg = _err(f)
    assert str(f) in msg and "w.weight" in msg and f"unsupported dtype {code}" in msg and "BF16" in msg


def test_bad_shard_inside_sharded_folder(saved, tmp_path):
    """Every shard's header is checked when the folder is opened, before any tensor is read."""
    folder = tmp_path / "sharded"
    shutil.copytree(saved[torch.float32]["sharded"], folder)
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as fh:
        fh.truncate(shard.stat().st_size - 1)
    msg = _err(folder)
    assert str(shard) in msg and "truncated" in msg


# ------------------------------------------------------------------------------------------ pickles


def test_no_pickle_refuses_pickles_naming_the_file(models, tmp_path):
    sd = models[torch.float32].state_dict()
    folder = tmp_path / "pt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    torch.save(sd, folder / "pytorch_model.bin")
    for path in (folder, folder / "pytorch_model.bin"):
        msg = _err(path, no_pickle=True)
        assert "pytorch_model.bin" in msg and "--no-pickle" in msg and "refused" in msg
    single = tmp_path / "weights.pt"
    torch.save(sd, single)
    msg = _err(single, no_pickle=True)
    assert str(single) in msg and "--no-pickle" in msg and "safetensors only" in msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_pickle_loads_state_dict(models, tmp_path, dtype):
    model = models[dtype]
    sd = model.state_dict()
    folder = tmp_path / "pt"
    folder.mkdir()
    model.config.to_json_file(folder / "config.json")
    torch.save(sd, folder / "pytorch_model.bin")
    for path in (folder, folder / "pytorch_model.bin"):
        ck = open_checkpoint(path)
        assert ck.kind == "pickle" and "restricted unpickler" in ck.precision["source"]
        assert set(ck.names) == set(sd)  # a pickled state dict keeps the tied alias
        for name, t in sd.items():
            assert ck.metas[name].dtype == t.dtype and ck.metas[name].shape == tuple(t.shape)
            assert same_bits(ck.read(name), t), name
    assert open_checkpoint(folder).model_type == "qwen3"


def test_sharded_pickle_with_index(models, tmp_path):
    sd = models[torch.float32].state_dict()
    names = list(sd)
    half = len(names) // 2
    folder = tmp_path / "pt"
    folder.mkdir()
    parts = {"pytorch_model-00001-of-00002.bin": names[:half], "pytorch_model-00002-of-00002.bin": names[half:]}
    for fname, keys in parts.items():
        torch.save({k: sd[k] for k in keys}, folder / fname)
    (folder / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    assert "--no-pickle" in _err(folder, no_pickle=True)
    ck = open_checkpoint(folder)
    assert set(ck.names) == set(sd)
    assert all(same_bits(ck.read(n), sd[n]) for n in sd)


class _Payload:
    """Unpickling this would create ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _Plain:
    """An ordinary custom object: its pickle names this class, which weights_only refuses."""

    def __init__(self):
        self.x = 1


def test_pickle_with_code_is_refused_by_default(tmp_path):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.bin"
    torch.save({"w": torch.zeros(2), "x": _Payload(marker)}, evil)
    msg = _err(evil)
    assert str(evil) in msg and "weights_only" in msg
    assert "\n" not in msg
    assert not marker.exists()

    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.zeros(2), "obj": _Plain()}, plain)
    msg = _err(plain)
    assert str(plain) in msg and "weights_only" in msg

    # the payload is live: an unrestricted load would have run it
    torch.load(evil, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize(
    "obj", [[torch.zeros(2)], {"w": torch.zeros(2), "step": 3}, {"w": {"nested": torch.zeros(2)}}],
    ids=["list", "int-value", "nested"],
)
def test_pickle_that_is_not_a_state_dict(tmp_path, obj):
    f = tmp_path / "model.bin"
    torch.save(obj, f)
    msg = _err(f)
    assert str(f) in msg and "not a state dict of tensors" in msg


def test_pickle_that_is_not_a_pickle(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"garbage" * 10)
    msg = _err(f)
    assert str(f) in msg and "\n" not in msg


# -------------------------------------------------------------------------------------- check_pair


@pytest.fixture(scope="module")
def pair_root(tmp_path_factory, tiny_lm):
    root = tmp_path_factory.mktemp("pairs")
    variants = {
        "base": dict(),
        "rl": dict(seed=1),
        "untied": dict(tied=False),
        "narrow": dict(intermediate_size=48),
        "vocab": dict(vocab=72),
        "bf16": dict(dtype=torch.bfloat16),
    }
    for name, kw in variants.items():
        tiny_lm("qwen3", **kw).save_pretrained(root / name)
    return root


def _pair_error(root: Path, rl: str) -> str:
    base = open_checkpoint(root / "base")
    with pytest.raises(GraftkitError) as err:
        check_pair(base, open_checkpoint(root / rl), base.taxonomy())
    return str(err.value)


def test_check_pair_accepts_same_architecture(pair_root):
    base, rl = open_checkpoint(pair_root / "base"), open_checkpoint(pair_root / "rl")
    check_pair(base, rl, base.taxonomy())


def test_check_pair_different_tensor_sets(pair_root):
    msg = _pair_error(pair_root, "untied")
    assert "different tensors" in msg and "only in RL: lm_head.weight" in msg
    assert str(pair_root / "base") in msg and str(pair_root / "untied") in msg


def test_check_pair_different_shapes(pair_root):
    msg = _pair_error(pair_root, "narrow")
    assert re.search(r"tensor model\.layers\.0\.mlp\.\w+_proj\.weight has shape "
                     r"\[(32, 64|64, 32)\] in base but \[(32, 48|48, 32)\] in RL", msg), msg
    assert "vocabulary" not in msg


def test_check_pair_vocabulary_mismatch(pair_root):
    msg = _pair_error(pair_root, "vocab")
    assert "vocabulary" in msg and "model.embed_tokens.weight" in msg
    assert "[64, 32]" in msg and "[72, 32]" in msg


def test_check_pair_dtype_mismatch(pair_root):
    msg = _pair_error(pair_root, "bf16")
    assert "float32" in msg and "bfloat16" in msg and "model.embed_tokens.weight" in msg


# ------------------------------------------------------------------------------------- fingerprint


def _files(folder: Path) -> list[Path]:
    return [*sorted(folder.glob("*.safetensors")), folder / "config.json"]


def test_fingerprint_content_not_path(saved, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path / "cache"))
    a = saved[torch.float32]["sharded"]
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    assert fingerprint(_files(a)) == fingerprint(_files(b))
    assert describe(open_checkpoint(a))["fingerprint"] == describe(open_checkpoint(b))["fingerprint"] == fingerprint(_files(a))
    assert fingerprint(_files(a)).startswith("blake3:") and len(fingerprint(_files(a))) == len("blake3:") + 64
    assert fingerprint(_files(a)) != fingerprint(_files(saved[torch.bfloat16]["sharded"]))

    shard = sorted(b.glob("model-*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0x01  # one bit of one byte of weights
    shard.write_bytes(bytes(data))
    assert fingerprint(_files(a)) != fingerprint(_files(b))


def test_fingerprint_cache_hits_and_invalidation(src, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GRAFTKIT_CACHE", str(cache))
    files = _files(src)
    hashed = []
    real = fingerprint_mod.digest_file
    monkeypatch.setattr(fingerprint_mod, "digest_file", lambda p, a="blake3": hashed.append(Path(p).name) or real(p, a))

    # files younger than the settle time are never cached (tested below); these are fresh
    monkeypatch.setattr(fingerprint_mod, "_SETTLE_S", 0.0)
    first = fingerprint(files)
    assert sorted(hashed) == sorted(p.name for p in files)
    assert (cache / "blake3.json").is_file()
    hashed.clear()
    assert fingerprint(files) == first and hashed == []  # all from the cache

    # change one byte in place: same size, same inode — the cache must notice
    w = src / "model.safetensors"
    with open(w, "r+b") as fh:
        fh.seek(-5, os.SEEK_END)
        b = fh.read(1)
        fh.seek(-5, os.SEEK_END)
        fh.write(bytes([b[0] ^ 0xFF]))
    changed = fingerprint(files)
    assert hashed == ["model.safetensors"]
    assert changed != first
    expected = blake3("\n".join(sorted(
        f"{p.name} {blake3(p.read_bytes()).hexdigest()}" for p in files)).encode()).hexdigest()
    assert changed == f"blake3:{expected}"

    # a corrupt cache file is only a cache miss
    (cache / "blake3.json").write_text("{garbage")
    hashed.clear()
    assert fingerprint(files) == changed and len(hashed) == len(files)


# ----------------------------------------------------------------------------------- inputs untouched


def test_inputs_untouched_by_reads_and_writes(saved, tmp_path):
    inputs = [saved[torch.bfloat16]["sharded"], saved[torch.float32]["single"]]
    before = {str(p): sha_tree(p) for p in inputs}
    mtimes = {str(p): p.stat().st_mtime_ns for i in inputs for p in i.iterdir()}

    for k, path in enumerate(inputs):
        ck = open_checkpoint(path)
        for n in ck.names:
            ck.read(n).mul_(0)  # scribble over every view
        # a full copy (kernel byte ranges), a chunked copy, a failed write and a forced rewrite
        dest = write_checkpoint(tmp_path / f"copy{k}", specs_from(ck), provenance={}, inputs=[path],
                                aux_from=path, max_shard_size=6000)
        write_checkpoint(tmp_path / f"chunks{k}", specs_from(open_checkpoint(path), set(ck.names)),
                         provenance={}, inputs=[path], aux_from=path)
        with pytest.raises(RuntimeError):
            write_checkpoint(dest, failing_specs(open_checkpoint(path), 3, RuntimeError("x")), provenance={},
                             inputs=[path], aux_from=path, force=True)
        write_checkpoint(dest, specs_from(open_checkpoint(path)), provenance={}, inputs=[path], aux_from=path,
                         force=True)
        describe(open_checkpoint(path))
        with pytest.raises(GraftkitError):
            write_checkpoint(path, specs_from(open_checkpoint(path)), provenance={}, inputs=[path], force=True)
        out = open_checkpoint(dest)
        fresh = open_checkpoint(path)
        assert all(same_bits(out.read(n), fresh.read(n)) for n in fresh.names)

    assert {str(p): sha_tree(p) for p in inputs} == before
    assert {str(p): p.stat().st_mtime_ns for i in inputs for p in i.iterdir()} == mtimes


def test_fingerprint_does_not_cache_files_modified_just_now(src, tmp_path, monkeypatch):
    """A same-size edit within the clock's granularity must not hide behind a cached key."""
    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint_mod, "_SETTLE_S", 3600.0)
    files = _files(src)
    hashed = []
    real = fingerprint_mod.digest_file
    monkeypatch.setattr(fingerprint_mod, "digest_file", lambda p, a="blake3": hashed.append(Path(p).name) or real(p, a))
    first = fingerprint(files)
    assert fingerprint(files) == first
    assert sorted(hashed) == sorted(2 * [p.name for p in files])  # hashed both times


def test_fingerprint_later_equals_fingerprint_and_runs_meanwhile(src, tmp_path, monkeypatch):
    """The background fingerprint is the same value, hashed while the caller goes on; a cached one needs no
    thread; a file removed before it is read is one GraftkitError naming it."""
    import threading

    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fingerprint_mod, "_SETTLE_S", 0.0)
    files = _files(src)
    go = threading.Event()
    real = fingerprint_mod.digest_file

    def gated(p, a="blake3"):
        assert go.wait(10), "the caller never went on while the hash waited"
        return real(p, a)

    monkeypatch.setattr(fingerprint_mod, "digest_file", gated)
    wait = fingerprint_mod.fingerprint_later(files)  # returns before any file is hashed
    go.set()
    value = wait()
    monkeypatch.setattr(fingerprint_mod, "digest_file", real)
    assert value == fingerprint(files)
    assert fingerprint_mod.cached_fingerprint(files) == value
    threads = threading.active_count()
    assert fingerprint_mod.fingerprint_later(files)() == value and threading.active_count() == threads

    gone = tmp_path / "gone"
    shutil.copytree(src, gone)
    go.clear()
    monkeypatch.setattr(fingerprint_mod, "digest_file", gated)
    later = fingerprint_mod.fingerprint_later(_files(gone))
    (gone / "model.safetensors").unlink()  # before the thread opens it
    go.set()
    with pytest.raises(GraftkitError, match="model.safetensors.*not changed or removed"):
        later()


def test_sha256_digests_for_single_files(src, tmp_path, monkeypatch):
    """``algorithm="sha256"`` is plain sha256 of the file (what a model hub lists), cached apart."""
    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path / "cache"))
    f = src / "model.safetensors"
    assert fingerprint_mod.file_digests([f], "sha256")[f] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert fingerprint_mod.file_digests([f])[f] == blake3(f.read_bytes()).hexdigest()
    with pytest.raises(GraftkitError, match="unknown digest algorithm 'md5'"):
        fingerprint_mod.file_digests([f], "md5")
