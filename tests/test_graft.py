"""Grafting: θ = θ_base + c·(θ_rl − θ_base) per tensor, written as a new HF folder.

Invariants on a base/RL pair with a planted delta (see ``_pairs.py``): graft(∅) = base and
graft(all) = RL bit for bit; disjoint grafts compose; α = ½ is the midpoint; ``reverse`` of a selection
is the graft of its complement; inputs are never modified; the output loads in transformers. And an
independent reference: the expected tensors computed directly from the two state dicts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402  (sets HF_HUB_OFFLINE before transformers is imported)

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.graft import GraftSpec, export_graft, plan_graft, splice  # noqa: E402
from graftkit.weights import (  # noqa: E402
    OutSpec,
    band_rule,
    open_checkpoint,
    write_checkpoint,
)

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------ fixtures


def _hash_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class Pairs:
    """The module's pairs, built once, and a fresh output folder per graft."""

    def __init__(self, root: Path):
        self.root = root
        self.by_key = {
            "fp32": P.make_pair(root / "fp32", "qwen3", layers=6, dtype=torch.float32),
            "bf16": P.make_pair(root / "bf16", "llama", layers=4, dtype=torch.bfloat16),
            "tied": P.make_pair(root / "tied", "qwen3", layers=3, dtype=torch.float32, tied=True),
            "sharded": P.make_pair(root / "sharded", "llama", layers=5, dtype=torch.float32,
                                   max_shard_size="20KB"),
        }
        self.hashes = {k: (_hash_tree(p.base), _hash_tree(p.rl)) for k, p in self.by_key.items()}
        self._n = itertools.count()

    def __getitem__(self, key: str) -> P.Pair:
        return self.by_key[key]

    def out(self) -> Path:
        return self.root / "out" / f"g{next(self._n)}"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Pairs:
    return Pairs(tmp_path_factory.mktemp("graft"))


def graft(base: Path, rl: Path, out: Path, groups=(), layers="all", alpha=1.0, reverse=False, **kw) -> Path:
    b, r = open_checkpoint(base), open_checkpoint(rl)
    plan = plan_graft(b.taxonomy(), GraftSpec(tuple(groups), layers, alpha, reverse))
    return export_graft(b, r, plan, out, **kw)


def select(pair: P.Pair, groups, layers: set[int] | None) -> set[str]:
    """Our own reading of the selection rule: group in groups, and (layers all) or a decoder layer in it.

    On a tied model, selecting embed also selects a stored lm_head copy (only with layers all)."""
    chosen = set()
    for n in pair.names:
        g, L = P.group_of(n), P.layer_of(n)
        if layers is None:
            hit = g in groups or (pair.tied and g == "lm_head" and "embed" in groups)
        else:
            hit = g in groups and L is not None and L in layers
        if hit:
            chosen.add(n)
    return chosen


def layers_text(layers: set[int]) -> str:
    """An explicit --layers string for ``layers``, written with ranges where runs are consecutive."""
    parts, run = [], []
    for i in sorted(layers):
        if run and i != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(i)
    parts.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in parts)


def expected_tensors(pair: P.Pair, sel: set[str], alpha: float, reverse: bool) -> dict[str, tuple[float, torch.Tensor]]:
    """(c, θ) per tensor, θ = base + c·(rl − base) computed in float64 and rounded once.

    Forward: c = α for selected tensors, 0 for the rest. Reverse (revert the selection in RL to base):
    θ = rl + α·M⊙(base − rl) = base + (1 − α·M)·(rl − base), so c = 1 − α selected, 1 elsewhere."""
    out = {}
    for n in pair.names:
        m = 1.0 if n in sel else 0.0
        c = 1.0 - alpha * m if reverse else alpha * m
        b, r = pair.base_sd[n], pair.rl_sd[n]
        if c == 0:
            out[n] = (c, b)
        elif c == 1:
            out[n] = (c, r)
        else:
            b64, r64 = b.double(), r.double()
            out[n] = (c, (b64 + c * (r64 - b64)).to(b.dtype))
    return out


