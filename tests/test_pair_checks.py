"""Base and RL as a pair, from the trainers researchers use: different dtypes, and pairs that are no fine-tune.

- A bfloat16 SFT base and a float32 RL checkpoint (a planted delta, ρ ≈ 1e-3): ``delta`` and
  ``rank --what delta`` take the difference after an exact upcast (numbers equal a float64 reference,
  one note per dtype pair); ``graft`` refuses unless ``--cast``, and then writes the base's dtype with
  graft(∅) == base and graft(all) == RL.to(base dtype) bit for bit (export and in place).
- A random init of the same architecture is no fine-tune of the base: ``delta``, ``graft`` and
  ``rank --what delta`` refuse it with the figures of :data:`graftkit.weights.FINE_TUNE_RULE`, and
  analyse it with ``--force-pair``; the genuine planted fine-tune passes silently.
- A pair as far apart whose RL side's graftkit.json records this very base (fingerprint equal) is analysed with
  one note of its figures, by every command that judges pairs (a GRPO run at a high learning rate moves that
  far); a record of another base, a changed base or no fingerprint is refused with what would help.
- A pair in which nothing moved is said to be one.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from graftkit.cli import app  # noqa: E402
from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.graft import GraftSpec, InPlaceGraft, delta_anatomy, plan_graft  # noqa: E402
from graftkit.graft.commands import GraftConfig  # noqa: E402
from graftkit.rank import delta_ranks  # noqa: E402
from graftkit.weights import (FINE_TUNE_RULE, cast_like, check_fine_tune, check_pair, describe,  # noqa: E402
                              guard_pair_distance, judge_pair, load_model, open_checkpoint, pair_distance, save_model,
                              stream_pair_distance)
from graftkit.weights.pair import FAR_RHO, matrix_sums  # noqa: E402

LAYERS = 3
RHO = 1e-3  # the planted fine-tune: ‖Δ‖/‖W‖ ≈ 1e-3 in every attention, MLP and embedding matrix
PLANTED = ("embed", "attn", "mlp")


# ------------------------------------------------------------------------------------------ fixtures


def _plant(model, seed: int = 7):
    """``model`` (float32) + δ, δ = RHO · std(W) · N(0, 1) in every matrix of PLANTED groups."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and P.group_of(name) in PLANTED:
                p.add_(RHO * float(p.std()) * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    model = P.tiny_model("qwen3", LAYERS, seed=0)
    base_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    rl_f32 = _plant(copy.deepcopy(base_bf16).float())  # a float32 trainer started from the bf16 base
    mixed = {"base": P.save_base(root / "bf16-base", base_bf16)}
    mixed["rl"] = P.save_rl(root / "f32-rl", rl_f32, mixed["base"], note="float32 RL of a bfloat16 base")
    same = {"base": P.save_base(root / "f32-base", model)}
    same["rl"] = P.save_rl(root / "f32-planted", _plant(copy.deepcopy(model)), same["base"])
    # an unrelated model: a random init of the same architecture that records no parent
    far = P.tiny_model("qwen3", LAYERS, seed=1)
    same["unrelated"] = P.save_base(root / "random-init", far)
    # as far from the base, but its graftkit.json records this base: a run that moved that far from it
    same["recorded"] = P.save_rl(root / "far-child", far, same["base"], note="far, records its base")
    # as far, recording another base (the float32 base of another seed)
    same["other_base"] = P.save_base(root / "other-base", P.tiny_model("qwen3", LAYERS, seed=2))
    same["other"] = P.save_rl(root / "far-other", far, same["other_base"], note="far, records another base")
    return {"root": root, "mixed": mixed, "same": same}


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=True)

    invoke.cwd = tmp_path
    return invoke


def one_line_error(result, *needles) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in result.output, err
    for n in needles:
        assert n in err, (n, err)
    return err


def tensors(path: Path) -> dict[str, torch.Tensor]:
    ck = open_checkpoint(path)
    return {n: ck.read(n).clone() for n in ck.metas}


def reference_distance(base: dict, rl: dict) -> tuple[int, int, float, float]:
    """(far matrices, matrices, median ρ, median cos) of every 2-D tensor, in float64 from the definitions."""
    rho, cos = [], []
    for n, w in base.items():
        if w.dim() != 2:
            continue
        W, V = w.double(), rl[n].double()
        rho.append(float((V - W).norm() / W.norm()))
        cos.append(float((W * V).sum() / (W.norm() * V.norm())))
    rho, cos = np.array(rho), np.array(cos)
    return int((rho > FAR_RHO).sum()), rho.size, float(np.median(rho)), float(np.median(cos))


# ------------------------------------------------------------------------------------- mixed dtypes


