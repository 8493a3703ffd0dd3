"""Delta anatomy against an independent float64 numpy re-computation, on planted deltas.

Every per-tensor metric (‖Δ‖_F, ‖Δ‖/‖W‖, share, max|Δ|, fraction bitwise unchanged, fraction within
tol), the group, layer × group and total aggregates (from sums, never averages of ratios), the cosine
between runs' deltas, NaN/Inf accounting and the vocabulary check.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.graft import delta_anatomy, summarise, tensor_delta_stats  # noqa: E402
from graftkit.results.store import read_result, write_result  # noqa: E402
from graftkit.weights import check_pair, open_checkpoint  # noqa: E402

METRICS = ("fro_delta", "rel_delta", "share", "max_abs_delta", "frac_unchanged", "frac_within_tol")
TOL = 1e-3
# Planted: embedding (large), attention in layers 2-3 only, MLP in layer 0 only; norms and head untouched.
SCALES = {
    "embed": 0.1,
    "attn": lambda layer: 0.02 if layer >= 2 else 0.0,
    "mlp": lambda layer: 0.03 if layer == 0 else 0.0,
}
N_LAYERS = 4
NAN_TENSOR = "model.layers.1.mlp.up_proj.weight"


class Runs:
    """One base and several RL runs derived from it, saved; their tensors kept in memory."""

    def __init__(self, root: Path, dtype: torch.dtype):
        self.pair = P.make_pair(root / "pair", "qwen3", layers=N_LAYERS, dtype=dtype, scales=SCALES)
        model, deltas = self.pair.model, self.pair.deltas
        self.paths = {"rl": self.pair.rl}
        self.sds = {"rl": self.pair.rl_sd}

        def add(label: str, rl_model) -> None:
            self.paths[label] = P.save_rl(root / label, rl_model, self.pair.base)
            self.sds[label] = P.stored_state(rl_model, False)

        add("same", P.apply_deltas(model, deltas))
        add("negated", P.apply_deltas(model, deltas, sign=-1.0))
        add("random", P.apply_deltas(model, P.planted_deltas(model, SCALES, seed=99)))

        def plant_nonfinite(params):
            p = params[NAN_TENSOR]
            p[0, 0], p[0, 1], p[1, 0], p[2, 2] = float("nan"), float("inf"), float("-inf"), float("nan")

        nan_model = P.apply_deltas(model, deltas)
        with torch.no_grad():
            plant_nonfinite(dict(nan_model.named_parameters()))
        add("nonfinite", nan_model)
        self.base = open_checkpoint(self.pair.base)
        self.tax = self.base.taxonomy()

    def anatomy(self, labels, tol=TOL):
        rls = [open_checkpoint(self.paths[lab]) for lab in labels]
        return delta_anatomy(self.base, rls, list(labels), self.tax, tol)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Runs]:
    root = tmp_path_factory.mktemp("delta")
    return {"fp32": Runs(root / "fp32", torch.float32), "bf16": Runs(root / "bf16", torch.bfloat16)}


# ------------------------------------------------------------------------------ the reference


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def reference_sums(base_sd, rl_sd, names, tol):
    """Per tensor: sumsq_base, numel, sumsq_delta, max|Δ|, n_unchanged, n_within_tol, n_nonfinite, Δ."""
    rows = {}
    for n in names:
        b, r = base_sd[n], rl_sd[n]
        d = _f64(r) - _f64(b)  # exact in float64 for float32 / bfloat16 inputs
        fin = np.isfinite(d)
        df = np.where(fin, d, 0.0)
        same = (P.bits(b) == P.bits(r)).numpy()
        rows[n] = dict(
            sumsq_base=float((_f64(b) ** 2).sum()), numel=b.numel(), sumsq_delta=float((df**2).sum()),
            max_abs=float(np.abs(df).max()), n_unchanged=int(same.sum()),
            n_within_tol=int((np.abs(d[fin]) <= tol).sum()), n_nonfinite=int((~fin).sum()), delta=df,
        )
    return rows


def reference_metrics(rows: dict, members: list[str], total: float) -> dict[str, float]:
    """Aggregate metrics over ``members`` from sums (the definitions of the anatomy module docstring)."""
    ssd = sum(rows[n]["sumsq_delta"] for n in members)
    ssb = sum(rows[n]["sumsq_base"] for n in members)
    numel = sum(rows[n]["numel"] for n in members)
    return {
        "fro_delta": np.sqrt(ssd),
        "rel_delta": np.sqrt(ssd / ssb),
        "share": ssd / total if total else 0.0,
        "max_abs_delta": max(rows[n]["max_abs"] for n in members),
        "frac_unchanged": sum(rows[n]["n_unchanged"] for n in members) / numel,
        "frac_within_tol": sum(rows[n]["n_within_tol"] for n in members) / numel,
    }


def assert_metrics(got: dict[str, float], want: dict[str, float], what: str) -> None:
    for m in METRICS:
        assert np.isclose(got[m], want[m], rtol=2e-6, atol=1e-12), f"{what} {m}: {got[m]} vs {want[m]}"


# ------------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_metric_matches_a_float64_reference(runs, dtype):
    R = runs[dtype]
    res = R.anatomy(["rl"])
    names = list(res.coords["tensor"])
    assert set(names) == set(R.pair.names)
    rows = reference_sums(R.pair.base_sd, R.pair.rl_sd, names, TOL)
    total = sum(r["sumsq_delta"] for r in rows.values())

    for j, n in enumerate(names):
        got = {m: res[m][0, j] for m in METRICS}
        assert_metrics(got, reference_metrics(rows, [n], total), n)
        assert res["n_nonfinite"][0, j] == 0
        assert res["numel"][j] == rows[n]["numel"]
        assert res["tensor_group"][j] == P.group_of(n)
        assert res["tensor_layer"][j] == (P.layer_of(n) if P.layer_of(n) is not None else -1)

    groups = list(res.coords["group"])
    assert set(groups) == set(R.pair.groups_present())
    for gi, g in enumerate(groups):
        members = [n for n in names if P.group_of(n) == g]
        assert_metrics({m: res[f"group_{m}"][0, gi] for m in METRICS}, reference_metrics(rows, members, total), g)

    assert_metrics({m: res[f"total_{m}"][0, 0] for m in METRICS}, reference_metrics(rows, names, total), "total")
    assert np.isclose(res["total_share"][0, 0], 1.0)
    assert np.isclose(res["group_share"][0].sum(), 1.0)

    # layer × group cells, for the cells that hold tensors
    assert list(res.coords["layer"]) == list(range(N_LAYERS))
    for L in range(N_LAYERS):
        for gi, g in enumerate(groups):
            members = [n for n in names if P.group_of(n) == g and P.layer_of(n) == L]
            if not members:
                assert res["layer_group_share"][0, L, gi] == 0 and res["layer_group_fro_delta"][0, L, gi] == 0
                continue
            want = reference_metrics(rows, members, total)
            for m in ("share", "rel_delta", "fro_delta", "frac_unchanged"):
                got = res[f"layer_group_{m}"][0, L, gi]
                assert np.isclose(got, want[m], rtol=2e-6, atol=1e-12), (L, g, m)
    assert res.dims("layer_group_share") == ("run", "layer", "group")
    assert res.attrs["tol"] == TOL


def test_planted_delta_is_localised(runs):
    R = runs["fp32"]
    res = R.anatomy(["rl"])
    groups = list(res.coords["group"])
    share = dict(zip(groups, res["group_share"][0]))
    unchanged = dict(zip(groups, res["group_frac_unchanged"][0]))
    for g in ("norm", "lm_head"):  # not perturbed
        assert share[g] == 0.0 and unchanged[g] == 1.0
        assert res["group_fro_delta"][0, groups.index(g)] == 0.0
    planted = {g: sum(float((R.pair.deltas[n].double() ** 2).sum()) for n in R.pair.names if P.group_of(n) == g)
               for g in groups}
    total = sum(planted.values())
    for g in ("embed", "attn", "mlp"):
        # the realised delta is the planted one up to float32 rounding of θ + Δ
        assert share[g] == pytest.approx(planted[g] / total, rel=1e-4), g
    assert share["embed"] > share["attn"] > 0 and share["mlp"] > 0
    # per layer: attention moved only in layers 2-3, the MLP only in layer 0
    ai, mi = groups.index("attn"), groups.index("mlp")
    cells = res["layer_group_share"][0]
    assert [bool(cells[L, ai] > 0) for L in range(N_LAYERS)] == [False, False, True, True]
    assert [bool(cells[L, mi] > 0) for L in range(N_LAYERS)] == [True, False, False, False]
    fu = res["layer_group_frac_unchanged"][0]
    assert fu[0, ai] == 1.0 and fu[1, mi] == 1.0
    # every tensor outside the planted cells is bitwise unchanged
    for j, n in enumerate(res.coords["tensor"]):
        moved = bool((R.pair.deltas[n] != 0).any())
        assert (res["frac_unchanged"][0, j] == 1.0) == (not moved), n


def test_round_trip_through_the_store(runs, tmp_path):
    res = runs["bf16"].anatomy(["rl", "random"])
    back = read_result(write_result(tmp_path / "d.h5", res))
    assert back.kind == "delta"
    for k in res.data:
        assert back.dims(k) == res.dims(k)
        a, b = np.asarray(res[k]), np.asarray(back[k])
        if a.dtype.kind in "fc":
            np.testing.assert_array_equal(a, b)
        else:
            assert a.tolist() == b.tolist(), k


# -------------------------------------------------------------------------------------- cosine


def test_cosine_between_runs(runs):
    R = runs["fp32"]
    labels = ["rl", "same", "negated", "random"]
    res = R.anatomy(labels)
    cos = res["total_cosine"][..., 0]
    np.testing.assert_allclose(np.diag(cos), 1.0, rtol=1e-12)
    np.testing.assert_allclose(cos, cos.T)
    assert cos[0, 1] == pytest.approx(1.0, abs=1e-12)
    assert cos[0, 2] == pytest.approx(-1.0, abs=1e-5)
    assert abs(cos[0, 3]) < 0.05
    # from the stored dot products, independently
    rows = {lab: reference_sums(R.pair.base_sd, R.sds[lab], R.pair.names, TOL) for lab in labels}
    da = np.concatenate([rows["rl"][n]["delta"].ravel() for n in R.pair.names])
    dr = np.concatenate([rows["random"][n]["delta"].ravel() for n in R.pair.names])
    assert cos[0, 3] == pytest.approx(da @ dr / np.sqrt((da @ da) * (dr @ dr)), rel=1e-5, abs=1e-7)
    groups = list(res.coords["group"])
    for g in ("embed", "attn", "mlp"):
        gi = groups.index(g)
        assert res["group_cosine"][0, 2, gi] == pytest.approx(-1.0, abs=1e-5)
        names = [n for n in R.pair.names if P.group_of(n) == g]
        a = np.concatenate([rows["rl"][n]["delta"].ravel() for n in names])
        r = np.concatenate([rows["random"][n]["delta"].ravel() for n in names])
        assert res["group_cosine"][0, 3, gi] == pytest.approx(a @ r / np.sqrt((a @ a) * (r @ r)), rel=1e-5, abs=1e-7)
    # a group that never moved has no direction: its cosine is undefined, not 0 or 1
    assert np.isnan(res["group_cosine"][0, 1, groups.index("norm")])


def test_tensor_delta_stats_in_chunks_equals_one_pass():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(37, 11, generator=g)
    rls = [b + 0.01 * torch.randn(37, 11, generator=g), b.clone(), -b]
    rls[0][3, 4] = float("nan")
    one = tensor_delta_stats(b, rls, 1e-3, chunk=1 << 20)
    many = tensor_delta_stats(b, rls, 1e-3, chunk=13)
    assert one[0] == pytest.approx(many[0])
    np.testing.assert_allclose(one[1], many[1], rtol=1e-6)
    np.testing.assert_allclose(one[2], many[2], rtol=1e-6, atol=1e-12)
    assert one[1][0, 4] == 1 and one[1][1, 2] == b.numel()  # one NaN; a copy is bitwise unchanged


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_relative_tolerance_counts_what_numpy_isclose_does(runs, dtype):
    """frac_within_tol with --rtol: |Δ| ≤ atol + rtol·|W_base| entrywise, numpy.isclose(W_rl, W_base, rtol, atol)
    on the upcast values, NaN/Inf entries left out; streamed in chunks, recorded with the result."""
    R, rtol, atol = runs[dtype], 0.05, 1e-4
    labels = ["rl", "nonfinite"]
    res = delta_anatomy(R.base, [open_checkpoint(R.paths[lab]) for lab in labels], labels, R.tax, atol, rtol=rtol)
    assert res.attrs["rtol"] == rtol and res.attrs["tol"] == atol
    assert res.attrs["conventions"]["rtol"] == rtol and res.attrs["conventions"]["atol"] == atol
    differs = 0
    for k, n in enumerate(res.coords["tensor"]):
        b = R.pair.base_sd[n].float().numpy()
        for r, lab in enumerate(labels):
            w = R.sds[lab][n].float().numpy()
            want = int(np.count_nonzero(np.isclose(w, b, rtol=rtol, atol=atol) & np.isfinite(w - b)))
            assert res["n_within_tol"][r, k] == want, (lab, n)
            differs += want != int(np.count_nonzero(np.isclose(w, b, rtol=0, atol=atol) & np.isfinite(w - b)))
    assert differs  # the relative part counted entries the absolute one alone does not
    g = torch.Generator().manual_seed(1)
    b = torch.randn(37, 11, generator=g)
    rls = [b * (1 + 0.02 * torch.randn(37, 11, generator=g)), b + 1e-3]
    one, many = (tensor_delta_stats(b, rls, 1e-4, chunk=c, rtol=0.01)[1][:, 3] for c in (1 << 20, 13))
    bn = b.numpy()
    assert one.tolist() == many.tolist() == [int(np.isclose(r.numpy(), bn, rtol=0.01, atol=1e-4).sum()) for r in rls]


def test_a_run_identical_to_its_base_is_said_to_be_one(runs, tmp_path):
    """A copy of the base (a trainer's checkpoint after steps with zero reward): every entry unchanged, said in
    one note and flagged; shares 0, cosines with it undefined (NaN), the bf16 ratio no "noise of ∞" sentence."""
    import shutil

    from graftkit.graft.anatomy import DeltaResult, precision_sentence

    R = runs["bf16"]
    copy_ = shutil.copytree(R.pair.base, tmp_path / "copy")
    res = delta_anatomy(R.base, [open_checkpoint(R.paths["rl"]), open_checkpoint(copy_)], ["rl", "copy"], R.tax,
                        provenance={"base_path": str(R.pair.base)})
    d = DeltaResult(read_result(write_result(tmp_path / "d.h5", res)))
    assert [d.identical(i) for i in range(2)] == [False, True] and list(res.attrs["identical"]) == ["copy"]
    line = d.identical_line(1)
    assert line.startswith(f"copy is bit-identical to base {R.pair.base} in all {len(d.tensors)} tensors")
    assert d.identical_line(0) is None and [n for n in d.notes if "bit-identical" in n] == [line]
    assert d.total("share", 1) == 0 and d.total("fro_delta", 1) == 0 and d.total("frac_unchanged", 1) == 1
    cos = d.cosine_total()
    assert np.isnan(cos[0, 1]) and np.isnan(cos[1, 1]) and cos[0, 0] == pytest.approx(1.0)
    p = d.precision(1)
    assert p["moved"] is False and "Nothing moved" in precision_sentence(p) and "∞" not in precision_sentence(p)
    assert d.precision(0)["moved"] is True and "Nothing moved" not in precision_sentence(d.precision(0))
    j = d.as_json(0.0)
    assert j["runs"]["copy"]["identical"] is True and j["runs"]["rl"]["identical"] is False


def test_a_trainer_run_whose_first_checkpoint_did_not_move(tmp_path):
    """A TRL output_dir whose checkpoint-2 is the base (zero reward: no gradient) and later ones moved:
    delta --all-checkpoints says checkpoint-2 is identical in one line, the others are measured."""
    import json

    from typer.testing import CliRunner

    from graftkit.cli import app
    from planted import planted_pair
    from trl_shapes import trl_run

    sft, _ = planted_pair(tmp_path)
    out = trl_run(tmp_path / "trl", sft, steps=(2, 4), still=(2,))
    got = CliRunner().invoke(app, ["delta", "--base", str(sft), "--from", str(out), "--all-checkpoints",
                                   "--save", str(tmp_path / "d.h5"), "--json"])
    assert got.exit_code == 0, got.output
    j = json.loads(got.stdout)
    flags = {lab: run["identical"] for lab, run in j["runs"].items()}
    assert list(flags.values()) == [True, False], flags
    first = next(iter(flags))
    assert [n for n in j["notes"] if "bit-identical" in n] == [
        f"{first} is bit-identical to base {sft} in all {len(j['runs'][first]['tensors'])} tensors: nothing "
        "moved, so every movement figure is 0 and the ratios over ‖Δ‖ (its cosine with another run, bf16 rounding "
        "against its movement) are undefined"]
    assert j["cosine"]["total"][0] == [None, None]


def test_summarise_uses_sums_not_mean_of_ratios():
    # two tensors, one large and unmoved, one small and moved: group rel = √(Σ‖Δ‖² / Σ‖W‖²)
    sumsq_base = np.array([100.0, 1.0])
    numel = np.array([10.0, 2.0])
    sums = np.array([[[0.0, 0.0, 10, 10, 0], [1.0, 1.0, 0, 1, 0]]])  # [run, tensor, SUMS]
    dots = np.array([[[0.0, 1.0]]])
    pooled = summarise(sumsq_base.sum(keepdims=True), numel.sum(keepdims=True),
                       np.stack([sums[..., 0].sum(-1), sums[..., 1].max(-1), sums[..., 2].sum(-1),
                                 sums[..., 3].sum(-1), sums[..., 4].sum(-1)], -1)[:, None, :],
                       dots.sum(-1, keepdims=True), np.array([1.0]))
    assert pooled["rel_delta"][0, 0] == pytest.approx(np.sqrt(1 / 101))
    assert pooled["frac_unchanged"][0, 0] == pytest.approx(10 / 12)
    assert pooled["frac_within_tol"][0, 0] == pytest.approx(11 / 12)


# --------------------------------------------------------------------------------- bad entries


def test_nonfinite_entries_are_counted_and_excluded(runs):
    R = runs["fp32"]
    res = R.anatomy(["nonfinite"])
    names = list(res.coords["tensor"])
    j = names.index(NAN_TENSOR)
    assert res["n_nonfinite"][0, j] == 4
    assert res["n_nonfinite"][0].sum() == 4 and res["total_n_nonfinite"][0, 0] == 4
    gi = list(res.coords["group"]).index("mlp")
    assert res["group_n_nonfinite"][0, gi] == 4
    for key in res.data:
        if key in ("cosine", "group_cosine", "total_cosine") or key.startswith("layer_group_"):
            continue
        v = np.asarray(res[key])
        if key.endswith("round_to_delta_bf16"):  # ∞ exactly where the tensor did not move but bf16 would round it
            still = np.asarray(res[key.replace("round_to_delta_bf16", "fro_delta")]) == 0
            assert np.isfinite(v[~still]).all() and np.isin(v[still], [0.0, np.inf]).all(), key
        elif v.dtype.kind == "f":
            assert np.isfinite(v).all(), key
    rows = reference_sums(R.pair.base_sd, R.sds["nonfinite"], names, TOL)
    total = sum(r["sumsq_delta"] for r in rows.values())
    for k, n in enumerate(names):
        assert_metrics({m: res[m][0, k] for m in METRICS}, reference_metrics(rows, [n], total), n)
    assert res["n_within_tol"][0, j] == rows[NAN_TENSOR]["n_within_tol"]
    assert res["n_unchanged"][0, j] == rows[NAN_TENSOR]["n_unchanged"]
    assert np.isfinite(res["layer_group_share"]).all()


def test_a_base_with_another_vocabulary_is_an_error(runs, tmp_path):
    R = runs["fp32"]
    other = P.save_base(tmp_path / "other", P.tiny_model("qwen3", N_LAYERS, vocab=80))
    ob = open_checkpoint(other)
    rl = open_checkpoint(R.paths["rl"])
    for call in (lambda: check_pair(ob, rl, ob.taxonomy()),
                 lambda: delta_anatomy(ob, [rl], ["rl"], ob.taxonomy())):
        with pytest.raises(GraftkitError, match="vocabulary") as e:
            call()
        msg = str(e.value)
        assert "[80, 32]" in msg and "[64, 32]" in msg and "\n" not in msg


def test_a_different_architecture_is_an_error(runs, tmp_path):
    # a different dtype is no error for delta anatomy (an exact upcast, tests/test_pair_checks.py),
    # but still for check_pair's default policy
    R = runs["fp32"]
    bf = open_checkpoint(runs["bf16"].paths["rl"])
    with pytest.raises(GraftkitError, match="bfloat16"):
        check_pair(R.base, bf, R.tax)
    deeper = open_checkpoint(P.save_base(tmp_path / "deep", P.tiny_model("qwen3", N_LAYERS + 1)))
    with pytest.raises(GraftkitError, match="only in RL: model.layers.4"):
        delta_anatomy(R.base, [deeper], ["x"], R.tax)


def test_runs_sharing_a_mask_overlap_fully_and_independent_masks_at_chance(tmp_path, monkeypatch):
    """Planted: run b moves exactly run a's entries (twice as far: the same |Δ| order), run c an independent mask of
    the same density. a·b read Jaccard 1 for the moved entries and for the top fraction; a·c read within the
    chance interval, which holds the exact expectation Σ a_t b_t / n_t."""
    model = P.tiny_model("qwen3", 2)
    base = P.save_base(tmp_path / "base", model)
    g = torch.Generator().manual_seed(5)
    names = [n for n, p in model.named_parameters() if p.dim() == 2]
    masks = {"a": {n: torch.rand(dict(model.named_parameters())[n].shape, generator=g) < 0.3 for n in names}}
    masks["c"] = {n: torch.rand(m.shape, generator=g) < 0.3 for n, m in masks["a"].items()}
    values = {n: 0.01 + torch.rand(m.shape, generator=g) for n, m in masks["a"].items()}
    runs = {}
    for lab, mask, scale in (("a", masks["a"], 1.0), ("b", masks["a"], 2.0), ("c", masks["c"], 1.0)):
        deltas = {n: scale * values[n] * mask[n] for n in names}
        runs[lab] = P.save_rl(tmp_path / lab, P.apply_deltas(model, deltas), base)
    from graftkit.graft.anatomy import DeltaResult

    res = DeltaResult(read_result(write_result(tmp_path / "d.h5", delta_anatomy(
        open_checkpoint(base), [open_checkpoint(runs[k]) for k in "abc"], list("abc"), open_checkpoint(base).taxonomy(),
        top_frac=0.05))))
    rows = {(tuple(r["runs"]), r["group"]): r for r in res.overlap()}
    for mask in ("moved", "moved_bf16", "top"):
        assert rows[("a", "b"), "all"][mask]["jaccard"] == pytest.approx(1.0), mask
    ac = rows[("a", "c"), "all"]["moved"]
    # the expectation, from the planted masks themselves
    inter = sum(float(masks["a"][n].sum() * masks["c"][n].sum() / masks["a"][n].numel()) for n in names)
    size_a, size_c = (sum(int(masks[k][n].sum()) for n in names) for k in "ac")
    assert ac["chance"] == pytest.approx(inter / (size_a + size_c - inter), rel=1e-9)
    assert ac["chance_low"] < ac["chance"] < ac["chance_high"]
    assert abs(ac["jaccard"] - ac["chance"]) < ac["chance_high"] - ac["chance_low"], ac  # two half-widths
    real = sum(int((masks["a"][n] & masks["c"][n]).sum()) for n in names)
    assert ac["jaccard"] == pytest.approx(real / (size_a + size_c - real), rel=1e-12)
    # the same through the command's config, and in its --json
    from graftkit.graft.anatomy import DeltaConfig, run_delta

    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    d = run_delta(DeltaConfig(rl=tuple(runs[k] for k in "abc"), base=base, save=tmp_path / "cli.h5", top_frac=0.05))
    j = d.as_json(0.0)["overlap"]
    assert j["top_frac"] == 0.05 and j["pairs"] == res.overlap() and j["left_out"] == []
    # the report's figure draws the overlaps over all tensors, and chance beside each
    from graftkit.figures.anatomy import mask_overlap

    fig = mask_overlap(read_result(tmp_path / "d.h5"))
    bars = [t for t in fig.data if t.type == "bar"]
    ticks = [t for t in fig.data if t.type == "scatter"]
    total = [r for r in res.overlap() if r["group"] == "all"]
    assert list(bars[0].x) == [" · ".join(r["runs"]) for r in total]
    for trace, tick, mask in zip(bars, ticks, ("moved", "moved_bf16", "top")):
        assert list(trace.y) == pytest.approx([r[mask]["jaccard"] for r in total])
        assert list(tick.y) == pytest.approx([r[mask]["chance"] for r in total])
    import plotly.io as pio

    from graftkit import figures

    assert pio.to_json(figures.mask_overlap(tmp_path / "d.h5")) == pio.to_json(fig)  # the notebook's is the report's


def test_the_chance_interval_of_an_overlap_covers_independent_masks_at_its_level():
    """Independent masks of fixed sizes in three tensors, drawn 400 times: the 95% interval of
    :func:`jaccard_overlap` holds the drawn Jaccard in 93-97.5% of draws, and its centre is the mean."""
    from graftkit.graft.anatomy import jaccard_overlap

    rng = np.random.default_rng(0)
    numel, sizes = np.array([500, 2000, 120]), [(60, 300), (900, 250), (30, 40)]
    inside, drawn = 0, []
    for _ in range(400):
        both = np.zeros((2, 2, 3, 1))
        for t, (n, (a, b)) in enumerate(zip(numel, sizes)):
            A, B = np.zeros(n, bool), np.zeros(n, bool)
            A[rng.choice(n, a, replace=False)] = True
            B[rng.choice(n, b, replace=False)] = True
            both[:, :, t, 0] = [[a, (A & B).sum()], [(A & B).sum(), b]]
        o = {k: v[0, 1, 0, 0] for k, v in jaccard_overlap(both, numel, np.ones((1, 3), bool)).items()}
        inside += o["jaccard_chance_low"] <= o["jaccard"] <= o["jaccard_chance_high"]
        drawn.append(o["jaccard"])
    assert 0.93 <= inside / 400 <= 0.975, inside
    assert abs(np.mean(drawn) - o["jaccard_chance"]) < 3 * np.std(drawn) / np.sqrt(400)
