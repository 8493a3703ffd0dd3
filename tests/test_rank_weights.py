"""Weight and delta ranks on the demo's planted pair: rows, independent values, aggregates, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from graftkit.cli import app
from planted import planted_pair
from graftkit.rank import METRICS, PAIR_METRICS, delta_ranks, measures, weight_ranks
from graftkit.results.store import read_result, write_result
from graftkit.weights import open_checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    sft, rl = planted_pair(tmp_path_factory.mktemp("rank"))
    b, r = open_checkpoint(sft), open_checkpoint(rl)
    return b, r, b.taxonomy(), load_file(str(sft / "model.safetensors")), load_file(str(rl / "model.safetensors"))


def _index(res):
    return {str(n): i for i, n in enumerate(res.coords["tensor"])}


def test_every_matrix_has_a_row_with_independent_values(pair, tmp_path):
    b, _, tax, raw, _ = pair
    res = weight_ranks(b, tax)
    idx = _index(res)
    mats = {n: t for n, t in raw.items() if t.ndim == 2}
    assert set(idx) == set(mats)  # embeddings and lm_head included, 1-D tensors not
    assert {s["tensor"] for s in res.attrs["skipped"]} == {n for n, t in raw.items() if t.ndim == 1}
    metrics = list(res.coords["metric"])
    assert metrics == list(METRICS)
    for n, t in mats.items():
        ref = measures(t.numpy().astype(np.float64))  # plain torch → numpy path
        sig = np.linalg.svd(t.numpy().astype(np.float64), compute_uv=False)
        row = res["value"][idx[n]]
        for k, m in enumerate(metrics):
            if m == "numerical_rank":
                assert row[k] == int((sig > max(t.shape) * np.finfo(np.float32).eps * sig[0]).sum())
            else:
                assert row[k] == pytest.approx(ref[m], rel=1e-9)
        assert row[metrics.index("stable_rank")] == pytest.approx((sig**2).sum() / sig[0] ** 2, rel=1e-9)
    assert res.attrs["model"]["fingerprint"] and res.attrs["method"] == "gram-eigvalsh-fp64"
    assert "erank" in res.attrs["conventions"] and res.attrs["numerical_rank_tol_rule"]
    back = read_result(write_result(tmp_path / "r.h5", res))
    np.testing.assert_array_equal(back["value"], res["value"])


def test_layer_aggregates_are_means_of_rows(pair):
    b, _, tax, _, _ = pair
    res = weight_ranks(b, tax)
    groups = list(res.coords["group"])
    assert groups[-1] == "all" and set(groups[:-1]) == {"attn", "mlp"}
    for i, L in enumerate(res.coords["layer"]):
        for j, g in enumerate(groups):
            member = (res["tensor_layer"] == L) & ((res["tensor_group"] == g) if g != "all" else True)
            assert res["count_layer"][i, j] == member.sum() > 0
            np.testing.assert_allclose(res["value_layer"][i, j], res["value"][member].mean(0), rtol=1e-12)
            assert res["n_averaged_layer"][i, j] == member.sum()  # no zero weight matrix: all of them
            assert res["averaged_layer"][i, j] == f"all {member.sum()} matrices"
    assert res["tensor_nonzero"].all() and "same set" in res.attrs["aggregate"]


def test_planted_delta(pair):
    b, r, tax, raw_b, raw_r = pair
    res = delta_ranks(b, r, tax)
    metrics = list(res.coords["metric"])
    assert metrics == list(METRICS + PAIR_METRICS)
    col = {m: k for k, m in enumerate(metrics)}
    for n, i in _index(res).items():
        D = (raw_r[n].float() - raw_b[n].float()).numpy().astype(np.float64)
        row = res["value"][i]
        layer = int(res["tensor_layer"][i])
        moved = n == "model.embed_tokens.weight" or layer >= 4
        if moved:
            ref = measures(D)
            assert row[col["frobenius_sq"]] > 0 and row[col["numerical_rank"]] > 0
            for m in ("erank", "stable_rank", "top1_energy"):
                assert row[col[m]] == pytest.approx(ref[m], rel=1e-6)
            assert 0 < row[col["delta_energy_top8"]] < 1 and row[col["spectral_drift"]] > 0
        else:  # zero-norm delta: documented convention
            assert not D.any()
            assert row[col["frobenius_sq"]] == 0 and row[col["numerical_rank"]] == 0 and row[col["sigma_1"]] == 0
            assert np.isnan(row[col["erank"]]) and np.isnan(row[col["delta_energy_top8"]])
            assert row[col["spectral_drift"]] == 0 and row[col["intruders"]] == 0
    layer_erank = res["value_layer"][:, -1, col["erank"]]
    assert np.isnan(layer_erank[:4]).all() and (layer_erank[4:] > 1).all()
    # one set for every measure: no moved tensor in layers 0-3, so numerical_rank is as undefined as erank
    assert np.isnan(res["value_layer"][:4, -1, :]).all() and (res["n_averaged_layer"][:4] == 0).all()
    assert (res["n_averaged_layer"][4:, -1] == res["count_layer"][4:, -1]).all()
    assert "zero matrix" in res.attrs["zero_matrix"] and res.attrs["base"]["fingerprint"]


def test_layers_late_restricts(pair):
    b, r, tax, _, _ = pair
    for res in (weight_ranks(b, tax, "late"), delta_ranks(b, r, tax, "late", metrics=["erank", "intruders"])):
        assert list(res.coords["layer"]) == [4, 5]
        assert set(res["tensor_layer"]) == {4, 5}
        assert res.attrs["layers"] == [4, 5]


def test_bad_metric_in_api(pair):
    b, _, tax, _, _ = pair
    from graftkit.core.errors import GraftkitError

    with pytest.raises(GraftkitError, match="unknown metric"):
        weight_ranks(b, tax, metrics=["spectral_drift"])


def test_bf16_tensor(tmp_path):
    from graftkit.weights import save_model
    from planted import tiny_model

    m = tiny_model(hidden=32, layers=3).to(torch.bfloat16)
    folder = save_model(tmp_path / "bf", m, None, provenance={"producer": "test"}, force=True)
    c = open_checkpoint(folder)
    res = weight_ranks(c, c.taxonomy(), "late")
    assert set(res["tensor_dtype"]) == {"bfloat16"}
    t = c.read("model.layers.2.self_attn.q_proj.weight")
    i = _index(res)["model.layers.2.self_attn.q_proj.weight"]
    assert res["value"][i, 0] == pytest.approx(measures(t.float().numpy().astype(np.float64))["erank"], rel=1e-9)


def test_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()
    from planted import planted_pair

    planted_pair(tmp_path / "runs")
    res = runner.invoke(app, ["rank", "--layers", "late"])
    assert res.exit_code == 0, res.output
    assert "sft" in res.output and "rl" in res.output
    res = runner.invoke(app, ["rank", "--what", "delta", "--json", "--metric", "erank,intruders"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert list(data["models"]) == ["rl"]  # sft records no parent: skipped in delta mode
    rl = data["models"]["rl"]
    assert [r["layer"] for r in rl["layers"]] == list(range(6))
    assert rl["layers"][0]["erank"] is None and rl["layers"][5]["erank"] > 1
    assert rl["layers"][0]["averaged_over"] == "no moved tensors (0 of 7 matrices)"
    assert rl["layers"][5]["averaged_over"] == "all 7 matrices"
    assert rl["numerical_rank_tol_rule"].startswith("delta rule: eps(float32)")
    saved = read_result(rl["result_file"])
    assert saved.kind == "rank-delta"
    assert (tmp_path / "runs" / "results" / "rank-weights-sft-late.h5").is_file()
    # the principal-direction summary: per group, the means over the moved matrices of the stored values
    metrics = [str(m) for m in saved.coords["metric"]]
    v = np.asarray(saved["value"], dtype=np.float64)
    moved = v[:, metrics.index("frobenius_sq")] > 0
    groups = np.array([str(g) for g in saved["tensor_group"]])
    by_group = {r["group"]: r for r in rl["principal"]}
    assert set(by_group) == {*groups[moved], "all"}  # the planted pair moved attn, mlp and embed
    for g, row in by_group.items():
        rows = moved & ((groups == g) if g != "all" else True)
        assert row["matrices"] == int(rows.sum())
        for m in ("delta_energy_top8", "delta_energy_top8_chance", "delta_energy_top8_right",
                  "delta_energy_top8_right_chance", "subspace_overlap_top8"):
            assert row[m] == pytest.approx(v[rows, metrics.index(m)].mean(), rel=1e-12), (g, m)
    from graftkit.figures.rank import principal_directions

    fig = principal_directions([("rl", saved)])
    import plotly.io as pio

    from graftkit import figures

    assert pio.to_json(figures.principal_directions(saved, labels=["rl"])) == pio.to_json(fig)  # the notebook's
    left, right = (t for t in fig.data if t.type == "bar")
    assert list(left.y) == pytest.approx([100 * by_group["all"]["delta_energy_top8"]])
    assert list(right.y) == pytest.approx([100 * by_group["all"]["delta_energy_top8_right"]])
    shown = runner.invoke(app, ["rank", "--what", "delta"])
    assert shown.exit_code == 0, shown.output
    for row in rl["principal"]:  # each group's line shows its own values
        line = next(x for x in shown.stdout.splitlines() if x.strip("│ ").startswith(row["group"] + " ")
                    and f"{100 * row['delta_energy_top8']:.2f}%" in x)
        for key in ("delta_energy_top8_chance", "delta_energy_top8_right", "delta_energy_top8_right_chance"):
            assert f"{100 * row[key]:.2f}%" in line, (row, line)
        assert f"{row['subspace_overlap_top8']:.4f}" in line
    bad = runner.invoke(app, ["rank", "--metric", "nope"])
    assert bad.exit_code == 2 and "unknown metric 'nope'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    bad = runner.invoke(app, ["rank", "--layers", "7"])
    assert bad.exit_code == 2 and "outside" in bad.output


def test_cli_no_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    bad = CliRunner().invoke(app, ["rank"])
    assert bad.exit_code == 2 and "no checkpoints found" in bad.output


# -- a merged LoRA-style delta, stored in fp32 and in bf16: the delta rule's numerical rank -----------

PLANTED_LAYER, FULL_LAYER, R = 1, 2, 4
LOW_RANK = ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.v_proj.weight")
FULL_RANK = "model.layers.2.mlp.down_proj.weight"
#: (s of s·B@A, std of the dense delta) per storage dtype: RL moves fp32 weights by ~1e-4 of their size,
#: bf16 ones by enough to survive bf16 storage (~10%)
SCALE = {torch.float32: (2e-6, 1e-5), torch.bfloat16: (2e-3, 1e-2)}


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def lora_pair(request, tmp_path_factory):
    """A tiny Llama stored in ``dtype`` and its "RL" copy W_rl = fl(W + s·B@A) (rank R) in q_proj and v_proj
    of layer 1, plus a dense (full-rank) delta in layer 2's down_proj; every other tensor bitwise unchanged."""
    from graftkit.weights import save_model
    from models import tiny_model as arch_model

    dtype = request.param
    out = tmp_path_factory.mktemp(f"lora-{str(dtype).removeprefix('torch.')}")
    model = arch_model("llama").to(dtype)
    base = save_model(out / "base", model, None, provenance={"producer": "test"}, force=True)
    lora, dense = SCALE[dtype]
    g = torch.Generator().manual_seed(3)
    planted = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in LOW_RANK:
                B = torch.randn(p.shape[0], R, generator=g, dtype=torch.float64)
                A = torch.randn(R, p.shape[1], generator=g, dtype=torch.float64)
                planted[name] = lora * B @ A
            elif name == FULL_RANK:
                planted[name] = dense * torch.randn(p.shape, generator=g, dtype=torch.float64)
            else:
                continue
            p.copy_((p.double() + planted[name]).to(dtype))  # merged in float64, rounded once on storage
    rl = save_model(out / "rl", model, None, provenance={"producer": "test"}, inputs=[base], force=True)
    b, r = open_checkpoint(base), open_checkpoint(rl)
    return dtype, b, r, planted, delta_ranks(b, r, b.taxonomy())