def test_check_pair_dtype_policies(world):
    b, r = open_checkpoint(world["mixed"]["base"]), open_checkpoint(world["mixed"]["rl"])
    tax = b.taxonomy()
    n = len(b.metas)
    assert check_pair(b, r, tax, dtypes="upcast") == (
        f"base bfloat16, RL float32 (all {n} tensors): both upcast to float32, exactly",)
    (cast,) = check_pair(b, r, tax, dtypes="cast")
    assert cast.startswith(f"RL float32 cast to base bfloat16 (all {n} tensors), rounded to the nearest bfloat16")
    for kw, hint in (({}, "save both checkpoints in the same dtype"), ({"dtype_flag": "--cast"}, "pass --cast")):
        with pytest.raises(GraftkitError) as e:
            check_pair(b, r, tax, dtypes="same", **kw)
        msg = str(e.value)
        assert f"{n} of {n} tensors differ in dtype" in msg and "bfloat16 in base, float32 in RL" in msg
        assert hint in msg and "\n" not in msg
    with pytest.raises(GraftkitError, match="not a dtype policy"):
        check_pair(b, r, tax, dtypes="round")
    same = open_checkpoint(world["same"]["rl"])
    assert check_pair(open_checkpoint(world["same"]["base"]), same, tax, dtypes="upcast") == ()


def test_dtype_notes_name_a_partial_mix_and_float64(world, tmp_path):
    base = P.tiny_model("qwen3", LAYERS, seed=0)
    b = open_checkpoint(P.save_base(tmp_path / "b", base))
    part = copy.deepcopy(base)
    part.model.layers[0].mlp.to(torch.bfloat16)  # three matrices stored in bfloat16, the rest float32
    r = open_checkpoint(save_model(tmp_path / "part", part, provenance={"producer": "test"}))
    (note,) = check_pair(b, r, b.taxonomy(), dtypes="upcast")
    assert note.startswith(f"base float32, RL bfloat16 (3 of {len(b.metas)} tensors: model.layers.0.mlp.")
    assert note.endswith("both upcast to float32, exactly")
    wide = open_checkpoint(save_model(tmp_path / "f64", copy.deepcopy(base).double(), provenance={"producer": "t"}))
    assert check_pair(b, wide, b.taxonomy(), dtypes="upcast")[0].endswith("both upcast to float64, exactly")
    (cast,) = check_pair(r, b, b.taxonomy(), dtypes="cast")  # float32 RL into a partly bfloat16 base
    assert "RL float32 cast to base bfloat16 (3 of" in cast


def test_integer_dtypes_must_agree_under_every_policy(world, tmp_path):
    from graftkit.weights import Checkpoint, TensorMeta

    b = open_checkpoint(world["same"]["base"])

    def with_code(ck, name, code):
        metas = {**ck.metas, name: TensorMeta(name, code, ck.metas[name].shape)}
        return Checkpoint(path=ck.path, kind=ck.kind, metas=metas, reader=ck.reader)

    name = next(iter(b.metas))
    ib, ir = with_code(b, name, "I32"), with_code(b, name, "I64")
    for policy in ("same", "upcast", "cast"):
        with pytest.raises(GraftkitError, match="only floating-point tensors may differ"):
            check_pair(ib, ir, b.taxonomy(), dtypes=policy)


def test_delta_of_bf16_base_and_f32_rl_equals_a_float64_reference(world, cli):
    base, rl = tensors(world["mixed"]["base"]), tensors(world["mixed"]["rl"])
    d = cli("delta", "--base", world["mixed"]["base"], "--from", world["mixed"]["rl"], "--json")
    assert d.exit_code == 0, d.output
    got = json.loads(d.stdout)
    assert f"base bfloat16, RL float32 (all {len(base)} tensors): both upcast to float32, exactly" in got["notes"]
    assert not any("fine-tune" in n for n in got["notes"])  # a genuine fine-tune passes silently
    (run,) = got["runs"].values()
    rows = {t["name"]: t for t in run["tensors"]}
    total = sum(float(((rl[n].double() - base[n].double()) ** 2).sum()) for n in base)
    for n, w in base.items():
        D = rl[n].double() - w.double()
        want = {"fro_delta": float(D.norm()), "rel_delta": float(D.norm() / w.double().norm()),
                "max_abs_delta": float(D.abs().max()), "share": float((D**2).sum()) / total,
                "frac_unchanged": float((rl[n].double() == w.double()).double().mean())}
        for m, v in want.items():
            assert np.isclose(rows[n][m], v, rtol=2e-6, atol=1e-12), (n, m, rows[n][m], v)
        if P.group_of(n) not in PLANTED or w.dim() != 2:  # unplanted: every float32 value is its bf16 value
            assert rows[n]["frac_unchanged"] == 1.0 and rows[n]["fro_delta"] == 0.0, n
    # the plant moved every matrix of the planted groups: few of their entries keep their value
    assert rows["model.layers.0.self_attn.q_proj.weight"]["frac_unchanged"] < 0.01
    far, count, med_rho, med_cos = reference_distance(base, rl)
    (ft,) = got["fine_tune"].values()
    assert (ft["far"], ft["matrices"], ft["plausible"]) == (far, count, True) == (0, count, True)
    assert np.isclose(ft["median_rel_delta"], med_rho, rtol=1e-5) and np.isclose(ft["median_cos"], med_cos)
    assert 5e-4 < med_rho < 2e-3


