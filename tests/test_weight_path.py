"""graftkit trajectory: the geometry of a run's weight path from the Gram matrix of its deltas, checked against the
vectors themselves, and on planted runs whose answer is known (a straight line reads R² = 1)."""

from __future__ import annotations

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
from graftkit.graft.path import path_measures  # noqa: E402


def _direct(deltas: np.ndarray, steps) -> dict:
    """The measures computed on the vectors: a least-squares line through (0, 0) and (s_t, Δ_t)."""
    s = np.concatenate([[0.0], steps])
    X = np.vstack([np.zeros(deltas.shape[1]), deltas])
    A = np.stack([np.ones_like(s), s], 1)
    coef, *_ = np.linalg.lstsq(A, X, rcond=None)
    res = X - A @ coef
    tot = X - X.mean(0)
    u = np.diff(X, axis=0)
    cos = lambda a, b: a @ b / np.linalg.norm(a) / np.linalg.norm(b)  # noqa: E731
    end = coef[0] + coef[1] * s[-1]
    return {"r2": 1 - (res**2).sum() / (tot**2).sum(), "norm": np.linalg.norm(deltas, axis=1),
            "cos_to_final": np.array([cos(d, deltas[-1]) for d in deltas]),
            "update_cos": np.array([np.nan] + [cos(u[t], u[t - 1]) for t in range(1, len(u))]),
            "intercept_share": (coef[0] @ coef[0]) / (end @ end)}


