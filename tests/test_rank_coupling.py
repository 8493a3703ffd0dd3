"""Rank–capability coupling: correlations with intervals, the both-directions test, and `graftkit couple`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.rank.commands import CoupleConfig, run_couple
from graftkit.rank.coupling import (
    ANTI_BOTH, BOTH_DIRECTIONS_RULE, NO_TRACK, TOO_FEW, TRACKS_BOTH, TRACKS_IMPROVED, both_directions, coupling,
    coupling_result, verdicts_from_intervals,
)
from graftkit.stats import BETTER, NO_CHANGE, WORSE
from graftkit.results.store import Result, read_result, write_result
from graftkit.weights import band_rule

runner = CliRunner()


# --------------------------------------------------------------------------------------------------
# independent references (no scipy): ranks by argsort with ties averaged by hand, Pearson by corrcoef


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def _spearman(x, y) -> float:
    return float(np.corrcoef(_avg_ranks(np.asarray(x)), _avg_ranks(np.asarray(y)))[0, 1])


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


# --------------------------------------------------------------------------------------------------
# coupling


def test_monotone_rank_gives_rho_one_and_values_match_references():
    rng = np.random.default_rng(1)
    s = rng.random(12)
    noise = rng.normal(size=12)
    R = np.stack([2 + 5 * s, np.exp(4 * s), -3 * s, noise, s + 0.3 * noise], axis=1)  # [run, layer]
    res = coupling(R, s, n_boot=2000, seed=3)
    c = res["corr_layer"]
    stats, bounds = list(res.coords["stat"]), list(res.coords["bound"])
    assert stats == ["spearman", "pearson"] and bounds == ["estimate", "low", "high"]
    # a strictly monotone function of success has ρ = ±1 in every resample: the interval collapses
    np.testing.assert_allclose(c[0, 0], [1, 1, 1], atol=1e-12)
    np.testing.assert_allclose(c[1, 0], [1, 1, 1], atol=1e-12)
    np.testing.assert_allclose(c[2, 0], [-1, -1, -1], atol=1e-12)
    assert c[1, 1, 0] < 0.99  # exp is monotone but not linear: Pearson r < 1
    for j in range(R.shape[1]):
        assert c[j, 0, 0] == pytest.approx(_spearman(R[:, j], s), abs=1e-12)
        assert c[j, 1, 0] == pytest.approx(np.corrcoef(R[:, j], s)[0, 1], abs=1e-12)
        for k in range(2):
            assert c[j, k, 1] <= c[j, k, 0] + 1e-12 and c[j, k, 0] <= c[j, k, 2] + 1e-12
    assert (res["n_layer"] == 12).all() and set(res["reason_layer"]) == {""}
    assert res.attrs["n_boot"] == 2000 and res.attrs["seed"] == 3 and "bootstrap" in res.attrs["interval"]


def test_ties_use_average_ranks():
    s = np.array([0.1, 0.2, 0.2, 0.5, 0.5, 0.5, 0.9])
    r = np.array([3.0, 1.0, 1.0, 2.0, 7.0, 7.0, 7.0])
    res = coupling(r[:, None], s, n_boot=200)
    assert res["corr_layer"][0, 0, 0] == pytest.approx(_spearman(r, s), abs=1e-12)


def test_independent_noise_intervals_cover_zero():
    rng = np.random.default_rng(7)
    s = rng.random(30)
    R = rng.normal(size=(30, 20))
    res = coupling(R, s, n_boot=1000)
    lo, hi = res["corr_layer"][:, :, 1], res["corr_layer"][:, :, 2]
    covers = (lo < 0) & (hi > 0)
    assert covers.mean() >= 0.85  # nominal 95%; 20 layers × 2 statistics
    # a real coupling does not cover zero at the same sample size
    strong = coupling((s + 0.1 * rng.normal(size=30))[:, None], s, n_boot=1000)["corr_layer"]
    assert (strong[0, :, 1] > 0.5).all()


def test_bands_are_means_of_their_layers():
    rng = np.random.default_rng(2)
    s = rng.random(9)
    R = rng.normal(size=(9, 6)) + s[:, None]
    R[0, 4] = np.nan  # a NaN layer is left out of the band mean
    res = coupling(R, s, n_boot=500, n_layers=6)
    assert list(res.coords["band"]) == ["early", "mid", "late"]  # 0–1, 2–3, 4–5
    late = np.where(np.isnan(R[:, 4]), R[:, 5], (R[:, 4] + R[:, 5]) / 2)
    np.testing.assert_allclose(res["rank_band"][:, 2], late)
    np.testing.assert_allclose(res["rank_band"][:, 0], R[:, :2].mean(1))
    assert res["corr_band"][2, 1, 0] == pytest.approx(np.corrcoef(late, s)[0, 1], abs=1e-12)
    assert res["n_layer"][4] == 8 and res["corr_layer"][4, 0, 0] == pytest.approx(_spearman(R[1:, 4], s[1:]))
    assert res.attrs["band_rule"] == band_rule(6)


def test_subset_of_layers_keeps_their_bands():
    s = np.linspace(0, 1, 5)
    res = coupling(np.stack([s, -s], 1), s, n_boot=100, layers=[6, 7], n_layers=8)
    assert list(res.coords["layer"]) == [6, 7] and list(res.coords["band"]) == ["late"]


def test_degenerate_inputs():
    with pytest.raises(GraftkitError, match="at least 3"):
        coupling(np.ones((2, 3)), [0.1, 0.2])
    with pytest.raises(GraftkitError, match="constant"):
        coupling(np.random.default_rng(0).random((5, 2)), np.full(5, 0.4))
    with pytest.raises(GraftkitError, match="success has shape"):
        coupling(np.ones((4, 2)), [0.1, 0.2, 0.3])
    s = np.array([0.1, 0.3, 0.5, 0.7])
    R = np.stack([np.full(4, 2.0), [np.nan, np.nan, 1.0, 2.0], s], 1)
    res = coupling(R, s, n_boot=100)
    assert np.isnan(res["corr_layer"][:2]).all()
    assert res["reason_layer"][0] == "rank is constant across runs"
    assert res["reason_layer"][1].startswith("2 run(s) with a finite rank")
    assert res["corr_layer"][2, 0, 0] == pytest.approx(1.0)
    assert "GraftkitError" in res.attrs["degenerate"]


def test_n_success_adds_wilson_intervals_and_is_checked():
    s = np.array([0.25, 0.5, 0.75, 1.0])
    res = coupling(np.stack([s], 1), s, n_success=np.array([4, 8, 4, 20]), n_boot=100)
    for i, (k, n) in enumerate([(1, 4), (4, 8), (3, 4), (20, 20)]):
        np.testing.assert_allclose(res["success_interval"][i, 1:], _wilson(k, n), rtol=1e-9)
    with pytest.raises(GraftkitError, match="whole number"):
        coupling(np.stack([s], 1), s, n_success=np.array([3, 8, 4, 20]))


# --------------------------------------------------------------------------------------------------
# both directions


def test_both_directions_hand_built_counts_and_verdicts():
    # 5 improved (Δsuccess > 0), 5 degraded (Δsuccess < 0), 2 with no credible change
    verdicts = [BETTER] * 5 + [WORSE] * 5 + [NO_CHANGE] * 2
    ds = np.array([0.2, 0.1, 0.3, 0.15, 0.25, -0.2, -0.1, -0.3, -0.15, -0.25, 0.01, -0.02])
    base_s, base = 0.5, np.full(6, 10.0)
    up = np.ones(12)
    sign_s = np.sign(ds)
    cols = {
        0: sign_s,                                      # tracks in both directions
        1: np.where(ds > 0, up, up),                     # rank rises for all: improvements only
        2: -sign_s,                                      # moves against success in both directions
        3: np.array([1, -1, 1, -1, 1, 1, -1, 1, -1, 1, 1, 1.0]),  # mixed
        4: np.where(np.arange(12) < 2, 0.0, sign_s),     # two ties (Δrank = 0) count as not agreeing
        5: np.where(np.arange(12) == 0, np.nan, sign_s),  # a NaN leaves the total
    }
    D = np.stack([cols[j] for j in range(6)], 1)
    res = both_directions(base + D, base_s + ds, base, base_s, verdicts, n_layers=6)
    agree, total = res["agree_layer"], res["total_layer"]
    assert list(res.coords["direction"]) == ["improved", "degraded"]
    np.testing.assert_array_equal(agree, [[5, 5], [5, 0], [0, 0], [3, 2], [3, 5], [4, 5]])
    np.testing.assert_array_equal(total, [[5, 5], [5, 5], [5, 5], [5, 5], [5, 5], [4, 5]])
    assert list(res["verdict_layer"]) == [TRACKS_BOTH, TRACKS_IMPROVED, ANTI_BOTH, NO_TRACK, "tracks degradations only",
                                          TRACKS_BOTH]
    for j in range(6):
        for d in range(2):
            np.testing.assert_allclose(res["frac_layer"][j, d, 1:], _wilson(int(agree[j, d]), int(total[j, d])),
                                       rtol=1e-9)
    assert res.attrs["n_excluded"] == 2 and res.attrs["excluded_runs"] == ["run10", "run11"]
    assert list(res["direction_run"][-3:]) == ["degraded", "excluded", "excluded"]
    assert res.attrs["rule"] == BOTH_DIRECTIONS_RULE
    np.testing.assert_allclose(res["delta_success"], ds, atol=1e-12)
    # bands: early = layers 0–1, mid 2–3, late 4–5 (band Δrank = band mean run − band mean SFT)
    np.testing.assert_allclose(res["delta_rank_band"][:, 0], D[:, :2].mean(1))


def test_both_directions_needs_both_groups():
    s = np.array([0.6, 0.7, 0.8, 0.9])
    res = both_directions(np.stack([s], 1), s, [0.5], 0.5, [BETTER] * 4)
    assert res["verdict_layer"][0] == TOO_FEW and res["total_layer"][0, 1] == 0
    assert np.isnan(res["frac_layer"][0, 1]).all()


def test_verdicts_from_intervals():
    assert verdicts_from_intervals([0.1, -0.3, -0.1], [0.3, -0.1, 0.2]) == [BETTER, WORSE, NO_CHANGE]


def test_coupling_result_joins_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    s = rng.random(6)
    R = rng.random((6, 3))
    c = coupling(R, s, n_boot=100, conventions={"metric": "erank"})
    b = both_directions(R, s, R[0], s[0], [BETTER, WORSE] * 3)
    res = coupling_result(c, b)
    assert res.kind == "coupling" and res.attrs["metric"] == "erank" and res.attrs["both_directions"]["rule"]
    back = read_result(write_result(tmp_path / "c.h5", res))
    np.testing.assert_array_equal(back["agree_layer"], b["agree_layer"])
    np.testing.assert_array_equal(back["corr_layer"], c["corr_layer"])
    assert list(back["verdict_layer"]) == list(b["verdict_layer"])


# --------------------------------------------------------------------------------------------------
# graftkit couple, end to end on synthetic result files

N_LAYERS, SEEDS, TASKS, EPISODES = 6, 10, 2, 5


def _ckpt(folder, base=None):
    folder.mkdir(parents=True)
    prov = {"producer": "test"} | ({"base_model": {"path": str(base.resolve())}} if base else {})
    (folder / "graftkit.json").write_text(json.dumps(prov))
    return {"path": str(folder.resolve()), "kind": "hf-folder", "sha256": "0" * 64}


def _eval_file(results, name, desc, success):
    coords = {"task": np.array(["click-button", "enter-text"], dtype=object), "seed": np.arange(SEEDS),
              "episode": np.arange(EPISODES), "sample": np.arange(1)}
    write_result(results / f"eval-{name}-greedy.h5",
                 Result("eval", coords, {"success": (("task", "seed", "episode", "sample"), success.astype(np.int8))},
                        {"model": desc, "decode": {"greedy": True}}))


def _rank_file(results, name, desc, erank):
    groups, metrics = ["attn", "mlp", "all"], ["erank", "stable_rank"]
    v = np.zeros((N_LAYERS, len(groups), len(metrics)))
    v[:, 2, 0] = erank
    v[:, :2, 0] = erank[:, None] + np.array([-1.0, 1.0])  # groups differ; "all" is what couple reads
    v[:, :, 1] = 7.0
    coords = {"layer": np.arange(N_LAYERS), "group": np.array(groups, dtype=object),
              "metric": np.array(metrics, dtype=object)}
    write_result(results / f"rank-weights-{name}.h5",
                 Result("rank-weights", coords, {"value_layer": (("layer", "group", "metric"), v)},
                        {"model": desc, "band_rule": band_rule(N_LAYERS), "layers": "all"}))


@pytest.fixture()
def grid(tmp_path):
    """An SFT and 8 RL runs: 4 credibly better, 4 credibly worse; late-layer erank follows success."""
    run = tmp_path / "run"
    results = run / "results"
    rng = np.random.default_rng(11)
    base_out = (rng.random((TASKS, SEEDS, EPISODES, 1)) < 0.5).astype(np.int8)
    sft = _ckpt(run / "sft")
    names, success = ["sft"], {"sft": base_out}
    for i, shift in enumerate([0.5, 0.6, 0.7, 0.8, -0.5, -0.6, -0.7, -0.8]):
        out = base_out.copy()
        flip = rng.random(out.shape) < abs(shift)
        out[flip] = 1 if shift > 0 else 0
        name = f"lr{i}"
        names.append(name)
        success[name] = out
    descs = {"sft": sft} | {n: _ckpt(run / n, run / "sft") for n in names[1:]}
    for n in names:
        rate = success[n].mean()
        erank = np.concatenate([rng.normal(20, 1, N_LAYERS - 2), [10 + 20 * rate, 5 + 8 * rate]])
        _eval_file(results, n, descs[n], success[n])
        _rank_file(results, n, descs[n], erank)
    return run, names, success


def test_couple_end_to_end(grid, monkeypatch, tmp_path):
    run, names, success = grid
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    r = runner.invoke(app, ["couple", str(run), "--json", "--n-boot", "500"])
    assert r.exit_code == 0, r.output
    p = json.loads(r.stdout)
    labels = [c["label"] for c in p["checkpoints"]]
    assert sorted(labels) == sorted(names)
    verdicts = {c["label"]: (c["vs_parent"] or {}).get("verdict") for c in p["checkpoints"]}
    assert verdicts == {"sft": None, **{f"lr{i}": BETTER for i in range(4)}, **{f"lr{i}": WORSE for i in range(4, 8)}}
    for c in p["checkpoints"]:
        assert c["success"] == pytest.approx(success[c["label"]].mean()) and c["episodes"] == TASKS * SEEDS * EPISODES
    late = [row for row in p["per_layer"] if row["layer"] >= 4]
    for row in late:
        assert row["spearman"]["estimate"] == pytest.approx(1.0) and row["band"] == "late"
        assert (row["improved"]["agree"], row["improved"]["total"]) == (4, 4)
        assert (row["degraded"]["agree"], row["degraded"]["total"]) == (4, 4)
        assert row["improved"]["low"] > 0.5 and row["verdict"] == TRACKS_BOTH  # 4/4: Wilson low 0.51
    # early layers are noise: their sign agreement is a coin flip, never "tracks in both directions"
    assert all(row["verdict"] != TRACKS_BOTH for row in p["per_layer"] if row["layer"] < 2)
    assert [b["band"] for b in p["per_band"]] == ["early", "mid", "late"]
    stored = read_result(p["result_file"])
    assert p["result_file"].endswith("results/coupling-weights-erank.h5") and stored.kind == "coupling"
    # the stored correlation is the pure function's on the same inputs
    R = stored["rank"]
    ref = coupling(R, stored["success"], level=0.95, n_boot=500, seed=0)
    np.testing.assert_allclose(stored["corr_layer"], ref["corr_layer"], equal_nan=True)
    assert stored.attrs["metric"] == "erank" and stored.attrs["what"] == "weights"
    assert stored.attrs["both_directions"]["n_improved"] == 4
    i_sft = list(stored.coords["run"]).index("sft")
    assert stored["direction_run"][i_sft] == "no parent" and np.isnan(stored["delta_rank"][i_sft]).all()
    # progress: one step per layer and band correlated
    calls = []
    run_couple(CoupleConfig(run=run, n_boot=50, save=tmp_path / "c.h5"), lambda *a: calls.append(a))
    columns = len(p["per_layer"]) + len(p["per_band"])
    assert calls == [("couple erank", 1, columns, "layers and bands")] * columns
    # the table prints too
    r = runner.invoke(app, ["couple", str(run), "--n-boot", "200", "--layers", "late", "--metric", "stable_rank"])
    assert r.exit_code == 0, r.output
    assert "Spearman" in r.stdout and "rank is constant across runs" in r.stdout
    assert (run / "results" / "coupling-weights-stable_rank.h5").is_file()


def test_couple_errors_name_missing_results(grid, monkeypatch, tmp_path):
    run, names, _ = grid
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    for n in names[2:]:
        (run / "results" / f"eval-{n}-greedy.h5").unlink()
    (run / "results" / "rank-weights-lr0.h5").unlink()
    r = runner.invoke(app, ["couple", str(run)])
    assert r.exit_code == 2
    msg = r.output.replace("\n", "")
    assert "1 checkpoint(s)" in msg and "rank-weights-lr1.h5" in msg and "graftkit eval --model" in msg
    assert "eval-lr0-greedy.h5" in msg and "graftkit rank --model" in msg and "Traceback" not in r.output
    r = runner.invoke(app, ["couple", str(run), "--what", "delta"])
    assert r.exit_code == 2 and "weights or activations" in r.output


# --------------------------------------------------------------------------------------------------
# the fast paths the WeightWatcher benchmark relies on (rank/spectra.py Gram, rank/weights.py threads)


def test_tiled_blocked_gram_matches_svd(monkeypatch):
    import torch

    from graftkit.rank import spectra

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many tiny products: spare them OpenMP's barriers on a busy shared machine
    try:
        _check_tiled_gram(monkeypatch, spectra, torch)
    finally:
        torch.set_num_threads(threads)


def _check_tiled_gram(monkeypatch, spectra, torch):
    monkeypatch.setattr(spectra, "GRAM_BLOCK_ELEMENTS", 200 * 150)  # a few row blocks
    monkeypatch.setattr(spectra, "GRAM_TILE_MIN_WORK", 0)  # tiles even for small matrices
    monkeypatch.setattr(spectra, "GRAM_TILES", 3)
    monkeypatch.setattr(spectra, "GRAM_MIN_TILE", 16)
    rng = np.random.default_rng(5)
    for shape in [(400, 150), (150, 400), (300, 40)]:  # tall, wide (Gram of W Wᵀ), uneven last tile
        W = rng.normal(size=shape) * np.logspace(0, -4, shape[1])  # spread spectrum
        ref = np.linalg.svd(W, compute_uv=False)
        np.testing.assert_allclose(spectra.singular_values(W), ref, rtol=1e-9, atol=1e-12 * ref[0])
        Wt = torch.tensor(W, dtype=torch.float32)
        ref32 = np.linalg.svd(Wt.double().numpy(), compute_uv=False)
        np.testing.assert_allclose(spectra.singular_values(Wt), ref32, rtol=1e-9, atol=1e-9 * ref32[0])
    bad = torch.ones(500, 80)
    bad[321, 7] = float("nan")
    with pytest.raises(GraftkitError, match="NaN or inf"):
        spectra.measures(bad)
    bad[321, 7] = float("inf")
    with pytest.raises(GraftkitError, match="NaN or inf"):
        spectra.spectrum(bad)
    huge = np.full((4, 3), 1e200)
    with pytest.raises(GraftkitError, match="overflows"):
        spectra.measures(huge)


def test_weight_ranks_threads_give_identical_values_and_restore_torch_threads(tmp_path):
    import torch

    from planted import planted_pair
    from graftkit.rank import weight_ranks
    from graftkit.weights import open_checkpoint

    sft, _ = planted_pair(tmp_path)
    ck = open_checkpoint(sft)
    tax = ck.taxonomy()
    before = torch.get_num_threads()
    seen = []
    one = weight_ranks(ck, tax, workers=1)
    three = weight_ranks(ck, tax, workers=3, on_tensor=lambda n, b: seen.append(n))
    assert torch.get_num_threads() == before and three.attrs["workers"] == 3
    np.testing.assert_array_equal(one["value"], three["value"])
    assert list(one.coords["tensor"]) == list(three.coords["tensor"])
    assert sorted(seen) == sorted({str(n) for n in three["tensor_source"]})
    with pytest.raises(GraftkitError, match="workers"):
        weight_ranks(ck, tax, workers=0)