def test_rank_delta_of_mixed_dtypes_uses_the_coarser_storage_dtype(world, cli):
    b, r = open_checkpoint(world["mixed"]["base"]), open_checkpoint(world["mixed"]["rl"])
    res = delta_ranks(b, r, b.taxonomy(), metrics=["frobenius_sq", "numerical_rank"])
    assert res.attrs["pair_notes"] == [f"base bfloat16, RL float32 (all {len(b.metas)} tensors): "
                                       "both upcast to float32, exactly"]
    assert set(res["tensor_dtype"]) == {"bfloat16"}  # the coarser of the two stored operands
    col = {m: k for k, m in enumerate(res.coords["metric"])}
    eps = torch.finfo(torch.bfloat16).eps
    for i, name in enumerate(res.coords["tensor"]):
        W0, W1 = b.read(name).double(), r.read(name).double()
        S = torch.maximum(W0.abs(), W1.abs())
        ref = float(S.square().sum(1).sqrt().max() + S.square().sum(0).sqrt().max())
        assert np.isclose(res["tol_ref"][i], ref, rtol=1e-9), name
        assert np.isclose(res["tol"][i], eps * ref, rtol=1e-9), name
        assert np.isclose(res["value"][i, col["frobenius_sq"]], float(((W1 - W0) ** 2).sum()), rtol=1e-5), name
    assert res.attrs["fine_tune"]["plausible"] and res.attrs["fine_tune"]["far"] == 0
    # --vs is graft's second RL run: rank's base is --base, as everywhere, and --vs there is one line naming it
    one_line_error(cli("rank", "--what", "delta", "--model", world["mixed"]["rl"], "--vs", world["mixed"]["base"]),
                   "rank takes its base as --base, not --vs", f"pass --base {world['mixed']['base']}")
    ran = cli("rank", "--what", "delta", "--model", world["mixed"]["rl"], "--base", world["mixed"]["base"], "--json")
    assert ran.exit_code == 0, ran.output


def test_graft_refuses_mixed_dtypes_unless_cast(world, cli):
    m = world["mixed"]
    out = cli.cwd / "g"
    err = one_line_error(cli("graft", "--base", m["base"], "--from", m["rl"], "--groups", "attn", "--out", out),
                         "differ in dtype", "bfloat16 in base, float32 in RL", "--cast")
    assert "--force-pair" not in err and not out.exists()
    one_line_error(cli("graft", "--base", m["base"], "--from", m["rl"], "--sweep", "single", "--dry-run"), "--cast")
    one_line_error(cli("graft", "--base", m["base"], "--from", m["rl"], "--eval", "--groups", "attn"), "--cast")
    plan = cli("graft", "--base", m["base"], "--from", m["rl"], "--sweep", "single", "--dry-run", "--cast", "--json")
    assert plan.exit_code == 0, plan.output
    assert any(n.startswith("RL float32 cast to base bfloat16") for n in json.loads(plan.stdout)["notes"])
    assert GraftConfig(rl=m["rl"], groups="attn", cast=True).cast


def test_cast_graft_keeps_base_dtype_and_is_exact_at_none_and_all(world, cli):
    m = world["mixed"]
    base, rl = tensors(m["base"]), tensors(m["rl"])
    cast = {n: t.to(torch.bfloat16) for n, t in rl.items()}
    outs = {}
    for groups in ("none", "all", "attn"):
        outs[groups] = cli.cwd / f"g-{groups}"
        g = cli("graft", "--base", m["base"], "--from", m["rl"], "--groups", groups, "--cast", "--out",
                outs[groups], "--json")
        assert g.exit_code == 0, g.output
        assert any(n.startswith("RL float32 cast to base bfloat16") for n in json.loads(g.stdout)["notes"])
    P.assert_checkpoint_equals(outs["none"], base)
    P.assert_checkpoint_equals(outs["all"], cast)
    P.assert_checkpoint_equals(outs["attn"], {n: cast[n] if P.group_of(n) == "attn" else base[n] for n in base})
    assert any(not torch.equal(cast[n], base[n]) for n in base)  # the cast kept some of the delta
    prov = json.loads((outs["all"] / "graftkit.json").read_text())
    assert prov["config"]["cast"] is True
    assert any(n.startswith("RL float32 cast to base bfloat16") and "rounded to the nearest bfloat16" in n
               for n in prov["notes"])


def test_cast_graft_in_place_equals_rl_in_base_dtype(world):
    m = world["mixed"]
    b, stored = open_checkpoint(m["base"]), open_checkpoint(m["rl"])
    r = cast_like(stored, b)
    assert all(r.metas[n].code == "BF16" for n in r.metas) and r.notes[-1].startswith("RL float32 cast to base")
    assert cast_like(b, b) is b
    model, _ = load_model(m["base"], need_tokenizer=False, dtype=torch.bfloat16)
    original = {n: t.detach().clone() for n, t in model.state_dict().items()}
    with pytest.raises(GraftkitError, match="differ in dtype"):
        InPlaceGraft(model, b, stored)
    tax = b.taxonomy()
    with InPlaceGraft(model, b, r) as session:
        session.apply(plan_graft(tax, GraftSpec.parse("all")))
        state = model.state_dict()
        for n in b.metas:
            P.assert_bit_equal(state[n], stored.read(n).to(torch.bfloat16), n)
        session.apply(plan_graft(tax, GraftSpec.parse("none")))
        for n in b.metas:
            P.assert_bit_equal(model.state_dict()[n], b.read(n), n)
    for n, t in original.items():
        P.assert_bit_equal(model.state_dict()[n], t, n)