def test_lora_delta_numerical_rank_is_the_planted_rank(lora_pair):
    from graftkit.rank.spectra import delta_matrix

    dtype, b, r, planted, res = lora_pair
    name = str(dtype).removeprefix("torch.")
    eps = torch.finfo(dtype).eps
    col = {m: k for k, m in enumerate(res.coords["metric"])}
    rule = res.attrs["numerical_rank_tol_rule"]
    assert rule.startswith(f"delta rule: eps({name})") and "max(|W_base|, |W_rl|)" in rule
    assert set(res["tensor_dtype"]) == {name}  # the storage dtype, though Δ is computed in float32
    for t, i in _index(res).items():
        W0, W1 = b.read(t), r.read(t)
        D = (W1.double() - W0.double()).numpy()
        S = np.maximum(np.abs(W0.double().numpy()), np.abs(W1.double().numpy()))
        ref = np.sqrt((S**2).sum(1)).max() + np.sqrt((S**2).sum(0)).max()
        assert res["tol_ref"][i] == pytest.approx(ref, rel=1e-12)
        assert res["tol"][i] == pytest.approx(eps * ref, rel=1e-12)
        rank = res["value"][i, col["numerical_rank"]]
        assert rank == int((np.linalg.svd(D, compute_uv=False) > eps * ref).sum())  # independent count
        old = measures(delta_matrix(W0, W1))["numerical_rank"]  # max(m, n)·eps32·σ₁(Δ): the old default
        if t in planted:
            assert np.linalg.svd(planted[t].numpy(), compute_uv=False)[min(R, min(D.shape)) - 1] > 4 * res["tol"][i]
            want = R if t in LOW_RANK else min(D.shape)
            assert rank == want and res["tensor_nonzero"][i]
            if t in LOW_RANK:
                assert old > 2 * R  # the storage rounding of W counted as rank
        else:
            assert not D.any() and rank == 0 and not res["tensor_nonzero"][i]


