"""graftkit forgetting: which of KL, ‖Δ‖, moved entries and Δ's rank predicts forgetting across runs — the fit and its
intervals on planted data whose answer is known, and the command on a run folder of planted results."""

from __future__ import annotations

import numpy as np
import pytest

from graftkit.graft.forgetting import best_predictor, r2_and_spearman


def test_a_planted_predictor_wins_with_a_credible_lead():
    """Forgetting is a linear function of the first predictor plus small noise, the others are unrelated: the first
    has R² near 1 with a tight interval, is named best, and leads every other credibly."""
    rng = np.random.default_rng(0)
    n = 12
    kl = rng.uniform(0, 1, n)
    x = np.column_stack([kl, rng.uniform(0, 1, n), rng.uniform(0, 1, n), rng.uniform(0, 1, n)])
    y = -0.4 * kl + 0.01 * rng.normal(size=n)
    fit, boot = r2_and_spearman(x, y, 0.95, 2000, 0)
    assert fit[0, 0, 0] > 0.98 and fit[0, 0, 1] > 0.9
    assert fit[0, 1, 0] < -0.9  # Spearman ρ: more KL, more forgetting (a more negative change)
    best, lead = best_predictor(fit, boot, 0.95)
    assert best == 0 and lead[0].tolist() == [0.0, 0.0, 0.0]
    assert all(lead[j, 1] > 0 for j in (1, 2, 3)), lead  # credible: the interval of the difference lies above 0


def test_r2_is_pearsons_squared_and_undefined_fits_say_so():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 2))
    y = rng.normal(size=8)
    x[:, 1] = 3.0  # a constant predictor: no fit
    fit, boot = r2_and_spearman(x, y, 0.9, 500, 0)
    assert fit[0, 0, 0] == pytest.approx(np.corrcoef(x[:, 0], y)[0, 1] ** 2)
    assert fit[0, 0, 1] <= fit[0, 0, 0] <= fit[0, 0, 2]
    assert np.isnan(fit[1]).all() and np.isnan(boot[:, 1]).all()
    best, lead = best_predictor(fit, boot, 0.9)
    assert best == 0 and np.isnan(lead[1]).all()
    none, _ = best_predictor(np.full((2, 2, 3), np.nan), np.full((10, 2), np.nan), 0.9)
    assert none is None


def _planted_rows(n: int = 6) -> list[dict]:
    """Runs whose forgetting is −0.5·KL exactly; the last lacks its rank (left out of the fits)."""
    rng = np.random.default_rng(2)
    rows = []
    for i in range(n):
        kl = float(rng.uniform(0.01, 0.2))
        f = -0.5 * kl
        rows.append({"key": f"/runs/r{i}", "parent": "/runs/sft", "trained": ["click-tab"],
                     "untrained": ["click-button", "focus-text"], "forgetting": (f, f - 0.05, f + 0.05),
                     "values": {"kl": kl, "fro_delta": float(rng.uniform(1, 2)), "moved": float(rng.uniform(0.5, 1)),
                                "erank_delta": float("nan") if i == n - 1 else float(rng.uniform(3, 9))}})
    return rows


def test_the_result_fits_the_runs_with_every_predictor_and_the_figure_shows_them(tmp_path):
    """forgetting_result fits each predictor on the runs that have all four (a run without its rank is listed,
    hollow, and left out), names the planted one best; the report's figure draws each run's stored values."""
    from graftkit.figures import kl as kl_figures
    from graftkit.graft.forgetting import PREDICTORS, ForgettingConfig, ForgettingResult, forgetting_result
    from graftkit.results.store import read_result, write_result

    rows = _planted_rows()
    labels = [f"r{i}" for i in range(len(rows))]
    res = forgetting_result(rows, labels, ForgettingConfig(n_boot=500), tmp_path, ["r5: no erank_delta"])
    v = ForgettingResult(read_result(write_result(tmp_path / "forgetting.h5", res)), tmp_path / "forgetting.h5")
    assert v.attrs["best"] == "kl" and list(v.result["fitted"]) == [1, 1, 1, 1, 1, 0]
    x = np.array([[r["values"][p] for p in PREDICTORS] for r in rows])
    y = np.array([r["forgetting"][0] for r in rows])
    for fit in v.fits():
        j = list(PREDICTORS).index(fit["predictor"])
        assert fit["runs"] == 5
        assert fit["r2"][0] == pytest.approx(np.corrcoef(x[:5, j], y[:5])[0, 1] ** 2)
    assert v.fits()[0]["r2"][0] == pytest.approx(1.0)
    printed = v.tables()
    assert "left out: r5: no erank_delta" in printed and "(best: kl)" in printed[1].title
    runs, fits = printed[0], printed[1]
    for i, row in enumerate(runs.rows):  # every printed cell is the planted value it stands for
        cells = {h: c(row) for h, c in runs.columns.items()}
        f = rows[i]["forgetting"]
        assert cells["run"] == f"r{i}" and cells["trained on"] == "click-tab"
        assert cells["forgetting (points) [95%]"] == f"{100 * f[0]:+.1f} [{100 * f[1]:+.1f}, {100 * f[2]:+.1f}]"
        for j, p in enumerate(PREDICTORS):
            assert cells[p] == ("—" if np.isnan(x[i, j]) else f"{x[i, j]:.4g}"), (i, p)
    for row in fits.rows:
        j = list(PREDICTORS).index(row["predictor"])
        cells = {h: c(row) for h, c in fits.columns.items()}
        assert cells["predictor"] == PREDICTORS[row["predictor"]] and cells["runs"] == "5"
        assert cells["R² [95%]"].startswith(f"{np.corrcoef(x[:5, j], y[:5])[0, 1] ** 2:.3f} [")
    fig = kl_figures.forgetting(v.result)
    assert len(fig.data) == len(PREDICTORS)
    for trace, p in zip(fig.data, PREDICTORS):
        j = list(PREDICTORS).index(p)
        np.testing.assert_allclose(np.asarray(trace.x, dtype=float), x[:, j], equal_nan=True)
        np.testing.assert_allclose(np.asarray(trace.y, dtype=float), 100 * y)
        assert list(trace.marker.symbol) == ["circle"] * 5 + ["circle-open"]
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0] == "R² 1.000 [1.000, 1.000]", titles


def test_too_few_runs_is_one_line(tmp_path):
    from graftkit.core.errors import GraftkitError
    from graftkit.graft.forgetting import ForgettingConfig, forgetting_result, run_forgetting

    rows = _planted_rows(3)
    with pytest.raises(GraftkitError, match="the fit needs at least 3"):
        forgetting_result(rows, ["a", "b", "c"], ForgettingConfig(n_boot=100), tmp_path, ["c: no erank_delta"])
    (tmp_path / "results").mkdir()
    with pytest.raises(GraftkitError, match="0 RL run") as e:
        run_forgetting(ForgettingConfig(run=tmp_path))
    assert "graftkit eval" in str(e.value) and "\n" not in str(e.value)
