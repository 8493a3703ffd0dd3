"""In-place grafting: the loaded model equals ``from_pretrained(export_graft(...))`` bit for bit, and is
restored bit for bit on exit (also after an exception); the checkpoints are never touched."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.graft import GraftSpec, InPlaceGraft, bind_names, export_graft, grafted, plan_graft  # noqa: E402
from graftkit.weights import load_model, open_checkpoint  # noqa: E402

SPECS = [
    GraftSpec(("attn",)),
    GraftSpec(("mlp",), "late"),
    GraftSpec(("embed",)),
    GraftSpec(("attn", "mlp"), alpha=0.5),
    GraftSpec(("norm",), "0-1", alpha=0.25),
    GraftSpec(("attn", "norm"), "early,late", alpha=-0.5),
    GraftSpec(("mlp",), reverse=True),
    GraftSpec.parse("all", alpha=0.5),
    GraftSpec.parse("all"),
    GraftSpec.parse("none"),
]


def _load(path, dtype):
    model, _ = load_model(path, need_tokenizer=False, dtype=dtype)
    return model


def _state(model) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _assert_model_equals(model, want: dict[str, torch.Tensor], what: str) -> None:
    got = model.state_dict()
    assert set(got) == set(want), what
    for n, t in want.items():
        P.assert_bit_equal(got[n], t, f"{what}: {n}")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module", params=[("qwen3", True, torch.float32, torch.float32),
                                        ("qwen3", False, torch.bfloat16, torch.bfloat16),
                                        ("llama", False, torch.bfloat16, torch.float32)],
                ids=["qwen3-tied-f32", "qwen3-untied-bf16", "llama-bf16-in-f32-model"])
def pair(request, tmp_path_factory):
    arch, tied, dtype, model_dtype = request.param
    root = tmp_path_factory.mktemp(f"inplace-{arch}")
    p = P.make_pair(root, arch, layers=3, dtype=dtype, tied=tied)
    return p, model_dtype, root


def test_inplace_equals_exported_graft_bit_for_bit(pair):
    p, model_dtype, root = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    before = _digest(p.base), _digest(p.rl)
    model = _load(p.base, model_dtype)
    original = _state(model)
    # one session switches through every spec (each switch writes only what changes)
    with InPlaceGraft(model, base, rl) as session:
        for i, spec in enumerate(SPECS):
            plan = plan_graft(tax, spec)
            session.apply(plan)
            out = export_graft(base, rl, plan, root / f"export-{i}", force=True)
            _assert_model_equals(model, _state(_load(out, model_dtype)), f"{spec}")
    _assert_model_equals(model, original, "after the session")
    assert (_digest(p.base), _digest(p.rl)) == before


def test_graft_of_nothing_is_base_and_of_everything_is_rl(pair):
    p, model_dtype, _ = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    model = _load(p.base, model_dtype)
    want_base, want_rl = _state(model), _state(_load(p.rl, model_dtype))
    with grafted(model, base, rl, plan_graft(tax, GraftSpec.parse("all"))) as s:
        _assert_model_equals(model, want_rl, "graft(all)")
        s.apply(plan_graft(tax, GraftSpec.parse("none")))
        _assert_model_equals(model, want_base, "graft(∅)")
        s.apply(plan_graft(tax, GraftSpec.parse("all", reverse=True)))  # revert everything in RL: base
        _assert_model_equals(model, want_base, "reverse all")
    _assert_model_equals(model, want_base, "restored")


def test_restore_is_bit_exact_after_an_exception(pair):
    p, model_dtype, _ = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    model = _load(p.base, model_dtype)
    original = _state(model)
    with pytest.raises(RuntimeError, match="inside"):
        with grafted(model, base, rl, plan_graft(tax, GraftSpec(("attn", "mlp", "embed"), alpha=0.3))) as s:
            assert s._touched
            assert not torch.equal(model.state_dict()[next(n for n in original if "q_proj" in n)],
                                   original[next(n for n in original if "q_proj" in n)])
            raise RuntimeError("inside the block")
    _assert_model_equals(model, original, "after an exception")


@pytest.mark.parametrize("keep, verify", [("copy", True), ("copy", False), ("base", True)])
def test_only_overwritten_tensors_are_kept_and_restore_is_exact_either_way(pair, keep, verify):
    p, model_dtype, _ = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    model = _load(p.base, model_dtype)
    original = _state(model)
    plan = plan_graft(tax, GraftSpec(("mlp",), "late", alpha=0.5))
    with grafted(model, base, rl, plan, keep=keep, verify=verify) as s:
        moved = set(plan.moved())
        assert s._touched == moved
        want = sum(model.state_dict()[n].numel() * model.state_dict()[n].element_size() for n in moved)
        assert s.saved_bytes == (want if keep == "copy" else 0)  # "base" re-reads the verified base
        s.apply(plan_graft(tax, GraftSpec(("attn",), "0")))
    _assert_model_equals(model, original, f"restored (keep={keep})")
    with pytest.raises(GraftkitError, match="keep"):
        InPlaceGraft(model, base, rl, verify=False, keep="base")


def test_a_model_that_is_not_the_base_is_refused(pair):
    p, model_dtype, _ = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    model = _load(p.rl, model_dtype)  # the RL model, not the base
    original = _state(model)
    with pytest.raises(GraftkitError, match="differs from tensor .* of base"):
        with grafted(model, base, rl, plan_graft(tax, GraftSpec(("attn",)))):
            pass
    _assert_model_equals(model, original, "refused, restored")


def test_a_tensor_without_a_parameter_is_a_clear_error(pair):
    p, model_dtype, _ = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    decoder = _load(p.base, model_dtype).model  # its state_dict names lack the "model." prefix
    session = InPlaceGraft(decoder, base, rl)
    with pytest.raises(GraftkitError, match="has no parameter or buffer .* export the graft"):
        session.apply(plan_graft(tax, GraftSpec(("attn",))))
    session.apply(plan_graft(tax, GraftSpec(())))  # moving nothing needs no parameter


def test_rename_table_binds_pre_v5_vision_language_names():
    mod = torch.nn.Module()
    mod.model = torch.nn.Module()
    mod.model.language_model = torch.nn.Linear(2, 2)
    mod.model.visual = torch.nn.Linear(2, 2)
    bound, missing = bind_names(mod, ["model.weight", "visual.bias", "model.language_model.bias", "lm_head.weight"])
    assert bound == {"model.weight": "model.language_model.weight", "visual.bias": "model.visual.bias",
                     "model.language_model.bias": "model.language_model.bias"}
    assert missing == ["lm_head.weight"]


def test_tied_head_stored_beside_the_embedding_is_written_once(tmp_path):
    """A tied model whose files also hold lm_head.weight: both names bind to one Parameter, written once."""
    from graftkit.weights import OutSpec, write_checkpoint

    model = P.tiny_model("qwen3", 3, tied=True)
    rl_model = P.apply_deltas(model, P.planted_deltas(model, P.ALL_GROUPS_SCALES, 1, tied=True))
    paths = {}
    for name, m in (("base", model), ("rl", rl_model)):
        # cloned, so the head copy is written under its own name beside the embedding
        sd = {n: t.detach().clone() for n, t in m.state_dict().items()}
        outs = [OutSpec(n, t.dtype, tuple(t.shape), (lambda t=t: [t])) for n, t in sd.items()]
        paths[name] = write_checkpoint(tmp_path / name, outs, provenance={"producer": "test"}, inputs=[],
                                       config=model.config.to_dict())
    base, rl = open_checkpoint(paths["base"]), open_checkpoint(paths["rl"])
    assert "lm_head.weight" in base.metas and base.tied
    tax = base.taxonomy()
    live = _load(paths["base"], torch.float32)
    s = InPlaceGraft(live, base, rl)
    assert s.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    with s:
        s.apply(plan_graft(tax, GraftSpec(("embed",))))
        P.assert_bit_equal(live.lm_head.weight, rl_model.model.embed_tokens.weight, "tied head follows")
    P.assert_bit_equal(live.lm_head.weight, model.model.embed_tokens.weight, "restored")


def test_readinto_reads_the_stored_bytes_and_refuses_a_mismatch(pair):
    import numpy as np

    p, _, _ = pair
    ck = open_checkpoint(p.rl)
    for name in ck.names:
        want = ck.array(name)
        out = np.empty_like(want)
        assert ck.readinto(name, out), name
        assert out.tobytes() == want.tobytes(), name
    assert not ck.readinto(name, np.empty(want.size + 1, want.dtype))  # size differs: nothing read
    assert not ck.readinto(name, np.empty((want.size, 2), want.dtype)[:, 0])  # not contiguous
