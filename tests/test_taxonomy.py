"""The taxonomy tables partition every covered architecture's tensors; layer selection is exact.

Names come from three sources, all collected by :func:`all_cases` so the reachability test (every
pattern of every table matches some tensor) sees exactly what the partition tests see:

- ``saved``: the safetensors files ``save_pretrained()`` writes (transformers renames some tensors on
  save: Qwen2-VL/Qwen2.5-VL go back to the hub layout, per-expert MoE weights, GPT-NeoX ``embed_out``);
- ``state``: ``model.state_dict()`` (a tied model lists ``lm_head.weight`` there as an alias of the
  embedding; the files drop it);
- ``hub``: hand-written name lists of published checkpoints in older layouts.
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
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import ARCHS, decoder_layers, tiny_model, vision_depth  # noqa: E402

from graftkit.errors import GraftkitError  # noqa: E402
from graftkit.weights import taxonomy as tx  # noqa: E402
from graftkit.weights.taxonomy import (  # noqa: E402
    BANDS,
    DECODER,
    GROUPS,
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


@lru_cache(maxsize=None)
def model_cases(arch: str, tied: bool | None = None) -> tuple[Case, Case]:
    """(saved, state) cases of the tiny ``arch`` model; built once per process."""
    model = tiny_model(arch, tied)
    cfg = model.config
    is_tied = bool(cfg.tie_word_embeddings)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        saved = safetensors_names(Path(d))
    state = list(model.state_dict())
    common = dict(n_layers=decoder_layers(cfg), n_vision=vision_depth(cfg))
    tag = f"{arch}{'' if tied is None else ('-tied' if tied else '-untied')}"
    return (
        Case(f"{tag}/saved", cfg.model_type, saved, is_tied, **common),
        Case(f"{tag}/state", cfg.model_type, state, is_tied, **common),
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
    return out + list(HUB_CASES)


# ----------------------------------------------------------------------------------- the partition

_DECODER_INDEX = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")
_VISION_INDEX = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def expected_group(name: str) -> str | None:
    """The group a tensor belongs to, judged from its name's segments independently of the tables
    (a second opinion: a pattern filed under the wrong group fails here)."""
    segs = name.split(".")
    if {"lm_head", "embed_out"} & set(segs):
        return "lm_head"
    if {"merger", "deepstack_merger_list"} & set(segs):
        return "projector"
    if "visual" in segs:
        return "vision"
    if len(segs) >= 2 and segs[-2] in {"embed_tokens", "wte", "wpe", "embed_in"}:
        return "embed"
    if {"self_attn", "attn", "attention"} & set(segs):
        return "attn"
    if {"mlp", "block_sparse_moe"} & set(segs):
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
        dec, vis = _DECODER_INDEX.search(n), _VISION_INDEX.search(n)
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
    """Every tiny model's config.model_type is listed by exactly one table."""
    for arch in ARCHS:
        mt = model_cases(arch)[0].model_type
        owners = [t.family for t in tx.tables() if mt in t.model_types]
        assert len(owners) == 1, (arch, mt, owners)
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
                                                                    "fallback_priority"}, path
        assert raw["family"] == path.stem == table.family
        assert set(raw["groups"]) <= set(GROUPS)
        patterns = [p for ps in raw["groups"].values() for p in ps]
        assert len(patterns) == len(set(patterns)), f"{path.name}: a pattern is listed twice"
        for mt in raw["model_types"]:
            assert mt not in seen, f"model_type {mt} in both {seen[mt]} and {table.family}"
            seen[mt] = table.family


def test_every_listed_model_type_is_tested():
    """A model_type in a table without a tiny model or hub list would be an unproven claim."""
    covered = {c.model_type for c in all_cases()}
    listed = {mt for t in tx.tables() for mt in t.model_types}
    assert listed <= covered, f"untested model types: {sorted(listed - covered)}"


def test_every_pattern_is_reachable():
    """Each pattern of each table matches at least one tensor of a test model or hub list."""
    by_family: dict[str, set[str]] = {}
    for case in all_cases():
        family = tx.table_for(case.model_type, case.names).family
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