# ---------------------------------------------------------------------------------- no fine-tune


def test_the_rule_from_sums_both_outcomes():
    """ρ = √(‖Δ‖²/‖W‖²), cos = (‖W‖² + ⟨W,Δ⟩)/√(‖W‖² (‖W‖² + 2⟨W,Δ⟩ + ‖Δ‖²)), on sums with known answers."""
    s2 = 1 / np.sqrt(2)
    # W' = 2.5 W: ρ = 1.5 (far), cos = 1 — far in more than half the matrices refuses even at cos 1
    far = pair_distance(["a", "b", "c"], [1.0] * 3, [2.25, 2.25, 0.0], [1.5, 1.5, 0.0])
    assert np.allclose(far.rho, [1.5, 1.5, 0]) and np.allclose(far.cos, [1, 1, 1])
    assert far.n_far == 2 and far.median_cos > 0.5 and not far.plausible  # more than half far
    half = pair_distance(["a", "b", "c", "d"], [1.0] * 4, [2.25, 2.25, 0.0, 0.0], [1.5, 1.5, 0.0, 0.0])
    assert half.n_far == 2 and half.plausible  # half is not most
    # Δ ⟂ W with ‖Δ‖ = ‖W‖: ρ = 1 (not far: > 1 is), cos = 1/√2 — a collapse-like move stays plausible
    ortho = pair_distance(["a", "b", "c"], [1.0] * 3, [1.0, 1.0, 1.0], [0.0] * 3)
    assert np.allclose(ortho.rho, 1) and np.allclose(ortho.cos, s2) and ortho.n_far == 0 and ortho.plausible
    # W' = −W in half the matrices: cos −1, median cos (−1 + 1)/2 = 0: refused by the cosine alone
    flipped = pair_distance(["a", "b", "c", "d"], [1.0] * 4, [4.0, 4.0, 0.0, 0.0], [-2.0, -2.0, 0.0, 0.0])
    assert np.allclose(flipped.cos, [-1, -1, 1, 1]) and flipped.n_far == 2 and flipped.median_cos == 0.0
    assert not flipped.plausible
    # ρ = 1 exactly is not far (> 1): W' = 2 W
    edge = pair_distance(["a"], [4.0], [4.0], [4.0])
    assert edge.rho[0] == 1.0 and edge.cos[0] == 1.0 and edge.n_far == 0 and edge.plausible
    assert pair_distance([], [], [], []).plausible
    zero = pair_distance(["z", "y"], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0])  # a zero base matrix has no cosine
    assert zero.rho[0] == np.inf and np.isnan(zero.cos[0]) and zero.median_cos == 1.0
    assert f"> {FAR_RHO}" in FINE_TUNE_RULE and "more than 50%" in FINE_TUNE_RULE


def test_streamed_sums_equal_float64_in_any_chunking(world):
    b, r = open_checkpoint(world["mixed"]["base"]), open_checkpoint(world["mixed"]["rl"])
    name = "model.embed_tokens.weight"
    W, V = b.read(name).double(), r.read(name).double()
    want = (float((W**2).sum()), float(((V - W) ** 2).sum()), float((W * (V - W)).sum()))
    for chunk in (7, 1000, 1 << 20):
        got = matrix_sums(b.array(name), r.array(name), "BF16", "F32", chunk=chunk)
        assert np.allclose(got, want, rtol=1e-6), (chunk, got, want)


def test_chunked_reads_give_the_whole_arrays_sums_bit_for_bit(world):
    """``array_chunks`` reads raw bytes a chunk at a time into one buffer; the streamed sums equal the sums of
    the whole arrays exactly, and the threaded pair distance equals the one-thread one."""
    from graftkit.weights import stream_pair_distance
    from graftkit.weights.pair import judged_matrices, streamed_matrix_sums

    b, r = open_checkpoint(world["mixed"]["base"]), open_checkpoint(world["mixed"]["rl"])
    for name in judged_matrices(b):
        whole = b.array(name).reshape(-1)
        for chunk in (7, 1000):
            assert np.array_equal(np.concatenate([c.copy() for c in b.array_chunks(name, chunk)]), whole)
        assert streamed_matrix_sums(b, r, name, chunk=1000) == matrix_sums(b.array(name), r.array(name),
                                                                            b.metas[name].code, r.metas[name].code,
                                                                            chunk=1000)
    one, two = stream_pair_distance(b, r, workers=1), stream_pair_distance(b, r, workers=2)
    assert one.names == two.names and np.array_equal(one.rho, two.rho) and np.array_equal(one.cos, two.cos)


