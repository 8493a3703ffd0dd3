"""The typed views of rank results: RankResult (weights/delta and activations layouts) and CouplingResult."""

from __future__ import annotations

import numpy as np
import pytest

from graftkit.core.errors import GraftkitError
from graftkit.rank import weight_ranks
from graftkit.rank.commands import CoupleConfig, RankConfig, run_couple
from graftkit.rank.coupling import CouplingResult, both_directions, coupling, coupling_result
from graftkit.rank.results import RankResult
from graftkit.stats import compare
from graftkit.results.store import Result, read_result, write_result
from graftkit.weights import open_checkpoint
from planted import planted_pair
from test_rank_coupling import grid  # noqa: F401  (the fixture)


def _same(a: Result, b: Result) -> None:
    assert a.kind == b.kind and sorted(a.data) == sorted(b.data)
    for name in a.data:
        assert a.dims(name) == b.dims(name)
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def _activations() -> Result:
    layers = np.arange(5)
    value = np.arange(5 * 3, dtype=np.float64).reshape(5, 3) / 7
    return Result("rank-activations", {"layer": layers, "metric": np.array(["erank", "stable_rank", "rankme"],
                                                                              dtype=object)},
                  {"value": (("layer", "metric"), value), "block": (("layer",), layers - 1),
                   "n_tokens": (("layer",), np.full(5, 12))}, {"model": {"path": "/x/sft"}})


def test_weights_layout_round_trip_and_layer_values(tmp_path):
    sft, _ = planted_pair(tmp_path / "pair")
    ck = open_checkpoint(sft)
    res = weight_ranks(ck, ck.taxonomy(), "all")
    view = RankResult.read(write_result(tmp_path / "r.h5", res))
    _same(view.to_result(), res)
    groups = list(res.coords["group"])
    for m in view.metrics:
        np.testing.assert_array_equal(view.layer_values(m), res["value_layer"][:, groups.index("all"),
                                                                               list(res.coords["metric"]).index(m)])
    assert view.layer_ids == list(range(ck.taxonomy().n_layers["decoder"])) and view.n_layers == len(view.layer_ids)
    layers, table = view.table()
    np.testing.assert_array_equal(table, res["value_layer"][:, groups.index("all"), :])
    rows = view.layer_rows(["erank"])
    assert [r["layer"] for r in rows] == list(layers) and rows[0]["erank"] == table[0, 0]
    over = view.averaged_over()
    assert over == [[str(x) for x in row] for row in res["averaged_layer"]]
    assert rows[0]["averaged_over"] == over[0][-1] == f"all {res['count_layer'][0, -1]} matrices"
    assert all(g["averaged_over"].startswith("all ") for g in rows[0]["groups"].values())
    assert {o["tensor"] for o in view.outside_rows(["erank"])} == {
        str(n) for n, L in zip(res.coords["tensor"], res["tensor_layer"]) if L < 0}
    with pytest.raises(GraftkitError, match="no per-layer 'nope'"):
        view.layer_values("nope")


def test_activations_layout_round_trip_and_layer_values(tmp_path):
    res = _activations()
    view = RankResult.read(write_result(tmp_path / "a.h5", res))
    _same(view.to_result(), res)
    assert view.layer_ids == [0, 1, 2, 3] and view.n_layers == 4 and view.model_path == "/x/sft"
    np.testing.assert_array_equal(view.layer_values("stable_rank"), res["value"][1:, 1])
    layers, table = view.table()
    np.testing.assert_array_equal(layers, np.arange(5))
    np.testing.assert_array_equal(table, res["value"])
    assert view.layer_rows(["rankme"])[0] == {"layer": 0, "block": None, "n_tokens": 12, "rankme": res["value"][0, 2]}
    assert view.averaged_over() is None


def test_rank_config_validates_like_the_command():
    assert RankConfig(what="delta").shown == ["erank", "stable_rank", "spectral_drift", "intruders"]
    assert RankConfig(layers="0,2").tag == "-0+2"
    with pytest.raises(GraftkitError, match="pair measures need --what delta"):
        RankConfig(metric="intruders")
    with pytest.raises(GraftkitError, match="--tokens 'x' is not an option"):
        RankConfig(what="activations", tokens="x")
    RankConfig(what="weights", tokens="x")  # activation-only options are not checked for weights


def test_coupling_view_round_trip_and_rows(grid, tmp_path):  # noqa: F811
    run, names, _ = grid
    p = run_couple(CoupleConfig(run=run, n_boot=200))
    stored = read_result(p["result_file"])
    view = CouplingResult.read(p["result_file"])
    _same(view.to_result(), stored)
    assert view.has_both and view.runs == sorted(names)
    assert [r["layer"] for r in view.rows("layer")] == view.layers
    np.testing.assert_array_equal(view.corr("band"), stored["corr_band"])
    assert view.rows("band")[0]["verdict"] == str(stored["verdict_band"][0])


def test_fixed_reference_matches_a_direct_assembly(grid, tmp_path):  # noqa: F811
    """CoupleConfig.reference (the study's form): every run, in the given order, against one checkpoint."""
    run, names, success = grid
    order = ["sft"] + names[1:][::-1]
    cfg = CoupleConfig(run=run, n_boot=200, models=tuple(run / n for n in order), reference=run / "sft",
                       save=tmp_path / "c.h5")
    got = read_result(run_couple(cfg)["result_file"])
    R = np.stack([RankResult.read(run / "results" / f"rank-weights-{n}.h5").layer_values("erank") for n in order])
    out = {n: success[n].transpose(1, 0, 2, 3).reshape(success[n].shape[1], -1) for n in order}
    s = np.array([out[n].mean() for n in order])
    ns = np.array([out[n].size for n in order], dtype=np.int64)
    layers = list(range(R.shape[1]))
    corr = coupling(R, s, ns, n_boot=200, runs=order, layers=layers, n_layers=R.shape[1])
    verdicts = ["reference (SFT)"] + [compare(out["sft"], out[n]).verdict for n in order[1:]]
    both = both_directions(R, s, R[0], s[0], verdicts, runs=order, layers=layers, n_layers=R.shape[1])
    want = coupling_result(corr, both)
    _same(got, want)
    assert list(got.coords["run"]) == order