def test_lora_delta_layer_rows_average_one_set(lora_pair, tmp_path):
    from graftkit.rank.results import RankResult

    _, _, _, _, res = lora_pair
    metrics, groups = list(res.coords["metric"]), list(res.coords["group"])
    layers = list(res.coords["layer"])
    cell = lambda L, g: (layers.index(L), groups.index(g))  # noqa: E731
    nr = metrics.index("numerical_rank")
    i, j = cell(PLANTED_LAYER, "all")
    assert res["averaged_layer"][i, j] == "moved tensors 2 of 7: self_attn.q_proj.weight, self_attn.v_proj.weight"
    assert res["n_averaged_layer"][i, j] == 2 and res["count_layer"][i, j] == 7
    idx = _index(res)
    rows = res["value"][[idx[t] for t in LOW_RANK]]
    np.testing.assert_allclose(res["value_layer"][i, j], rows.mean(0), rtol=1e-12)  # erank, numerical rank, ...
    assert res["value_layer"][i, j, nr] == R
    assert res["averaged_layer"][cell(PLANTED_LAYER, "attn")] == ("moved tensors 2 of 4: self_attn.q_proj.weight, "
                                                                  "self_attn.v_proj.weight")
    assert res["averaged_layer"][cell(PLANTED_LAYER, "mlp")] == "no moved tensors (0 of 3 matrices)"
    assert np.isnan(res["value_layer"][cell(PLANTED_LAYER, "mlp")]).all()
    assert res["averaged_layer"][cell(0, "all")] == "no moved tensors (0 of 7 matrices)"
    assert np.isnan(res["value_layer"][cell(0, "all")]).all()  # numerical rank too: one set for every measure
    assert res["averaged_layer"][cell(FULL_LAYER, "all")] == "moved tensors 1 of 7: mlp.down_proj.weight"
    assert res["value_layer"][cell(FULL_LAYER, "all") + (nr,)] == 32
    for a, L in enumerate(layers):  # every cell: the plain mean of every metric over its nonzero matrices
        for c, g in enumerate(groups):
            member = (res["tensor_layer"] == L) & ((res["tensor_group"] == g) if g != "all" else True)
            chosen = member & res["tensor_nonzero"]
            want = res["value"][chosen].mean(0) if chosen.any() else np.full(len(metrics), np.nan)
            np.testing.assert_allclose(res["value_layer"][a, c], want, rtol=1e-12)
    view = RankResult.read(write_result(tmp_path / "d.h5", res))
    row = view.layer_rows(["erank", "numerical_rank"])[layers.index(PLANTED_LAYER)]
    assert row["numerical_rank"] == R and row["averaged_over"] == res["averaged_layer"][i, j]
    assert row["groups"]["attn"]["averaged_over"].startswith("moved tensors 2 of 4")