def test_the_graft_guard_samples_a_fine_tune_and_judges_anything_else_whole(world):
    """A fine-tune passes on every 8th chunk (its estimate close to the whole pair's); a random init is judged
    again on every entry, so its refusal states the whole pair's figures; the sample reads chunks 0, k, 2k."""
    from graftkit.weights import guard_pair_distance, stream_pair_distance

    s = world["same"]
    b, r, u = (open_checkpoint(s[k]) for k in ("base", "rl", "unrelated"))
    name = "model.embed_tokens.weight"
    whole = b.array(name).reshape(-1)
    got = np.concatenate([c.copy() for c in b.array_chunks(name, 100, every=3)])
    assert np.array_equal(got, np.concatenate([whole[i:i + 100] for i in range(0, whole.size, 300)]))
    exact = stream_pair_distance(b, r, chunk=64)
    sample, sampled = guard_pair_distance(b, r, chunk=64)
    assert sampled and sample.names == exact.names and sample.plausible
    assert not np.array_equal(sample.rho, exact.rho)  # a sample, not the whole matrices
    assert np.allclose(sample.rho, exact.rho, rtol=0.5) and np.allclose(sample.cos, exact.cos, atol=1e-3)
    far, sampled = guard_pair_distance(b, u, chunk=64)
    assert not sampled and not far.plausible
    whole_far = stream_pair_distance(b, u, chunk=64)
    assert np.array_equal(far.rho, whole_far.rho) and far.summary() == whole_far.summary()


def test_clearly_plausible_halves_both_thresholds():
    near = pair_distance(["a", "b", "c", "d"], [1.0] * 4, [0.36, 0.01, 0.01, 0.01], [0.0] * 4)  # rho 0.6 in 1 of 4
    assert near.plausible and near.clearly_plausible
    half = pair_distance(["a", "b", "c", "d"], [1.0] * 4, [0.36, 0.36, 0.01, 0.01], [0.0] * 4)  # rho 0.6 in 2 of 4
    assert half.plausible and not half.clearly_plausible
    bent = pair_distance(["a"], [1.0], [0.64], [-0.5])  # cos 0.5/sqrt(0.64) ≈ 0.625: plausible, not clearly
    assert bent.plausible and not bent.clearly_plausible and 0.5 < bent.median_cos < 0.75
    assert pair_distance([], [], [], []).clearly_plausible


def test_a_random_init_is_refused_by_delta_graft_and_rank(world, cli):
    s = world["same"]
    far, count, med_rho, med_cos = reference_distance(tensors(s["base"]), tensors(s["unrelated"]))
    assert far > count / 2 and med_cos < 0.5  # the reference agrees: no fine-tune
    figures = f"‖Δ‖/‖W‖ > {FAR_RHO:g} in {far} of {count} matrices (median {med_rho:.3g}), median cos(W, W+Δ) {med_cos:.2f}"
    head = f"RL {s['unrelated']} is not a fine-tune of base {s['base']}: {figures}, and it records no parent"
    err = one_line_error(cli("delta", "--base", s["base"], "--from", s["unrelated"]), head,
                         "if RL was trained from this base", "pass --force-pair")
    assert "own SFT parent" not in err  # --base was given: passing "its SFT parent as --base" is no advice
    out = cli.cwd / "g"
    one_line_error(cli("graft", "--base", s["base"], "--from", s["unrelated"], "--groups", "attn", "--out", out),
                   head, "--base", "--force-pair")
    assert not out.exists()
    # --force replaces an output folder; it does not make a random init a fine-tune
    one_line_error(cli("graft", "--base", s["base"], "--from", s["unrelated"], "--groups", "attn", "--out", out,
                       "--force"), head)
    # the pass runs beside the export: a refusal leaves an earlier output where --force would replace it intact
    earlier = cli.cwd / "earlier"
    ok = cli("graft", "--base", s["base"], "--from", s["rl"], "--groups", "attn", "--out", earlier)
    assert ok.exit_code == 0, ok.output
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    one_line_error(cli("graft", "--base", s["base"], "--from", s["unrelated"], "--groups", "attn", "--out", earlier,
                       "--force"), head)
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before
    assert sorted(p.name for p in cli.cwd.iterdir() if p.name.startswith(".earlier")) == []  # no temporary left
    one_line_error(cli("graft", "--base", s["base"], "--from", s["unrelated"], "--eval", "--groups", "attn"), head)
    one_line_error(cli("rank", "--what", "delta", "--model", s["unrelated"], "--base", s["base"]), head,
                   "pass --force-pair", "as --base")
    b, u = open_checkpoint(s["base"]), open_checkpoint(s["unrelated"])
    with pytest.raises(GraftkitError, match="is not a fine-tune"):
        delta_anatomy(b, [u], ["u"], b.taxonomy())


def test_a_random_init_is_analysed_with_force_pair(world, cli):
    s = world["same"]
    d = cli("delta", "--base", s["base"], "--from", s["unrelated"], "--force-pair", "--json")
    assert d.exit_code == 0, d.output
    got = json.loads(d.stdout)
    (note,) = [n for n in got["notes"] if "is not a fine-tune" in n]
    assert note.endswith("(analysed anyway: --force-pair)") and not got["fine_tune"]["random-init"]["plausible"]
    assert got["fine_tune"]["random-init"]["accepted"] == "forced"
    out = cli.cwd / "g"
    g = cli("graft", "--base", s["base"], "--from", s["unrelated"], "--groups", "attn", "--out", out, "--force-pair")
    assert g.exit_code == 0, g.output
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["config"]["force_pair"] is True and any("is not a fine-tune" in n for n in prov["notes"])
    b, u = open_checkpoint(s["base"]), open_checkpoint(s["unrelated"])
    res = delta_ranks(b, u, b.taxonomy(), layers="late", metrics=["erank"], force_pair=True)
    assert any(n.endswith("(analysed anyway: --force-pair)") for n in res.attrs["pair_notes"])
    assert not res.attrs["fine_tune"]["plausible"]