@pytest.mark.parametrize("kind", ["line", "curve", "walk"])
def test_the_gram_measures_equal_the_measures_of_the_vectors(kind):
    rng = np.random.default_rng(1)
    steps = np.array([3.0, 5.0, 9.0, 12.0])
    v, w = rng.normal(size=(2, 400))
    deltas = {"line": np.outer(steps, v), "curve": np.outer(steps, v) + np.outer(steps**2, w) / 10,
              "walk": np.cumsum(rng.normal(size=(4, 400)), 0)}[kind]
    got, want = path_measures(deltas @ deltas.T, steps), _direct(deltas, steps)
    for key in ("norm", "cos_to_final", "update_cos"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
    assert got["r2"] == pytest.approx(want["r2"], abs=1e-9)
    assert got["intercept_share"] == pytest.approx(want["intercept_share"], abs=1e-9)
    if kind == "line":
        assert got["r2"] == pytest.approx(1.0) and got["intercept_share"] == pytest.approx(0.0, abs=1e-12)
        assert np.allclose(got["update_cos"][1:], 1) and got["r2_random_walk"] < 0.9
    else:
        assert got["r2"] < 1 - 1e-3


def test_a_random_walks_r2_is_its_baseline():
    """Independent isotropic updates in high dimension: the line's R² sits at r2_random_walk, not at 0."""
    rng = np.random.default_rng(2)
    steps = np.arange(1, 7, dtype=float)
    r2, base = [], []
    for _ in range(50):
        walk = np.cumsum(rng.normal(size=(6, 20_000)) * np.linspace(1, 2, 6)[:, None], 0)
        m = path_measures(walk @ walk.T, steps)
        r2.append(m["r2"]), base.append(m["r2_random_walk"])
    assert abs(np.mean(r2) - np.mean(base)) < 0.01 and 0.3 < np.mean(base) < 0.9


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A base and two runs of checkpoints at steps 2, 4, 6: one moving along a straight line (Δ_t = t/6 · Δ), as a
    trainer's output_dir; one turning (a second direction grows as t²), as a graftkit policy whose first steps lie in
    POLICY.checkpoints."""
    root = tmp_path_factory.mktemp("path")
    model = P.tiny_model("qwen3", 2)
    base = P.save_base(root / "base", model)
    g = torch.Generator().manual_seed(3)
    stored = P.stored_state(model, False)
    v = {n: 0.01 * torch.randn(t.shape, generator=g) for n, t in stored.items()}
    w = {n: 0.01 * torch.randn(t.shape, generator=g) for n, t in stored.items()}
    for t in (2, 4, 6):
        P.save_rl(root / "line" / f"checkpoint-{t}", P.apply_deltas(model, {n: t / 6 * v[n] for n in v}), base)
    policy = root / "turn"
    for t in (2, 4, 6):
        dest = policy if t == 6 else Path(str(policy) + ".checkpoints") / f"step-{t:06d}"
        P.save_rl(dest, P.apply_deltas(model, {n: t / 6 * v[n] + (t / 6) ** 2 * w[n] for n in v}), base)
    record = json.loads((policy / "graftkit.json").read_text())
    (policy / "graftkit.json").write_text(json.dumps({**record, "step": 6}))
    return {"base": base, "line": root / "line", "turn": policy}


def test_trajectory_of_a_straight_run_and_a_turning_one(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    cli = CliRunner()
    line = cli.invoke(app, ["trajectory", "--from", str(runs["line"]), "--json"])
    assert line.exit_code == 0, line.output
    j = json.loads(line.stdout)
    assert [r["step"] for r in j["steps"]] == [2, 4, 6]
    for g, m in j["groups"].items():  # every group moved along one line
        assert m["r2"] == pytest.approx(1.0, abs=1e-6), g
        assert m["intercept_share"] == pytest.approx(0.0, abs=1e-6), g
    assert all(r["cos_to_final"] == pytest.approx(1.0, abs=1e-6) for r in j["steps"])
    assert [r["update_cos"] for r in j["steps"]][1:] == pytest.approx([1.0, 1.0], abs=1e-6)
    norms = [r["norm"] for r in j["steps"]]
    assert norms == pytest.approx([norms[-1] / 3, 2 * norms[-1] / 3, norms[-1]], rel=1e-5)

    turn = cli.invoke(app, ["trajectory", "--from", str(runs["turn"]), "--json"])
    assert turn.exit_code == 0, turn.output
    t = json.loads(turn.stdout)
    assert [r["step"] for r in t["steps"]] == [2, 4, 6]  # the policy's checkpoints, then the policy at its step
    assert t["steps"][-1]["checkpoint"] == "turn"
    assert t["groups"]["all"]["r2"] < 0.99 and t["steps"][0]["cos_to_final"] < 0.99

    shown = cli.invoke(app, ["trajectory", "--from", str(runs["turn"])])
    assert shown.exit_code == 0, shown.output
    for r in t["steps"]:  # each step's row shows its own values
        row = next(x for x in shown.stdout.splitlines() if x.strip("│ ").startswith(f"{r['step']} "))
        assert f"{r['cos_to_final']:.3f}" in row and f"{r['norm']:.4g}" in row
    for g, m in t["groups"].items():
        row = next(x for x in shown.stdout.splitlines() if x.strip("│ ").startswith(g + " "))
        assert f"{m['r2']:.3f}" in row and f"{m['r2_random_walk']:.3f}" in row

    # the report draws the path from the result the command wrote
    from graftkit.figures.report import load_run, plan_report
    from graftkit.figures.anatomy import path_geometry
    from graftkit.results.store import read_result

    fig = path_geometry("turn", read_result(t["result_file"]))
    import plotly.io as pio

    from graftkit import figures

    assert pio.to_json(figures.path_geometry(t["result_file"], label="turn")) == pio.to_json(fig)  # the notebook's
    for also in (figures.movement_over_steps, figures.layer_movement_over_steps):
        assert also(t["result_file"]).data
    whole = next(tr for tr in fig.data if tr.name == "cos(Δ_t, Δ_T) all")
    assert list(whole.x) == [2, 4, 6] and list(whole.y) == pytest.approx([r["cos_to_final"] for r in t["steps"]])
    assert f"R² {t['groups']['all']['r2']:.3f}" in fig.layout.title.text
    panels = [pn.caption for sec in plan_report(load_run(tmp_path / "runs")) for pn in sec.panels]
    assert any(c.startswith("The shape of the weight path") for c in panels)

    bad = cli.invoke(app, ["trajectory", "--from", str(runs["line"]), "--seeds", "3", "--answer-format", "boxed"])
    assert bad.exit_code == 2 and "--seeds, --answer-format say how KL is measured, and no --tasks" in bad.stderr
    alone = cli.invoke(app, ["trajectory", "--from", str(runs["base"])])
    assert alone.exit_code == 2 and "no checkpoints of a run to follow" in alone.stderr, alone.output
    assert "--all-checkpoints" not in alone.stderr  # a flag trajectory does not have
