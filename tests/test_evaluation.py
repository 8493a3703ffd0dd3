"""The eval/headroom result views round-trip, and the seed/episode fold matches a hand-written reference."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from graftkit.agent.evaluate import EvalOutcome
from graftkit.agent.rollout import Decode
from graftkit.core.errors import GraftkitError
from graftkit.evaluation.commands import EvalConfig, EvalResult, HeadroomConfig, HeadroomResult
from graftkit.stats import fold_episodes
from graftkit.results.store import read_result, write_result


def _outcome(tasks, seeds, episodes, samples, rng, decode=Decode(greedy=True)):
    shape = (len(tasks), seeds, episodes, samples)
    return EvalOutcome(list(tasks), list(range(seeds)), episodes, samples, decode, rng.random(shape) < 0.5,
                       rng.random(shape), rng.integers(1, 5, shape).astype(np.int32), np.zeros(shape, np.int32), 1.5)


def _same(a, b) -> None:
    assert type(a) is type(b)
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def test_fold_against_a_hand_written_reference():
    x = np.arange(3 * 4 * 2).reshape(3, 4, 2)  # [task, seed, episode]
    want = np.array([[x[t, s, e] for t in (2, 0) for e in range(2)] for s in range(4)])
    assert np.array_equal(fold_episodes(x, [2, 0]), want)
    every = np.array([[x[t, s, e] for t in range(3) for e in range(2)] for s in range(4)])
    assert np.array_equal(fold_episodes(x), every)
    assert np.array_equal(fold_episodes(x[..., None]), every)  # a trailing sample axis folds like episodes


def test_eval_result_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    cfg = EvalConfig(model=tmp_path / "m", tasks="click-button,focus-text", seeds=3, episodes=2)
    view = EvalResult.from_outcome(_outcome(["click-button", "focus-text"], 3, 2, 1, rng), {"path": "/x/m"}, cfg)
    assert view.success.dtype == np.int8 and view.label == "m" and view.attrs["config"] == cfg.as_dict()
    _same(EvalResult.from_result(view.to_result()), view)
    back = EvalResult.from_result(read_result(write_result(tmp_path / "e.h5", view.to_result())))
    for name in ("success", "reward", "turns", "invalid", "seeds"):
        assert np.array_equal(getattr(back, name), getattr(view, name))
    assert back.tasks == view.tasks and back.model_path == "/x/m" and back.decode["greedy"] is True
    assert np.array_equal(view.outcomes(["focus-text"]), view.success[1, :, :, 0])


def test_headroom_result_round_trip_and_pairs():
    rng = np.random.default_rng(1)
    tasks = ["click-button"]
    greedy = _outcome(tasks, 2, 2, 1, rng)
    sampled = _outcome(tasks, 2, 2, 3, rng, Decode(greedy=False))
    view = HeadroomResult.from_outcomes(greedy, sampled, {"path": "/x/sft"}, k=3)
    _same(HeadroomResult.from_result(view.to_result()), view)
    assert view.k == 3 and view.to_result().dims("greedy_success") == ("task", "seed", "episode", "greedy_sample")
    g, s = view.pairs()
    assert np.array_equal(g["click-button"], np.repeat(greedy.success[0, :, :, 0], 3, axis=1))
    assert np.array_equal(s["click-button"], sampled.success[0].reshape(2, -1))
    assert view.table().tasks == tuple(tasks)


def test_configs_validate_with_the_flags_messages(tmp_path):
    with pytest.raises(GraftkitError, match="--k 1 must be ≥ 2"):
        HeadroomConfig(model=tmp_path, k=1)
    with pytest.raises(GraftkitError, match="--seeds 0 must be ≥ 1"):
        EvalConfig(model=tmp_path, seeds=0)
    with pytest.raises(GraftkitError, match="unknown --obs 'pixels'"):
        EvalConfig(model=tmp_path, obs="pixels")
    assert HeadroomConfig(model=tmp_path).tasks == "all" and EvalConfig(model=tmp_path).tasks == "mastered"