def test_a_planted_fine_tune_passes_silently(world, cli):
    s = world["same"]
    b, r = open_checkpoint(s["base"]), open_checkpoint(s["rl"])
    dist = stream_pair_distance(b, r)
    far, count, med_rho, med_cos = reference_distance(tensors(s["base"]), tensors(s["rl"]))
    assert (dist.n_far, len(dist.names)) == (far, count) == (0, count)
    assert np.isclose(dist.median_rho, med_rho, rtol=1e-5) and np.isclose(dist.median_cos, med_cos, atol=1e-9)
    assert check_fine_tune(dist, b, r, force=False) == ()
    g = cli("graft", "--base", s["base"], "--from", s["rl"], "--groups", "attn", "--out", cli.cwd / "g", "--json")
    assert g.exit_code == 0, g.output
    assert not any("fine-tune" in n for n in json.loads(g.stdout)["notes"])
    res = delta_anatomy(b, [r], ["rl"], b.taxonomy())
    assert res.attrs["pair_notes"] == [] and res.attrs["fine_tune"]["rl"]["plausible"]


# --------------------------------------------------------------------- far, but the record names the base


def _figures(base: Path, rl: Path) -> str:
    far, count, med_rho, med_cos = reference_distance(tensors(base), tensors(rl))
    assert far > count / 2 and med_cos < 0.5  # the rule alone would refuse the pair
    return f"‖Δ‖/‖W‖ > {FAR_RHO:g} in {far} of {count} matrices (median {med_rho:.3g}), median cos(W, W+Δ) {med_cos:.2f}"


def _far_notes(notes) -> list[str]:
    return [n for n in notes if "moved far" in n]


def test_a_far_run_that_records_this_base_is_analysed_with_one_note(world, cli):
    s = world["same"]
    figures = _figures(s["base"], s["recorded"])
    fp = json.loads((s["recorded"] / "graftkit.json").read_text())["base_model"]["fingerprint"]
    want = (f"RL {s['recorded']} moved far from base {s['base']}: {figures}; analysed as a fine-tune because its "
            f"graftkit.json records this base as its parent (fingerprint {fp[:19]}… equal)")
    for given in (("--base", s["base"]), ()):  # the base given, or taken from the record itself
        d = cli("delta", *given, "--from", s["recorded"], "--json")
        assert d.exit_code == 0, d.output
        got = json.loads(d.stdout)
        assert _far_notes(got["notes"]) == [want.replace(str(s["base"]), got["base"])]
        ft = got["fine_tune"]["far-child"]
        assert ft["accepted"] == "recorded parent" and not ft["plausible"]
    text = cli("delta", "--base", s["base"], "--from", s["recorded"])
    assert text.exit_code == 0 and f"note: {want}\n" in text.stdout, text.output
    out = cli.cwd / "g"
    g = cli("graft", "--base", s["base"], "--from", s["recorded"], "--groups", "attn", "--out", out, "--json")
    assert g.exit_code == 0, g.output
    assert _far_notes(json.loads(g.stdout)["notes"]) == [want]
    assert _far_notes(json.loads((out / "graftkit.json").read_text())["notes"]) == [want]
    r = cli("rank", "--what", "delta", "--model", s["recorded"], "--base", s["base"], "--layers", "late",
            "--metric", "erank", "--json")
    assert r.exit_code == 0, r.output
    (m,) = json.loads(r.stdout)["models"].values()
    assert _far_notes(m["notes"]) == [want]
    # the graft sweeps judge their pair through delta_anatomy
    b, u = open_checkpoint(s["base"]), open_checkpoint(s["recorded"])
    res = delta_anatomy(b, [u], ["u"], b.taxonomy())
    assert _far_notes(res.attrs["pair_notes"]) == [want] and res.attrs["fine_tune"]["u"]["accepted"] == "recorded parent"
    # the far pair recorded with its own (other) base is analysed against it too
    d = cli("delta", "--from", s["other"], "--json")
    assert d.exit_code == 0, d.output
    assert json.loads(d.stdout)["fine_tune"]["far-other"]["accepted"] == "recorded parent"


def test_a_record_that_names_another_base_is_refused(world, cli):
    s = world["same"]
    head = f"RL {s['other']} is not a fine-tune of base {s['base']}: {_figures(s['base'], s['other'])}"
    parent = str(s["other_base"].resolve())
    for args in (("delta", "--base", s["base"], "--from", s["other"]),
                 ("graft", "--base", s["base"], "--from", s["other"], "--groups", "attn", "--out", cli.cwd / "g"),
                 ("rank", "--what", "delta", "--base", s["base"], "--model", s["other"])):
        err = one_line_error(cli(*args), head, f"records another parent, {parent} (fingerprint blake3:",
                             f"pass its recorded parent {parent} as --base, or --force-pair")
        assert "own SFT parent" not in err and str(s["base"]) not in err.split(" — ")[1], err  # the fix is not --base
    assert not (cli.cwd / "g").exists()


