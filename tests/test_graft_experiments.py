"""Graft sweeps (expansion, executor, results), attribution against hand-computed values on planted
outcome tables, the double-dissociation verdicts, and `graftkit graft --sweep/--eval` end to end."""

from __future__ import annotations

import json
import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from graftkit.errors import GraftkitError  # noqa: E402
from graftkit.graft import attribution as A  # noqa: E402
from graftkit.graft.experiments import (  # noqa: E402
    BASE_LABEL,
    RL_LABEL,
    GraftExperiment,
    expand_sweep,
    one_experiment,
    sweep_result,
)
from graftkit.graft.plan import GraftSpec  # noqa: E402
from graftkit.stats import paired_bootstrap  # noqa: E402
from graftkit.weights import GROUPS  # noqa: E402

PRESENT = ("embed", "attn", "mlp", "norm", "lm_head")


# ------------------------------------------------------------------------------------- expansion


@pytest.mark.parametrize("kind, groups, count", [
    ("single", PRESENT, 5 + 2),
    ("single", ("attn", "mlp"), 2 + 2),
    ("loo", PRESENT, 5 + 2),                       # all-but-one of every group; the full set is RL
    ("loo", ("attn", "mlp", "norm"), 3 + 1 + 2),   # plus the full chosen set, which is not RL
    ("factorial", ("attn", "mlp", "norm"), 2 ** 3 + 1),  # ∅ is base; RL is extra
    ("factorial", PRESENT, 2 ** 5),                # ∅ is base, the full set is RL
    ("layers", ("attn", "mlp"), (2 + 1) * 4 + 2),
    ("layers", ("mlp",), 4 + 2),
    ("alpha", ("attn", "mlp"), 4 + 2),             # α = 0 is the base
])
def test_sweep_expansion_counts(kind, groups, count):
    exps = expand_sweep(kind, groups, PRESENT)
    assert len(exps) == count
    assert exps[0].label == BASE_LABEL and exps[0].role == "base" and exps[0].groups == ()
    assert exps[1].label == RL_LABEL and exps[1].role == "rl" and exps[1].groups == PRESENT
    assert len({e.label for e in exps}) == count
    # distinct configurations: no two experiments describe the same graft
    assert len({(frozenset(e.groups), e.layers, e.alpha) for e in exps}) == count
    for e in exps:  # frozen and serialisable
        assert GraftExperiment.from_dict(json.loads(json.dumps(e.as_dict()))) == e


def test_sweep_labels_and_specs():
    lay = {e.label: e for e in expand_sweep("layers", ("attn", "mlp"), PRESENT)}
    assert {"attn@late", "mlp@early", "attn+mlp@mid", "attn+mlp"} <= set(lay)
    assert lay["attn@late"].spec() == GraftSpec(("attn",), "late")
    alpha = {e.label: e for e in expand_sweep("alpha", ("mlp",), PRESENT, alphas=(0.5, 1.0))}
    assert set(alpha) == {BASE_LABEL, RL_LABEL, "mlp×0.5", "mlp"} and alpha["mlp×0.5"].alpha == 0.5
    rl = expand_sweep("single", ("attn",), PRESENT)[1]
    assert rl.spec().groups == GROUPS  # every group the model has, tied heads included
    fac = expand_sweep("factorial", ("attn", "mlp"), PRESENT, layers="late")
    assert {e.label for e in fac} == {BASE_LABEL, RL_LABEL, "attn@late", "mlp@late", "attn+mlp@late"}
    assert [e.label for e in one_experiment(GraftSpec(("mlp",), alpha=0.5), PRESENT)] == [BASE_LABEL, RL_LABEL, "mlp×0.5"]
    assert len(one_experiment(GraftSpec.parse("all"), PRESENT)) == 2


def test_sweep_errors():
    with pytest.raises(GraftkitError, match="at most 6 groups"):
        expand_sweep("factorial", GROUPS, GROUPS)
    with pytest.raises(GraftkitError, match="unknown sweep"):
        expand_sweep("grid", ("attn",), PRESENT)
    with pytest.raises(GraftkitError, match="vision.*no tensors"):
        expand_sweep("single", ("vision",), PRESENT)


# ----------------------------------------------------------------------------------- attribution


