"""benchmarks/bench_variants.py: the verdicts on planted figures (both outcomes and their boundaries), the
pure figures against hand-computed values, and one tiny real run that writes every figure at equal samples."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_variants", ROOT / "benchmarks" / "bench_variants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_variants"] = mod
    spec.loader.exec_module(mod)
    return mod


bv = _load()


def _cmp(a: float, b: float, lo: float, hi: float, verdict: str) -> dict:
    return {"rate_a": a, "rate_b": b, "diff": b - a, "bootstrap": [lo, hi], "bayes": [lo, hi], "mcnemar_p": 0.5,
            "verdict": verdict, "n": 200, "level": 0.95}


def _iv(diff: float, lo: float, hi: float) -> dict:
    return {"diff": diff, "low": lo, "high": hi}


def _planted(reproduced: bool) -> dict:
    """Figures on which every claim holds (``reproduced``) or every claim fails, each by a clear margin."""
    mu = {"arms": {"on_policy": {"seconds": [4.0, 4.2, 4.4]}, "staged": {"seconds": [2.0, 2.1, 2.2]}},
          "speedup": 2.0, "generation_share_on_policy": 0.7, "episodes": 1280,
          "comparison": _cmp(0.60, 0.62, -0.05, 0.09, "no credible change")}
    vg = {"arms": {"plain": {"zero_std_share": 0.8}, "verigate": {"none_share": 0.1, "zero_std_share": 0.8}},
          "comparison": _cmp(0.10, 0.20, 0.04, 0.16, "credibly better")}
    fo = {"ks": [1, 2, 4, 8],
          "arms": {"grpo": {"label": "GRPO", "distinct_correct": 1.5, "pass@8": 0.80},
                   "focal_gamma1": {"label": "focal γ=1", "distinct_correct": 2.0, "pass@8": 0.90}},
          "comparisons": {"focal_gamma1": {"distinct_correct": _iv(0.5, 0.3, 0.7), "pass@8": _iv(0.1, 0.05, 0.15)}}}
    if not reproduced:
        mu["arms"]["staged"]["seconds"] = [4.0, 4.1, 4.2]
        mu["speedup"] = 1.02
        mu["comparison"] = _cmp(0.60, 0.40, -0.30, -0.10, "credibly worse")
        vg["arms"]["verigate"]["none_share"] = 0.7
        vg["comparison"] = _cmp(0.10, 0.09, -0.05, 0.03, "no credible change")
        fo["arms"]["focal_gamma1"].update(distinct_correct=1.4, **{"pass@8": 0.80})
        fo["comparisons"]["focal_gamma1"] = {"distinct_correct": _iv(-0.1, -0.3, 0.1), "pass@8": _iv(0.0, -0.05, 0.05)}
    return {"mu_grpo": mu, "verigate": vg, "focal": fo}


CLAIMS = ["paper: Mu-GRPO ≈ 2× faster in wall-clock at equal samples",
          "paper: Mu-GRPO matches or exceeds GRPO (held-out greedy success)",
          "paper: VeriGate substantially reduces zero-gradient groups",
          "paper: VeriGate improves accuracy (≈ +20% relative at 1.5B)",
          "paper: focal keeps more distinct correct answers per item than GRPO [focal γ=1]",
          "paper: focal reaches a higher pass@8 than GRPO [focal γ=1]"]


def test_verdicts_all_reproduced_on_planted_figures():
    out = bv.verdicts(_planted(True))
    assert [c for c, _, _ in out] == CLAIMS
    assert [ok for _, _, ok in out] == [True] * 6
    assert out[0][1] == ("2.00× (median of paired repetitions; on-policy 4.20 s / staged 2.10 s, 1280 completions each; generation 70% of the "
                         "on-policy loop)")
    assert "0.800 without (frac_reward_zero_std) → 0.100 with" in out[2][1]
    assert "plain 0.100 → VeriGate 0.200 (+100% relative), diff +0.100 bootstrap [+0.040, +0.160]" in out[3][1]
    assert out[4][1] == "GRPO 1.500 vs focal γ=1 2.000, diff +0.500 [+0.300, +0.700]"


def test_verdicts_none_reproduced_on_planted_figures():
    out = bv.verdicts(_planted(False))
    assert [c for c, _, _ in out] == CLAIMS
    assert [ok for _, _, ok in out] == [False] * 6
    assert "credibly worse" in out[1][1]


@pytest.mark.parametrize("edit, flipped", [
    (lambda f: f["mu_grpo"].update(speedup=1.5), set()),  # the threshold itself is reproduced
    (lambda f: f["mu_grpo"].update(speedup=1.49), {0}),
    # staged credibly better is still "matches or exceeds"; only "credibly worse" fails it
    (lambda f: f["mu_grpo"].update(comparison=_cmp(0.5, 0.7, 0.1, 0.3, "credibly better")), set()),
    (lambda f: f["mu_grpo"].update(comparison=_cmp(0.5, 0.3, -0.3, -0.1, "credibly worse")), {1}),
    (lambda f: f["verigate"]["arms"]["verigate"].update(none_share=0.4), set()),  # exactly half of 0.8
    (lambda f: f["verigate"]["arms"]["verigate"].update(none_share=0.41), {2}),
    (lambda f: f["verigate"]["arms"]["plain"].update(zero_std_share=0.0), {2}),  # nothing to reduce
    (lambda f: f["verigate"].update(comparison=_cmp(0.1, 0.2, -0.01, 0.2, "no credible change")), {3}),
    (lambda f: f["focal"]["comparisons"]["focal_gamma1"].update(distinct_correct=_iv(0.2, 0.0, 0.4)), {4}),
    (lambda f: f["focal"]["comparisons"]["focal_gamma1"].update(**{"pass@8": _iv(0.1, 1e-9, 0.2)}), set()),
])
def test_each_verdict_flips_on_its_own_rule(edit, flipped):
    figures = _planted(True)
    edit(figures)
    assert [ok for _, _, ok in bv.verdicts(figures)] == [i not in flipped for i in range(6)]


def test_verigate_relative_change_with_a_zero_baseline_is_named():
    figures = _planted(True)
    figures["verigate"]["comparison"] = _cmp(0.0, 0.1, 0.02, 0.2, "credibly better")
    measured = bv.verigate_verdicts(figures["verigate"])[1][1]
    assert "relative change undefined (plain 0)" in measured


def test_focal_verdicts_cover_every_gamma_arm_in_order():
    figures = _planted(True)
    fo = figures["focal"]
    fo["arms"]["focal_gamma2"] = {"label": "focal γ=2", "distinct_correct": 1.0, "pass@8": 0.7}
    fo["comparisons"]["focal_gamma2"] = {"distinct_correct": _iv(-0.5, -0.7, -0.3), "pass@8": _iv(-0.1, -0.2, 0.0)}
    out = bv.focal_verdicts(fo)
    assert [c.rsplit("[", 1)[1] for c, _, _ in out] == ["focal γ=1]"] * 2 + ["focal γ=2]"] * 2
    assert [ok for _, _, ok in out] == [True, True, False, False]


def test_verdicts_do_not_modify_the_figures():
    figures = _planted(True)
    before = copy.deepcopy(figures)
    bv.verdicts(figures)
    assert figures == before


# ------------------------------------------------------------------------------------------ pure figures


LOG = [{"seconds": 1.0, "gen_seconds": 0.6, "episodes": 16},
       {"seconds": 1.5, "gen_seconds": 0.0, "episodes": 16},
       {"seconds": 2.5, "gen_seconds": 0.9, "episodes": 16}]


def test_log_figures():
    assert bv.training_seconds(LOG) == 2.5
    assert bv.generation_share(LOG) == pytest.approx(1.5 / 2.5)
    assert bv.sampled_completions(LOG) == 48
    assert bv.log_mean(LOG, "gen_seconds") == pytest.approx(0.5)


def test_pass_at_k_per_item_is_the_unbiased_estimator():
    correct = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], bool)
    # 1 − C(n − c, k) / C(n, k) by hand
    np.testing.assert_allclose(bv.pass_at_k_per_item(correct, 1), [0.5, 0.0, 1.0, 0.25])
    np.testing.assert_allclose(bv.pass_at_k_per_item(correct, 2), [1 - 1 / 6, 0.0, 1.0, 1 - 3 / 6])
    np.testing.assert_allclose(bv.pass_at_k_per_item(correct, 4), [1.0, 0.0, 1.0, 1.0])


def test_distinct_correct_counts_distinct_answers_of_correct_samples_only():
    answers = np.array([["12", "12", "15", ""], ["", "", "", ""], ["9", "18", "27", "9"]], object)
    correct = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 1]], bool)
    np.testing.assert_array_equal(bv.distinct_correct(answers, correct), [2.0, 0.0, 2.0])


def test_paired_mean_interval_exact_cases():
    a = np.array([0.0, 1.0, 0.5, 0.25, 1.0, 0.0])
    clusters = np.array([0, 0, 1, 1, 2, 2])
    same = bv.paired_mean_interval(a, a, clusters)
    assert (same["diff"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    shifted = bv.paired_mean_interval(a, a + 0.5, clusters)
    assert shifted["diff"] == pytest.approx(0.5)
    assert shifted["low"] == pytest.approx(0.5) and shifted["high"] == pytest.approx(0.5)
    assert (shifted["n_items"], shifted["n_clusters"]) == (6, 3)


def test_paired_mean_interval_resamples_clusters_not_items():
    # cluster differences 0 and 1 (sizes 1 and 3): every resample's Σd/Σn is one of 0, 3/4, 1, so the
    # interval spans exactly from 0 to 1 and the estimate is the item mean 3/4
    a = np.zeros(4)
    b = np.array([0.0, 1.0, 1.0, 1.0])
    got = bv.paired_mean_interval(a, b, np.array(["x", "y", "y", "y"]), n_boot=4000, seed=1)
    assert got["diff"] == pytest.approx(0.75)
    assert (got["low"], got["high"]) == (0.0, 1.0)
    again = bv.paired_mean_interval(a, b, np.array(["x", "y", "y", "y"]), n_boot=4000, seed=1)
    assert again == got
    with pytest.raises(ValueError):
        bv.paired_mean_interval(a, b[:3], np.array(["x", "y", "y"]))


def test_config_hash_is_stable_and_sensitive():
    base = {"steps": 10, "budgets": {"multiples": 5}}
    assert bv.config_hash(base) == bv.config_hash({"budgets": {"multiples": 5}, "steps": 10})
    assert bv.config_hash(base) != bv.config_hash({**base, "steps": 11})
    assert len(bv.config_hash(base)) == 12 and int(bv.config_hash(base), 16) >= 0


# ------------------------------------------------------------------------------------------ a tiny real run


TINY = replace(bv.Setting(), sft_steps=20, mu_steps=2, stages=1, repeats=1, verigate_steps=2, verigate_prompts=2,
               focal_steps=2, focal_prompts=2, gammas=(1.0,), eval_seeds=2, eval_episodes=3, samples=4, ks=(1, 2, 4))


@pytest.mark.slow
def test_tiny_run_writes_every_figure_at_equal_samples(tmp_path, capsys):
    returned = bv.run(TINY, tmp_path, None, tmp_path / "out" / "variants_results.json")
    fig = json.loads((tmp_path / "out" / "variants_results.json").read_text())
    assert fig["verdicts"] == returned["verdicts"] and fig["setting"]["mu_steps"] == 2
    assert set(fig) >= {"setting", "paper", "sft", "mu_grpo", "verigate", "focal", "verdicts", "seconds"}
    assert set(fig["sft"]["greedy"]) == {"multiples", "arithmetic-2"}
    assert all(r["n"] == 6 for r in fig["sft"]["greedy"].values())
    mu = fig["mu_grpo"]
    for key in ("speedup", "speedup_repeats", "generation_share_on_policy", "episodes", "equal_samples", "comparison"):
        assert key in mu
    assert 0 < mu["generation_share_on_policy"] < 1 and mu["speedup"] > 0
    import statistics

    on, staged = mu["arms"]["on_policy"]["seconds"], mu["arms"]["staged"]["seconds"]
    assert mu["speedup_repeats"] == [a / b for a, b in zip(on, staged)]
    assert mu["speedup"] == statistics.median(mu["speedup_repeats"])  # paired repetitions, not a ratio of medians
    assert mu["arms"]["staged"]["max_staleness"] == 1 and mu["arms"]["on_policy"]["max_staleness"] == 0
    # the invariant, counted from the logs themselves: both arms consumed the same sampled completions
    runs = tmp_path / "variants"
    counts = {arm: bv.sampled_completions([json.loads(x) for x in (runs / f"mu-{arm}" / "train_log.jsonl")
                                           .read_text().splitlines()]) for arm in ("on_policy", "staged")}
    assert counts == {"on_policy": 2 * 2 * 8, "staged": 2 * 2 * 8}
    assert mu["equal_samples"] is True and mu["episodes"] == 32
    vg = fig["verigate"]["arms"]
    assert set(vg["plain"]) >= {"zero_std_share", "greedy"}
    assert set(vg["verigate"]) >= {"none_share", "process_share", "outcome_share", "zero_std_share", "greedy"}
    assert vg["verigate"]["none_share"] + vg["verigate"]["process_share"] + vg["verigate"]["outcome_share"] \
        == pytest.approx(1.0)
    fo = fig["focal"]
    assert list(fo["arms"]) == ["sft", "grpo", "focal_gamma1"]
    for arm in fo["arms"].values():
        assert set(arm) >= {"pass@1", "pass@2", "pass@4", "distinct_correct", "label"}
        assert arm["pass@1"] <= arm["pass@2"] <= arm["pass@4"] <= 1
        assert 0 <= arm["distinct_correct"] <= 4
    assert set(fo["comparisons"]["focal_gamma1"]) == {"distinct_correct", "pass@4"}
    assert [(v["claim"], v["measured"], v["reproduced"]) for v in fig["verdicts"]] == bv.verdicts(fig)
    assert len(fig["verdicts"]) == 6
    text = capsys.readouterr().out
    assert bv.render(fig) in text
    for v in fig["verdicts"]:
        assert f"{v['claim']} — measured: {v['measured']}: {'reproduced' if v['reproduced'] else 'not reproduced'}" \
            in text
    # the SFT policy is cached under its config's hash and reused
    path, cached, h = bv.sft_policy(TINY, tmp_path)
    assert cached and path == Path(fig["sft"]["path"]) and path.name == f"variants-sft-{h}"
    assert fig["seconds"] > 0


def test_main_refuses_a_policy_that_is_no_model_folder(tmp_path):
    with pytest.raises(SystemExit):
        bv.main(["--policy", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        bv.main(["--repeats", "0"])