def _with_record(folder: Path, src: Path, record: dict | None) -> Path:
    """A copy of ``src``'s weights and config whose graftkit.json records ``record`` as its base_model."""
    import shutil

    folder.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(src / name, folder / name)
    (folder / "graftkit.json").write_text(json.dumps({"producer": "test", **({"base_model": record} if record else {})}))
    return folder


def test_records_that_cannot_vouch_for_the_base_are_refused_with_what_would_help(world, tmp_path):
    s = world["same"]
    b = open_checkpoint(s["base"])
    here = str(s["base"].resolve())
    real = json.loads((s["recorded"] / "graftkit.json").read_text())["base_model"]["fingerprint"]
    cases = {  # record → (words of the error, words of its fix)
        "changed": ({"path": here, "fingerprint": "blake3:" + "0" * 64},
                    "the base at the path its graftkit.json records has changed since", f"restore the base RL was "
                    f"trained from at {here}, or pass --force-pair"),
        "path-only": ({"path": here}, "records this base as its parent without a fingerprint",
                      "pass --force-pair to analyse it against this base anyway"),
        "sha1": ({"path": here, "fingerprint": "sha1:abc"}, "by a fingerprint graftkit cannot compute (sha1:abc)",
                 "pass --force-pair"),
        "gone": ({"path": str(tmp_path / "moved-away"), "fingerprint": "blake3:" + "1" * 64},
                 f"records another parent, {tmp_path / 'moved-away'}", "pass the base it was trained from (fingerprint "
                 "blake3:111111111111…) as --base, or --force-pair"),
        "none": (None, "records no parent", "if RL was trained from this base"),
    }
    for name, (record, what, fix) in cases.items():
        r = open_checkpoint(_with_record(tmp_path / name, s["recorded"], record))
        dist = stream_pair_distance(b, r)
        with pytest.raises(GraftkitError) as e:
            judge_pair(dist, b, r, force=False)
        assert what in e.value.what and fix in e.value.fix, (name, str(e.value))
        assert here not in e.value.fix or name == "changed", name  # never "pass the base you gave"
        (note,) = judge_pair(dist, b, r, force=True).notes
        assert what in note and note.endswith("(analysed anyway: --force-pair)"), name
    # the same weights with the record graftkit writes: analysed
    ok = open_checkpoint(_with_record(tmp_path / "ok", s["recorded"], {"path": here, "fingerprint": real}))
    assert judge_pair(stream_pair_distance(b, ok), b, ok, force=False).accepted == "recorded parent"
    assert real == describe(b)["fingerprint"]


def test_a_record_the_trainer_wrote_vouches_for_its_init(tmp_path):
    """graftkit's GRPO trainer records its init by path and fingerprint. Its policy after a step with zero reward
    is bit-identical to the init (said in one line); the same record beside weights as far from the init as a
    collapsed run's lets the pair be analysed, and against another base it is refused, naming the init."""
    from conftest import planted_policies
    from safetensors.torch import save_file

    from graftkit.graft import DeltaConfig, run_delta
    from graftkit.train.grpo import GRPOConfig, run_grpo

    pol = planted_policies(tmp_path / "pol", children=())
    rl = run_grpo(GRPOConfig(init=str(pol["sft"]), out=str(tmp_path / "rl"), tasks=("click-button",), steps=1,
                             prompts_per_step=1, group_size=2, max_new_tokens=4, threads=1))
    assert [json.loads(x)["success"] for x in (rl / "train_log.jsonl").read_text().splitlines()] == [0.0]
    d = run_delta(DeltaConfig(rl=(rl,), save=tmp_path / "d.h5"))  # the base from the trainer's record
    assert d.identical(0) and d.identical_line(0).startswith(f"rl is bit-identical to base {pol['sft'].resolve()}")
    sft = open_checkpoint(pol["sft"])
    g = torch.Generator().manual_seed(3)
    save_file({n: torch.randn(sft.metas[n].shape, generator=g).to(sft.read(n).dtype) * float(sft.read(n).float().std())
               for n in sft.metas}, str(rl / "model.safetensors"))
    r = open_checkpoint(rl)
    dist = stream_pair_distance(sft, r)
    assert not dist.plausible
    verdict = judge_pair(dist, sft, r, force=False)
    assert verdict.accepted == "recorded parent" and "records this base as its parent" in verdict.notes[0]
    other = _with_record(tmp_path / "other", pol["sft"], None)
    save_file({n: sft.read(n) * 1.5 for n in sft.metas}, str(other / "model.safetensors"))
    o = open_checkpoint(other)
    with pytest.raises(GraftkitError) as e:
        judge_pair(stream_pair_distance(o, r), o, r, force=False)
    init = str(pol["sft"].resolve())
    assert f"records another parent, {init}" in e.value.what and f"pass its recorded parent {init} as --base" in e.value.fix


