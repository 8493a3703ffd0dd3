"""Graft sweeps (expansion, executor, results), attribution against hand-computed values on planted
outcome tables, the double-dissociation verdicts, and `graftkit graft --sweep/--eval` end to end."""

from __future__ import annotations

import json
import re
import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from graftkit.core.errors import GraftkitError  # noqa: E402
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


@pytest.mark.parametrize("fields, error", [
    (dict(groups="attn", out_dir="g"), None),
    (dict(sweep="single", out_dir="g"), "--out applies to an export, not to --sweep"),
    (dict(groups="attn", tasks="all"), "--tasks applies to --eval, --sweep and --vs, not to an export"),
    (dict(groups="attn", executor="ray"), "--executor applies to --eval, --sweep and --vs, not to an export"),
    (dict(eval_=True, groups="attn", max_shard_size="1GB"), "--max-shard-size applies to an export, not to --eval"),
    (dict(sweep="single", alpha=0.5), "--alpha applies to an export and --eval, not to --sweep"),
    (dict(sweep="single", alphas="0,1"), "--alphas applies to --sweep alpha"),
    (dict(sweep="alpha", alphas="0,1"), None),
    (dict(sweep="layers", layers="late"), "--sweep layers grafts each band"),
    (dict(sweep="single", reverse=True), "--reverse applies to one graft"),
    (dict(sweep="layers", vs="rl2"), "--vs needs --sweep single, loo or factorial"),
    (dict(eval_=True, groups="attn", seeds=3, executor="ray", workers=2), None),
])
def test_graft_config_modes_refuse_what_they_would_ignore(fields, error):
    from graftkit.graft.commands import GraftConfig

    if error is None:
        GraftConfig(rl=Path("rl"), **fields)
        return
    with pytest.raises(GraftkitError, match=re.escape(error)):
        GraftConfig(rl=Path("rl"), **fields)


def test_units_split_each_configuration_into_seed_blocks_per_worker():
    from graftkit.graft.experiments import SweepUnit, plan_units

    exps = expand_sweep("single", ("attn", "mlp"), PRESENT)
    serial = plan_units(exps, 5, 1, done={BASE_LABEL})
    assert [u.experiment.label for u in serial] == [RL_LABEL, "attn", "mlp"]
    assert {u.block for u in serial} == {(0, 1, 2, 3, 4)}  # one worker: each configuration whole
    three = plan_units(exps, 5, 3, run="B")
    assert [u.block for u in three[:3]] == [(0, 1), (2, 3), (4,)] and len(three) == 3 * len(exps)
    assert {u.run for u in three} == {"B"} and plan_units(exps, 2, 8)[:2] == [
        SweepUnit("A", exps[0], (0,)), SweepUnit("A", exps[0], (1,))]  # never more blocks than seeds


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
    assert res["diff_vs_base"][i, 0] == pytest.approx(p) and res["diff_vs_rl"][i, 0] == 0 and res["diff_vs_rl"][i, 1] < 0 < res["diff_vs_rl"][i, 2]
    assert res["verdict_vs_base"][i] == "credibly better" and res["config_groups"][i] == "attn,mlp"
    assert res["shapley"][:, 0] == pytest.approx([p / 2, p / 2])
    assert res["interaction"].shape == (2, 2, 3) and res["main_effect"].shape == (2, 3)
    assert res["group_effect"][:, 0] == pytest.approx(res["shapley"][:, 0])
    assert res["movement_share"].tolist() == [0.3, 0.0]
    # a partial sweep: no attribution yet, the pending configurations named
    part = sweep_result("factorial", exps, {k: success[k] for k in labels[:3]}, ["t1", "t2"], range(5), 3, groups)
    assert not part.attrs["complete"] and part.attrs["pending"] == ["mlp"] and "shapley" not in part.data


# ------------------------------------------------------------------------- executor and CLI, end to end