def assert_close_splice(got: torch.Tensor, want: torch.Tensor, base: torch.Tensor, rl: torch.Tensor,
                        c: float, what: str) -> None:
    """float32: a few units of rounding of the float32 computation; bf16/fp16: at most one ulp."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if got.dtype in (torch.bfloat16, torch.float16):
        d = P.ulp_distance(got, want)
        assert int(d.max()) <= 1, f"{what}: {int(d.max())} ulp from the reference"
        return
    eps = torch.finfo(got.dtype).eps
    scale = (abs(c) * (rl.double() - base.double()).abs() + want.double().abs() + base.double().abs())
    err = (got.double() - want.double()).abs()
    assert bool((err <= 2 * eps * scale + 1e-44).all()), f"{what}: max error {float(err.max()):.3g}"


# ------------------------------------------------------------------------------------------ identity


@pytest.mark.parametrize("key", ["fp32", "bf16", "tied", "sharded"])
def test_no_groups_is_base_and_all_groups_is_rl(pairs, key):
    pair = pairs[key]
    # against the files as written (read back through graftkit) and against the in-memory models
    base_files, rl_files = P.read_all(pair.base), P.read_all(pair.rl)
    none = graft(pair.base, pair.rl, pairs.out(), ())
    P.assert_checkpoint_equals(none, base_files)
    P.assert_checkpoint_equals(none, pair.base_sd)
    everything = graft(pair.base, pair.rl, pairs.out(), pair.groups_present())
    P.assert_checkpoint_equals(everything, rl_files)
    P.assert_checkpoint_equals(everything, pair.rl_sd)
    # the planted delta is real: the two are not the same model
    assert any(not torch.equal(pair.base_sd[n], pair.rl_sd[n]) for n in pair.names)
    # the CLI spellings "none" and "all" mean the same (all = every group this model has)
    b, r = open_checkpoint(pair.base), open_checkpoint(pair.rl)
    for text, want in (("none", pair.base_sd), ("all", pair.rl_sd)):
        plan = plan_graft(b.taxonomy(), GraftSpec.parse(text))
        P.assert_checkpoint_equals(export_graft(b, r, plan, pairs.out()), want)


def test_all_groups_reverse_is_base_and_alpha_zero_is_base(pairs):
    pair = pairs["bf16"]
    present = pair.groups_present()
    P.assert_checkpoint_equals(graft(pair.base, pair.rl, pairs.out(), present, reverse=True), pair.base_sd)
    P.assert_checkpoint_equals(graft(pair.base, pair.rl, pairs.out(), present, alpha=0.0), pair.base_sd)
    P.assert_checkpoint_equals(graft(pair.base, pair.rl, pairs.out(), (), reverse=True), pair.rl_sd)


def test_sharded_output_follows_max_shard_size(pairs):
    pair = pairs["sharded"]
    assert (pair.base / "model.safetensors.index.json").is_file()  # the input itself is sharded
    out = graft(pair.base, pair.rl, pairs.out(), ("attn", "mlp"), max_shard_size="30KB")
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").is_file()
    for s in shards:  # HF's rule: a shard only exceeds the limit when it holds a single tensor
        ck = open_checkpoint(s)
        assert ck.nbytes <= 30_000 or len(ck.metas) == 1
    want = {n: (pair.rl_sd[n] if P.group_of(n) in ("attn", "mlp") else pair.base_sd[n]) for n in pair.names}
    P.assert_checkpoint_equals(out, want)


# --------------------------------------------------------------------------------------- composition


@SETTINGS
@given(key=st.sampled_from(["fp32", "bf16", "tied"]), data=st.data())
def test_disjoint_group_grafts_compose(pairs, key, data):
    """graft(A) then graft(B) over it (RL as RL) == graft(A ∪ B), for disjoint A, B."""
    pair = pairs[key]
    present = pair.groups_present()
    side = data.draw(st.lists(st.sampled_from("ABN"), min_size=len(present), max_size=len(present)))
    a = tuple(g for g, s in zip(present, side) if s == "A")
    b = tuple(g for g, s in zip(present, side) if s == "B")
    first = graft(pair.base, pair.rl, pairs.out(), a)
    second = graft(first, pair.rl, pairs.out(), b)
    union = graft(pair.base, pair.rl, pairs.out(), a + b)
    P.assert_checkpoint_equals(second, P.read_all(union))
    sel = select(pair, set(a + b), None)
    P.assert_checkpoint_equals(union, {n: pair.rl_sd[n] if n in sel else pair.base_sd[n] for n in pair.names})


@SETTINGS
@given(key=st.sampled_from(["fp32", "bf16", "sharded"]), data=st.data())
def test_disjoint_layer_grafts_compose(pairs, key, data):
    """The same for two disjoint layer selections of the same groups."""
    pair = pairs[key]
    n = pair.n_layers
    groups = tuple(data.draw(st.lists(st.sampled_from(["attn", "mlp", "norm"]), min_size=1, unique=True)))
    side = data.draw(st.lists(st.sampled_from("ABN"), min_size=n, max_size=n)
                     .filter(lambda s: "A" in s and "B" in s))
    la = {i for i, s in enumerate(side) if s == "A"}
    lb = {i for i, s in enumerate(side) if s == "B"}
    first = graft(pair.base, pair.rl, pairs.out(), groups, layers=layers_text(la))
    second = graft(first, pair.rl, pairs.out(), groups, layers=layers_text(lb))
    union = graft(pair.base, pair.rl, pairs.out(), groups, layers=layers_text(la | lb))
    P.assert_checkpoint_equals(second, P.read_all(union))
    sel = select(pair, set(groups), la | lb)
    P.assert_checkpoint_equals(union, {m: pair.rl_sd[m] if m in sel else pair.base_sd[m] for m in pair.names})


# ------------------------------------------------------------------------------------ alpha, reverse


@pytest.mark.parametrize("key", ["fp32", "bf16"])
def test_alpha_half_is_the_midpoint(pairs, key):
    pair = pairs[key]
    out = P.read_all(graft(pair.base, pair.rl, pairs.out(), ("embed", "attn", "norm"), alpha=0.5))
    for n in pair.names:
        b, r = pair.base_sd[n], pair.rl_sd[n]
        if P.group_of(n) not in ("embed", "attn", "norm"):
            P.assert_bit_equal(out[n], b, n)
            continue
        assert out[n].dtype == b.dtype
        if b.dtype == torch.bfloat16:
            mid = ((b.float() + r.float()) / 2).to(torch.bfloat16)
            assert int(P.ulp_distance(out[n], mid).max()) <= 1, n
        else:
            mid = (b.double() + r.double()) / 2
            torch.testing.assert_close(out[n].double(), mid, rtol=2e-7, atol=1e-9)


def test_splice_is_exact_at_zero_and_one_and_refuses_scaling_integers():
    b, r = torch.randn(5, 3), torch.randn(5, 3)
    assert splice(b, r, 0) is b and splice(b, r, 1) is r
    torch.testing.assert_close(splice(b, r, 0.5), (b + r) / 2)
    i = torch.arange(4)
    assert splice(i, i + 1, 1) is not i
    with pytest.raises(GraftkitError, match="alpha"):
        splice(i, i + 1, 0.5)


@SETTINGS
@given(key=st.sampled_from(["fp32", "bf16", "tied", "sharded"]), data=st.data())
def test_reverse_equals_graft_of_complement(pairs, key, data):
    pair = pairs[key]
    present = pair.groups_present()
    chosen = data.draw(st.lists(st.sampled_from(present), unique=True))
    complement = [g for g in present if g not in chosen]
    rev = graft(pair.base, pair.rl, pairs.out(), chosen, reverse=True)
    fwd = graft(pair.base, pair.rl, pairs.out(), complement)
    P.assert_checkpoint_equals(rev, P.read_all(fwd))


# ------------------------------------------------------------------------------ independent reference


@SETTINGS
@given(key=st.sampled_from(["fp32", "bf16", "sharded", "tied"]), data=st.data())
def test_matches_independent_reference(pairs, key, data):
    pair = pairs[key]
    present = pair.groups_present()
    n = pair.n_layers
    layer_kind = data.draw(st.sampled_from(["all", "early", "mid", "late", "explicit"]))
    if layer_kind == "all":
        groups = data.draw(st.lists(st.sampled_from(present), unique=True))
        layer_set = None
        layers = "all"
    else:
        groups = data.draw(st.lists(st.sampled_from(["attn", "mlp", "norm"]), min_size=1, unique=True))
        if layer_kind == "explicit":
            layer_set = data.draw(st.sets(st.integers(0, n - 1), min_size=1))
            layers = layers_text(layer_set)
        else:
            layer_set = {i for i in range(n) if ["early", "mid", "late"][3 * i // n] == layer_kind}
            layers = layer_kind
    alpha = data.draw(st.sampled_from([1.0, 0.0, 0.5, 0.25, 0.75, 1.5, -0.5]))
    reverse = data.draw(st.booleans())
    out = P.read_all(graft(pair.base, pair.rl, pairs.out(), groups, layers, alpha, reverse))
    expected = expected_tensors(pair, select(pair, set(groups), layer_set), alpha, reverse)
    assert set(out) == set(expected)
    for name, (c, want) in expected.items():
        if c in (0.0, 1.0):
            P.assert_bit_equal(out[name], want, name)
        else:
            assert_close_splice(out[name], want, pair.base_sd[name], pair.rl_sd[name], c, name)


# ------------------------------------------------------------------------------------ loads, logits


def test_output_loads_in_transformers_with_rl_logits(pairs):
    from transformers import AutoModelForCausalLM

    for key in ("fp32", "sharded"):
        pair = pairs[key]
        everything = graft(pair.base, pair.rl, pairs.out(), pair.groups_present())
        nothing = graft(pair.base, pair.rl, pairs.out(), ())
        ids = torch.randint(0, P.VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            g = AutoModelForCausalLM.from_pretrained(everything, dtype=torch.float32).eval()(ids).logits
            rl = AutoModelForCausalLM.from_pretrained(pair.rl, dtype=torch.float32).eval()(ids).logits
            g0 = AutoModelForCausalLM.from_pretrained(nothing, dtype=torch.float32).eval()(ids).logits
            base = pair.model(ids).logits
        assert torch.equal(g, rl), key
        assert torch.equal(g0, base), key
        assert not torch.equal(g, g0)


# --------------------------------------------------------------------------------- tied embeddings


def test_tied_graft_of_embed_moves_the_head_and_says_so(pairs):
    from transformers import AutoModelForCausalLM

    pair = pairs["tied"]
    b = open_checkpoint(pair.base)
    tax = b.taxonomy()
    assert tax.tied and "lm_head.weight" not in b.metas
    plan = plan_graft(tax, GraftSpec(("embed",)))
    assert any("tied" in note and "head" in note for note in plan.notes), plan.notes
    out = export_graft(b, open_checkpoint(pair.rl), plan, pairs.out())
    emb = "model.embed_tokens.weight"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, pair.rl_sd[emb])
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight,
                       pair.base_sd["model.layers.0.self_attn.q_proj.weight"])
    assert any("tied" in n for n in json.loads((out / "graftkit.json").read_text())["notes"])


def test_tied_model_with_a_stored_head_copy_moves_the_copy(pairs, tmp_path):
    """Some checkpoints of tied models store lm_head.weight anyway: embed must move it too."""
    pair = pairs["tied"]
    emb = "model.embed_tokens.weight"

    def save(dest: Path, sd: dict) -> Path:
        full = {**sd, "lm_head.weight": sd[emb].clone()}
        specs = [OutSpec(n, t.dtype, tuple(t.shape), (lambda t=t: [t])) for n, t in full.items()]
        return write_checkpoint(dest, specs, provenance={"producer": "test"}, inputs=[],
                                aux_from=pair.base)  # config.json (tie_word_embeddings: true)

    base, rl = save(tmp_path / "b", pair.base_sd), save(tmp_path / "r", pair.rl_sd)
    b = open_checkpoint(base)
    assert b.tied and "lm_head.weight" in b.metas
    plan = plan_graft(b.taxonomy(), GraftSpec(("embed",)))
    assert "lm_head.weight" in plan.selected
    assert any("lm_head.weight" in note for note in plan.notes), plan.notes
    got = P.read_all(export_graft(b, open_checkpoint(rl), plan, tmp_path / "out"))
    P.assert_bit_equal(got["lm_head.weight"], pair.rl_sd[emb])
    P.assert_bit_equal(got[emb], pair.rl_sd[emb])
    with pytest.raises(GraftkitError, match="lm_head"):
        plan_graft(b.taxonomy(), GraftSpec(("lm_head",)))


def test_bad_selections_are_errors(pairs):
    tied = open_checkpoint(pairs["tied"].base).taxonomy()
    with pytest.raises(GraftkitError, match="tie"):
        plan_graft(tied, GraftSpec(("lm_head",)))
    text = open_checkpoint(pairs["fp32"].base).taxonomy()
    for g in ("vision", "projector"):
        with pytest.raises(GraftkitError, match=g):
            plan_graft(text, GraftSpec(("attn", g)))
    with pytest.raises(GraftkitError, match="unknown group"):
        GraftSpec(("attention",))
    with pytest.raises(GraftkitError, match="alpha"):
        GraftSpec(("attn",), alpha=float("nan"))
    n = pairs["fp32"].n_layers
    for bad in (str(n), f"0-{n}", "3-1", "-1", "late,99", "layers"):
        with pytest.raises(GraftkitError, match="--layers"):
            plan_graft(text, GraftSpec(("attn",), bad))
    # embed has no decoder layers: a layer band cannot select it
    with pytest.raises(GraftkitError, match="embed"):
        plan_graft(text, GraftSpec(("embed",), "late"))


@pytest.mark.parametrize("key", ["fp32", "bf16", "tied", "sharded"])
def test_layer_bands_select_decoder_layers_by_band_rule(pairs, key):
    pair = pairs[key]
    n = pair.n_layers
    tax = open_checkpoint(pair.base).taxonomy()
    rule = band_rule(n)
    for band in ("early", "mid", "late"):
        m = re.search(rf"{band} (\d+)–(\d+)", rule)
        from_rule = set(range(int(m[1]), int(m[2]) + 1)) if m else set()
        ours = {i for i in range(n) if 3 * i // n == ("early", "mid", "late").index(band)}
        assert from_rule == ours, rule
        plan = plan_graft(tax, GraftSpec(("attn", "mlp", "norm"), band))
        assert {P.layer_of(x) for x in plan.selected} == ours
        assert plan.selected and all(P.layer_of(x) is not None for x in plan.selected)
        assert set(plan.selected) == select(pair, {"attn", "mlp", "norm"}, ours)
        assert any(rule in note for note in plan.notes)
        assert set(plan.moved()) == set(plan.selected)
    assert 3 * (n - 1) // n == 2  # the last layer is always late


# ------------------------------------------------------------------------------------ inputs intact


def test_inputs_are_byte_identical_after_grafting(pairs):
    for key, pair in pairs.by_key.items():
        present = pair.groups_present()
        graft(pair.base, pair.rl, pairs.out(), present, alpha=0.5)
        graft(pair.base, pair.rl, pairs.out(), present[:2], reverse=True, max_shard_size="10KB")
        graft(pair.base, pair.rl, pairs.out(), ("attn",), layers="late", alpha=1.5)
        with pytest.raises(GraftkitError, match="overlaps"):
            graft(pair.base, pair.rl, pair.rl / "inside", ("attn",))
        with pytest.raises(GraftkitError, match="overlaps"):
            graft(pair.base, pair.rl, pair.base, ("attn",), force=True)
        assert (_hash_tree(pair.base), _hash_tree(pair.rl)) == pairs.hashes[key], key


# ------------------------------------------------------------------------------------ provenance


def test_fingerprints_are_hashed_while_the_export_writes(pairs, tmp_path, monkeypatch):
    """With an empty fingerprint cache the export starts writing before either input is hashed: the hash
    of the first file waits until a tensor has been written (a run that hashed first would time out),
    and graftkit.json still records both parents' fingerprints, equal to ``describe``'s."""
    import threading

    from graftkit.weights import describe
    fingerprint_mod = sys.modules["graftkit.weights.fingerprint"]  # the package re-exports a function by that name

    monkeypatch.setenv("GRAFTKIT_CACHE", str(tmp_path / "cache"))
    pair = pairs["sharded"]
    written = threading.Event()
    real = fingerprint_mod.digest_file

    def after_a_tensor(p, a="blake3"):
        assert written.wait(20), "the export did not write a tensor before the inputs were hashed"
        return real(p, a)

    monkeypatch.setattr(fingerprint_mod, "digest_file", after_a_tensor)
    b, r = open_checkpoint(pair.base), open_checkpoint(pair.rl)
    plan = plan_graft(b.taxonomy(), GraftSpec(("attn",), "all", 1.0, False))
    out = export_graft(b, r, plan, tmp_path / "out", on_tensor=lambda s: written.set())
    monkeypatch.setattr(fingerprint_mod, "digest_file", real)
    prov = json.loads((out / "graftkit.json").read_text())
    want = {"base": describe(b)["fingerprint"], "rl": describe(r)["fingerprint"]}
    assert {p["role"]: p["fingerprint"] for p in prov["parents"]} == want
    assert want["base"] != want["rl"] and all(v.startswith("blake3:") for v in want.values())
    assert prov["base_model"] == {"path": str(pair.base.resolve()), "fingerprint": want["base"]}