def test_fingerprints_are_read_only_where_the_rule_would_refuse(world, monkeypatch):
    """Fingerprinting a base reads all of it: a plausible pair is judged without it, a far one with it."""
    import graftkit.weights.pair as pair

    s = world["same"]
    calls = []
    real = pair.file_digests
    monkeypatch.setattr(pair, "file_digests", lambda files, algorithm="blake3": calls.append(algorithm)
                        or real(files, algorithm))
    b = open_checkpoint(s["base"])
    r = open_checkpoint(s["rl"])
    assert check_fine_tune(stream_pair_distance(b, r), b, r, force=False) == ()
    delta_anatomy(b, [r], ["rl"], b.taxonomy())
    assert calls == []
    u = open_checkpoint(s["recorded"])
    assert judge_pair(stream_pair_distance(b, u), b, u, force=False).accepted == "recorded parent"
    assert calls == ["blake3"]


def test_a_pair_in_which_nothing_moved_is_said_to_be_one(world, cli, tmp_path):
    import shutil

    s = world["same"]
    copy_ = tmp_path / "copy"
    shutil.copytree(s["base"], copy_)
    b, c = open_checkpoint(s["base"]), open_checkpoint(copy_)
    dist, sampled = guard_pair_distance(b, c, chunk=64)
    assert dist.unmoved and not sampled  # "nothing moved" is said of the whole pair, never of a sample
    (note,) = check_fine_tune(dist, b, c, force=False)
    assert note.startswith(f"RL {copy_} has not moved from base {s['base']} in any of its {len(dist.names)} matrices")
    g = cli("graft", "--base", s["base"], "--from", copy_, "--groups", "attn", "--out", cli.cwd / "g", "--json")
    assert g.exit_code == 0, g.output
    assert any("has not moved" in n and "a graft of them copies the base" in n for n in json.loads(g.stdout)["notes"])
    r = cli("rank", "--what", "delta", "--model", copy_, "--base", s["base"], "--layers", "late", "--json")
    assert r.exit_code == 0, r.output
    (m,) = json.loads(r.stdout)["models"].values()
    assert [n for n in m["notes"] if "has not moved" in n] == [note]
    assert check_fine_tune(stream_pair_distance(b, open_checkpoint(s["rl"])), b, open_checkpoint(s["rl"]),
                           force=False) == ()  # a pair that moved says nothing


# ---------------------------------------------------------------------------------- a resized vocabulary

@pytest.fixture(scope="module")
def resized(tmp_path_factory):
    """A base (vocabulary 64) and an RL model that added 3 tokens (67 rows in embed and lm_head) and moved
    attention and the shared embedding rows a little."""
    root = tmp_path_factory.mktemp("vocab")
    model = P.tiny_model("qwen3", LAYERS, seed=0)
    base = P.save_base(root / "base", model)
    rl_model = copy.deepcopy(model)
    rl_model.resize_token_embeddings(67)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, p in rl_model.named_parameters():
            if "self_attn" in n or "embed_tokens" in n:
                p.add_(1e-3 * torch.randn(p.shape, generator=g))
    return {"base": base, "rl": P.save_rl(root / "rl", rl_model, base)}


def test_a_resized_vocabulary_is_compared_and_grafted_over_the_shared_rows(resized, cli):
    b, r = tensors(resized["base"]), tensors(resized["rl"])
    emb = "model.embed_tokens.weight"
    assert r[emb].shape[0] == 67 and b[emb].shape[0] == 64
    one_line_error(cli("delta", "--from", resized["rl"]), "vocabulary size differs", "--shared-vocab")
    one_line_error(cli("graft", "--from", resized["rl"], "--groups", "attn", "--out", cli.cwd / "x"), "--shared-vocab")
    d = json.loads(cli("delta", "--from", resized["rl"], "--shared-vocab", "--json").stdout)
    (run,) = d["runs"].values()
    want = float((r[emb][:64].double() - b[emb].double()).norm())
    (row,) = [t for t in run["tensors"] if t["name"] == emb]
    assert row["fro_delta"] == pytest.approx(want, rel=1e-6)
    assert "RL has 3 extra token rows (vocabulary 67 vs base 64" in json.dumps(d, ensure_ascii=False)
    out = cli.cwd / "g"
    res = cli("graft", "--from", resized["rl"], "--groups", "all", "--shared-vocab", "--out", out)
    assert res.exit_code == 0, res.output
    g = tensors(out)
    for n, t in g.items():  # graft(all) over the shared rows: RL's tensors cut to the base's vocabulary, bit for bit
        P.assert_bit_equal(t, r[n][: b[n].shape[0]] if n in (emb, "lm_head.weight") else r[n], n)
    rank = cli("rank", "--what", "delta", "--model", resized["rl"], "--shared-vocab", "--json")
    assert rank.exit_code == 0, rank.output


def test_a_base_with_more_rows_than_rl_is_refused(resized, cli):
    one_line_error(cli("delta", "--from", resized["base"], "--base", resized["rl"], "--shared-vocab"),
                   "the base has 67 token rows but RL only 64")