def _table(fn, groups, shape=(12, 10), seed=0):
    """outcomes[subset] = fn(subset, latent) over a shared random latent per episode."""
    rng = np.random.default_rng(seed)
    latent = rng.random(shape)
    return {frozenset(s): fn(frozenset(s), latent).astype(np.int8)
            for r in range(len(groups) + 1) for s in combinations(groups, r)}


def test_and_interaction_splits_shapley_equally():
    groups = ("attn", "mlp")
    out = _table(lambda s, z: (z < 0.6) & ({"attn", "mlp"} <= s), groups)
    p = out[frozenset(groups)].mean()  # v(attn+mlp); every other v is 0
    fa = A.attribute_factorial(out, groups, n_boot=2000)
    assert fa.shapley[:, 0] == pytest.approx([p / 2, p / 2], abs=1e-12)
    assert fa.main_effect[:, 0] == pytest.approx([p / 2, p / 2], abs=1e-12)
    assert fa.interaction[0, 1, 0] == pytest.approx(p, abs=1e-12) and fa.interaction[0, 1, 0] > 0
    assert np.isnan(fa.interaction[0, 0]).all() and fa.interaction[1, 0, 0] == fa.interaction[0, 1, 0]
    assert A.credible(fa.interaction[0, 1]) and all(A.credible(b) for b in fa.shapley)
    for b in (*fa.shapley, *fa.main_effect):
        assert b[1] <= b[0] <= b[2]


def test_additive_outcomes_have_no_interaction():
    groups = ("attn", "mlp", "embed")
    # disjoint episodes rescued by attn (z < 0.3) and by mlp (0.5 ≤ z < 0.6); embed does nothing
    out = _table(lambda s, z: (("attn" in s) & (z < 0.3)) | (("mlp" in s) & (z >= 0.5) & (z < 0.6)), groups)
    full = out[frozenset(groups)]
    u = out[frozenset({"attn"})].mean()
    w = out[frozenset({"mlp"})].mean()
    fa = A.attribute_factorial(out, groups, n_boot=1000)
    assert fa.main_effect[:, 0] == pytest.approx([u, w, 0.0], abs=1e-12)
    assert fa.shapley[:, 0] == pytest.approx([u, w, 0.0], abs=1e-12)
    off = fa.interaction[~np.eye(3, dtype=bool)][:, 0]
    assert off == pytest.approx(np.zeros(6), abs=1e-12)
    assert fa.total[0] == pytest.approx(full.mean() - 0.0, abs=1e-12)


def test_shapley_efficiency_and_hand_computed_three_group_values():
    groups = ("embed", "attn", "mlp")
    rng = np.random.default_rng(3)
    out = {frozenset(s): rng.integers(0, 2, (8, 6)).astype(np.int8)
           for r in range(4) for s in combinations(groups, r)}
    v = {s: x.mean() for s, x in out.items()}
    fa = A.attribute_factorial(out, groups, n_boot=500)
    assert fa.shapley[:, 0].sum() == pytest.approx(v[frozenset(groups)] - v[frozenset()], abs=1e-12)
    # hand-written Shapley value of attn over the 4 subsets of {embed, mlp}
    f = frozenset
    phi_attn = (1 / 3) * (v[f({"attn"})] - v[f()]) + (1 / 6) * (v[f({"embed", "attn"})] - v[f({"embed"})]) \
        + (1 / 6) * (v[f({"mlp", "attn"})] - v[f({"mlp"})]) + (1 / 3) * (v[f(groups)] - v[f({"embed", "mlp"})])
    assert fa.shapley[1, 0] == pytest.approx(phi_attn, abs=1e-12)
    me_mlp = 0.25 * sum(v[s | {"mlp"}] - v[s] for s in (f(), f({"embed"}), f({"attn"}), f({"embed", "attn"})))
    assert fa.main_effect[2, 0] == pytest.approx(me_mlp, abs=1e-12)
    i_ea = 0.5 * sum(v[s | {"embed", "attn"}] - v[s | {"embed"}] - v[s | {"attn"}] + v[s] for s in (f(), f({"mlp"})))
    assert fa.interaction[0, 1, 0] == pytest.approx(i_ea, abs=1e-12)