@pytest.mark.parametrize("what", ["delta", "weights"])
def test_rank_reports_progress_in_matrices(tmp_path, what):
    """One bar per model, advanced once per tensor by the matrices it is ranked as (a 3-D stack of experts by
    their number): its total and its final count are the matrices of the result."""
    from graftkit.rank.commands import RankConfig, run_rank
    from graftkit.weights import save_model
    from models import tiny_model as arch_model

    model = arch_model("qwen3_moe")
    sft = save_model(tmp_path / "sft", model, None, provenance={"producer": "test"}, force=True)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn(p.shape, generator=g))
    rl = save_model(tmp_path / "rl", model, None, provenance={"producer": "test"}, force=True)
    calls = []
    payload = run_rank(RankConfig(what=what, model=(rl,), base=sft if what == "delta" else None, run=tmp_path / "run"),
                       lambda *a: calls.append(a))
    res = read_result(payload["models"]["rl"]["result_file"])
    n = len(res.coords["tensor"])
    assert payload["models"]["rl"]["matrices"] == n
    assert {c[0] for c in calls} == {"rank rl"} and {(c[2], c[3]) for c in calls} == {(n, "matrices")}
    assert sum(c[1] for c in calls) == n
    sources = res["tensor_source"].tolist()
    assert sorted(c[1] for c in calls) == sorted(sources.count(t) for t in set(sources))  # one call per tensor
    assert res.attrs["expanded"] and max(c[1] for c in calls) == 4  # the experts of a stack: one step each
