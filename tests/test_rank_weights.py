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
from graftkit.store import read_result, write_result
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
    assert res.attrs["model"]["sha256"] and res.attrs["method"] == "gram-eigvalsh-fp64"
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
    assert "zero matrix" in res.attrs["zero_matrix"] and res.attrs["base"]["sha256"]


def test_layers_late_restricts(pair):
    b, r, tax, _, _ = pair
    for res in (weight_ranks(b, tax, "late"), delta_ranks(b, r, tax, "late", metrics=["erank", "intruders"])):
        assert list(res.coords["layer"]) == [4, 5]
        assert set(res["tensor_layer"]) == {4, 5}
        assert res.attrs["layers"] == [4, 5]


def test_bad_metric_in_api(pair):
    b, _, tax, _, _ = pair
    from graftkit.errors import GraftkitError

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

    planted_pair(tmp_path / "runs" / "demo")
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
    saved = read_result(rl["result_file"])
    assert saved.kind == "rank-delta"
    assert (tmp_path / "runs" / "demo" / "results" / "rank-weights-sft-late.h5").is_file()
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
