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