def test_contrast_interval_agrees_with_the_paired_bootstrap():
    """A two-configuration contrast b − a is the paired bootstrap of stats.py (same estimator)."""
    rng = np.random.default_rng(7)
    seed_effect = rng.normal(0, 0.15, (25, 1))
    a = (rng.random((25, 12)) < 0.55 + seed_effect).astype(np.int8)
    b = (rng.random((25, 12)) < 0.65 + seed_effect).astype(np.int8)
    ref = paired_bootstrap(a, b, n_boot=20_000)
    est, low, high = A.contrast_intervals({"a": a, "b": b}, {"d": {"b": 1.0, "a": -1.0}}, n_boot=20_000)["d"]
    assert est == pytest.approx(ref.diff, abs=1e-12)
    assert low == pytest.approx(ref.low, abs=0.01) and high == pytest.approx(ref.high, abs=0.01)


def test_missing_configuration_is_a_clear_error():
    out = {frozenset(): np.zeros((2, 2)), frozenset({"attn"}): np.ones((2, 2))}
    with pytest.raises(GraftkitError, match="attn,mlp"):
        A.attribute_factorial(out, ("attn", "mlp"), n_boot=10)


def _run(drop_group, groups, base_rate=0.8, seed=0):
    """A run whose change (success → 0) is carried by ``drop_group`` alone."""
    return _table(lambda s, z: (z < base_rate) & (drop_group not in s), groups, shape=(20, 8), seed=seed)


def test_double_dissociation_on_planted_tables():
    groups = ("embed", "attn", "mlp")
    a, b = _run("attn", groups), _run("mlp", groups)
    assert (a[frozenset()] == b[frozenset()]).all()  # one base
    for kind in ("single", "shapley"):
        d = A.dissociation(a, b, groups, kind=kind, n_boot=2000)
        assert d.verdict == ("neither", "A only", "B only") and d.double_dissociation
        assert d.effect[0, 1, 0] == pytest.approx(-a[frozenset()].mean(), abs=1e-12)
        assert d.effect[1, 1, 0] == 0 and d.effect[0, 2, 0] == 0
        assert d.difference[1, 0] == pytest.approx(d.effect[0, 1, 0] - d.effect[1, 1, 0], abs=1e-12)
        assert A.credible(d.difference[1]) and A.credible(d.difference[2]) and not A.credible(d.difference[0])
    # both runs carried by attn: 'both', no dissociation
    d = A.dissociation(a, _run("attn", groups), groups, n_boot=1000)
    assert d.verdict[1] == "both" and not d.double_dissociation


def test_sweep_result_schema_from_a_planted_factorial():
    groups = ("attn", "mlp")
    exps = expand_sweep("factorial", groups, groups)  # the model has only attn and mlp: full set is RL
    rng = np.random.default_rng(0)
    z = rng.random((2, 5, 3))  # [task, seed, episode]
    sets = {e.label: frozenset(e.groups) for e in exps}
    success = {label: ((z < 0.7) & ({"attn", "mlp"} <= s)).astype(np.int8) for label, s in sets.items()}
    res = sweep_result("factorial", exps, success, ["t1", "t2"], range(5), 3, groups, movement_share={"attn": 0.3})
    assert res.kind == "graft-sweep" and res.attrs["complete"]
    assert list(res.coords["bound"]) == ["estimate", "low", "high"]
    assert res["success"].shape == (4, 2, 5, 3) and res["success"].dtype == np.int8
    labels = list(res.coords["config"])
    assert labels == [BASE_LABEL, RL_LABEL, "attn", "mlp"]
    i = labels.index(RL_LABEL)
    p = (z < 0.7).mean()
    assert res["diff_vs_base"][i, 0] == pytest.approx(p) and res["diff_vs_rl"][i].tolist() == [0, 0, 0]
    assert res["verdict_vs_base"][i] == "credibly better" and res["config_groups"][i] == "attn,mlp"
    assert res["shapley"][:, 0] == pytest.approx([p / 2, p / 2])
    assert res["interaction"].shape == (2, 2, 3) and res["main_effect"].shape == (2, 3)
    assert res["group_effect"][:, 0] == pytest.approx(res["shapley"][:, 0])
    assert res["movement_share"].tolist() == [0.3, 0.0]
    # a partial sweep: no attribution yet, the pending configurations named
    part = sweep_result("factorial", exps, {k: success[k] for k in labels[:3]}, ["t1", "t2"], range(5), 3, groups)
    assert not part.attrs["complete"] and part.attrs["pending"] == ["mlp"] and "shapley" not in part.data