TASKS = ["click-button", "focus-text"]


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A tiny SFT policy and two RL children: one moved in attention, one in the MLP (planted)."""
    from conftest import planted_policies

    return planted_policies(tmp_path_factory.mktemp("policies"))


@pytest.mark.slow
def test_run_sweep_plays_what_separately_loaded_models_play(policies, tmp_path):
    """Each in-place graft plays exactly the episodes (actions, outcomes) of the same graft exported and
    loaded on its own; the base model is itself again afterwards."""
    from graftkit.agent import Decode, evaluate, load_policy
    from graftkit.graft import export_graft, plan_graft, run_graft_sweep as run_sweep
    from graftkit.weights import open_checkpoint

    base, rl = open_checkpoint(policies["sft"]), open_checkpoint(policies["rl"])
    exps = expand_sweep("single", ("attn", "mlp"), ("embed", "attn", "mlp", "norm", "lm_head"))
    decode = Decode(max_new_tokens=4)
    policy = load_policy(policies["sft"])
    before = {n: t.clone() for n, t in policy.model.state_dict().items()}
    played: dict[str, list] = {}
    current = {}
    got = run_sweep(exps, policy, base, rl, TASKS[:1], [0, 1], 2, decode,
                    on_start=lambda e: current.update(label=e.label),
                    on_episode=lambda ep: played.setdefault(current["label"], []).append(ep))
    assert list(got) == [e.label for e in exps] and all(s.shape == (1, 2, 2) for s in got.values())
    for n, t in policy.model.state_dict().items():
        assert torch_equal(t, before[n]), n

    def actions(eps):
        return sorted((e.task, e.seed, tuple(t.action for t in e.turns), e.success) for e in eps)

    tax = base.taxonomy()
    for e in exps:
        folder = export_graft(base, rl, plan_graft(tax, e.spec()), tmp_path / f"g{len(e.label)}", force=True)
        eps: list = []
        alone = evaluate(load_policy(folder), TASKS[:1], [0, 1], 2, decode, on_episode=eps.append)
        assert actions(played[e.label]) == actions(eps), e.label
        assert (alone.success[..., 0] == got[e.label]).all()
    # the planted attention delta changes what the policy does; the (unmoved) MLP graft does not
    assert actions(played["attn"]) != actions(played[BASE_LABEL])
    assert actions(played["mlp"]) == actions(played[BASE_LABEL])
    # resuming: configurations already done are not played again
    played.clear()
    again = run_sweep(exps, policy, base, rl, TASKS[:1], [0, 1], 2, decode, done={k: got[k] for k in list(got)[:3]},
                      on_start=lambda e: current.update(label=e.label),
                      on_episode=lambda ep: played.setdefault(current["label"], []).append(ep))
    assert set(played) == {e.label for e in exps[3:]}
    assert all((again[k] == got[k]).all() for k in got)


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def _cli(args, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from graftkit.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_sweep_dry_run_json_lists_the_specs_and_writes_nothing(policies, tmp_path, monkeypatch):
    r = _cli(["graft", "--from", policies["rl"], "--sweep", "single", "--dry-run", "--json"], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["dry_run"] and j["sweep"] == "single" and j["count"] == 5 + 2
    assert [e["label"] for e in j["experiments"]] == [BASE_LABEL, RL_LABEL, "embed", "attn", "mlp", "norm", "lm_head"]
    assert [GraftExperiment.from_dict(e) for e in j["experiments"]] == expand_sweep(
        "single", j["groups"], ("embed", "attn", "mlp", "norm", "lm_head"))
    assert not (tmp_path / "runs").exists()
    t = _cli(["graft", "--from", policies["rl"], "--sweep", "factorial", "--groups", "attn,mlp", "--dry-run"],
             tmp_path, monkeypatch)
    assert t.exit_code == 0 and "attn+mlp" in t.stdout and "5 configurations" in t.stdout
    bad = _cli(["graft", "--from", policies["rl"], "--sweep", "grid", "--dry-run"], tmp_path, monkeypatch)
    assert bad.exit_code == 2 and "unknown --sweep" in bad.stderr
    bad = _cli(["graft", "--from", policies["rl"], "--sweep", "layers", "--vs", policies["rl2"], "--dry-run"],
               tmp_path, monkeypatch)
    assert bad.exit_code == 2 and "--vs needs" in bad.stderr


@pytest.mark.slow
def test_cli_sweep_eval_end_to_end_with_dissociation_and_resume(policies, tmp_path, monkeypatch):
    from graftkit.results.store import read_result

    args = ["graft", "--from", policies["rl"], "--sweep", "single", "--groups", "attn,mlp", "--tasks", ",".join(TASKS),
            "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4", "--vs", policies["rl2"], "--json"]
    r = _cli(args, tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    res = read_result(j["files"]["A"])
    assert res.kind == "graft-sweep" and res.attrs["sweep"] == "single" and res.attrs["complete"]
    assert list(res.coords["config"]) == [BASE_LABEL, RL_LABEL, "attn", "mlp"]
    assert res.dims("success") == ("config", "task", "seed", "episode") and res["success"].shape == (4, 2, 2, 1)
    assert res["success"].dtype == np.int8 and list(res.coords["bound"]) == ["estimate", "low", "high"]
    for name, dims in (("diff_vs_base", ("config", "bound")), ("diff_vs_rl", ("config", "bound")),
                       ("verdict_vs_base", ("config",)), ("config_groups", ("config",)), ("config_alpha", ("config",)),
                       ("config_layers", ("config",)), ("movement_share", ("group",)), ("group_effect", ("group", "bound"))):
        assert res.dims(name) == dims, name
    assert list(res.coords["group"]) == ["attn", "mlp"]
    # the planted RL moved attention only: all of its movement is there
    assert res["movement_share"].tolist() == pytest.approx([1.0, 0.0])
    assert res["diff_vs_base"][0, 0] == 0 and res["diff_vs_base"][0, 1] < 0 < res["diff_vs_base"][0, 2] and res["verdict_vs_base"][0] == "no credible change"
    assert res.attrs["rl"]["fingerprint"] and res.attrs["decode"]["max_new_tokens"] == 4
    res_b = read_result(j["files"]["B"])
    assert (res_b["success"][0] == res["success"][0]).all()  # one base, shared
    assert res_b["movement_share"].tolist() == pytest.approx([0.0, 1.0])
    dis = read_result(j["files"]["dissociation"])
    assert dis.kind == "graft-dissociation" and list(dis.coords["run"]) == ["A", "B"]
    assert dis["effect"].shape == (2, 2, 3) and dis["difference"].shape == (2, 3) and dis["verdict"].shape == (2,)
    assert dis.attrs["runs"]["A"]["path"] == str(policies["rl"]) and dis.attrs["effect"] == "single"
    # the same command again resumes: every configuration is taken from the stored results
    again = _cli(args, tmp_path, monkeypatch)
    assert again.exit_code == 0, again.output
    j2 = json.loads(again.stdout)
    assert j2["resumed"]["A"] == sorted(res.coords["config"]) and j2["runs"] == j["runs"]
    # --eval of one graft, table form
    one = _cli(["graft", "--from", policies["rl"], "--eval", "--groups", "attn", "--layers", "mid", "--tasks",
                TASKS[0], "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4"], tmp_path, monkeypatch)
    assert one.exit_code == 0, one.output
    assert "attn@mid" in one.stdout and "verdict vs base" in one.stdout
    stored = read_result(tmp_path / "runs" / "results" / "graft-eval-rl.h5")
    assert list(stored.coords["config"]) == [BASE_LABEL, RL_LABEL, "attn@mid"]
