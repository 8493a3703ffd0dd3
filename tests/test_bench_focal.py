"""benchmarks/bench_focal.py: the verdicts on planted figures (both outcomes), the simulation against a
hand-written update, exact invariants of the measures, and the tail-miss formula against Monte Carlo."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("bench_focal", ROOT / "benchmarks" / "bench_focal.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_focal"] = mod
    spec.loader.exec_module(mod)
    return mod


bf = _load()
HW = 0.001  # planted interval half-width


def _arm(gamma: float, **curves: list[float]) -> dict:
    return {"gamma": gamma, "label": bf.arm_label(gamma),
            "measures": {k.replace("_at_", "@"): {"mean": v, "lo": [x - HW for x in v], "hi": [x + HW for x in v]}
                         for k, v in curves.items()}}


def _planted_reproduced() -> dict:
    # every claim holds by a clear margin; three steps so that the equal-correct-mass control interpolates
    grpo = _arm(0.0, correct_mass=[0.36, 0.90, 0.99], rare_correct_mass=[0.06, 0.01, 0.002],
                unsampled_correct_mass=[0.07, 0.01, 0.002], coverage_at_256=[0.99, 0.6, 0.35],
                pass_at_256=[0.90, 0.93, 0.95])
    focal = _arm(1.0, correct_mass=[0.36, 0.70, 0.93], rare_correct_mass=[0.06, 0.04, 0.02],
                 unsampled_correct_mass=[0.07, 0.03, 0.02], coverage_at_256=[0.99, 0.9, 0.7],
                 pass_at_256=[0.90, 0.95, 0.99])
    return {"arms": {"grpo": grpo, "focal_gamma1": focal},
            "tail_miss": {"N": [1, 2, 3, 4], "p": [0.0, 0.4, 0.5, 0.3]}}


def _planted_not_reproduced() -> dict:
    # every claim fails: monotone tail-miss curve, GRPO loses correct mass, focal no better than GRPO
    grpo = _arm(0.0, correct_mass=[0.36, 0.30, 0.20], rare_correct_mass=[0.06, 0.07, 0.08],
                unsampled_correct_mass=[0.07, 0.08, 0.09], coverage_at_256=[0.99, 0.9, 0.8],
                pass_at_256=[0.90, 0.93, 0.95])
    focal = _arm(1.0, correct_mass=[0.36, 0.35, 0.34], rare_correct_mass=[0.06, 0.05, 0.04],
                 unsampled_correct_mass=[0.07, 0.06, 0.05], coverage_at_256=[0.99, 0.8, 0.7],
                 pass_at_256=[0.90, 0.93, 0.95])
    return {"arms": {"grpo": grpo, "focal_gamma1": focal},
            "tail_miss": {"N": [1, 2, 3, 4], "p": [0.0, 0.1, 0.2, 0.3]}}


CLAIMS = ["paper: tail-miss probability is non-monotonic in N",
          "paper: unsampled-correct mass shrinks as total correct mass grows (GRPO)",
          "paper: GRPO concentrates on the common solution: rare-correct mass shrinks",
          "paper: focal keeps rare-correct mass GRPO loses [focal γ=1]",
          "paper: focal raises pass@256 over GRPO, as coverage@256 [focal γ=1]",
          "paper: focal raises pass@256 (any correct) over GRPO [focal γ=1]",
          "control: focal keeps more rare-correct mass at equal correct mass [focal γ=1]"]


def test_verdicts_all_reproduced_on_planted_figures():
    out = bf.verdicts(_planted_reproduced())
    assert [c for c, _, _ in out] == CLAIMS
    assert [ok for _, _, ok in out] == [True] * len(CLAIMS)
    assert "peak P(N=3) = 0.5000" in out[0][1]
    assert "GRPO 0.0020 [0.0010, 0.0030] vs focal γ=1 0.0200 [0.0190, 0.0210]" in out[3][1]


def test_verdicts_none_reproduced_on_planted_figures():
    out = bf.verdicts(_planted_not_reproduced())
    assert [c for c, _, _ in out] == CLAIMS
    assert [ok for _, _, ok in out] == [False] * len(CLAIMS)


@pytest.mark.parametrize("arm, key, step, value, flipped", [
    # overlaps GRPO's last [0.001, 0.003], and GRPO's 0.0073 at focal's last correct mass 0.93
    ("focal_gamma1", "rare_correct_mass", -1, 0.0035, {3, 6}),
    ("focal_gamma1", "coverage@256", -1, 0.351, {4}),
    ("focal_gamma1", "pass@256", -1, 0.951, {5}),
    ("grpo", "unsampled_correct_mass", -1, 0.0695, {1}),  # the last interval overlaps the first one
    ("grpo", "rare_correct_mass", 1, 0.05, {6}),  # GRPO at correct mass 0.93 now holds 0.034 > focal's 0.02
])
def test_verdicts_flip_exactly_the_claims_whose_intervals_stop_separating(arm, key, step, value, flipped):
    figures = _planted_reproduced()
    m = figures["arms"][arm]["measures"][key]
    m["mean"][step], m["lo"][step], m["hi"][step] = value, value - HW, value + HW
    got = [ok for _, _, ok in bf.verdicts(figures)]
    assert got == [i not in flipped for i in range(len(CLAIMS))]


def test_tail_miss_peak_at_the_last_n_is_monotonic():
    figures = _planted_reproduced()
    figures["tail_miss"]["p"] = [0.0, 0.4, 0.5, 0.5]  # never falls
    assert bf.verdicts(figures)[0][2] is False


def test_matched_correct_mass_interpolates_in_the_step():
    matched = bf.matched_correct_mass(_planted_reproduced())
    assert matched["correct_mass"] == pytest.approx(0.93)
    g = matched["arms"]["grpo"]  # crosses 0.93 a third of the way from step 1 (0.90) to step 2 (0.99)
    assert g["step"] == pytest.approx(4 / 3)
    assert g["mean"] == pytest.approx(0.01 + (0.002 - 0.01) / 3)
    assert g["lo"] == pytest.approx(g["mean"] - HW) and g["hi"] == pytest.approx(g["mean"] + HW)
    f = matched["arms"]["focal_gamma1"]
    assert f["step"] == pytest.approx(2.0) and f["mean"] == pytest.approx(0.02)


# ------------------------------------------------------------------------------------- the simulation


def _reference(theta0: torch.Tensor, correct: list[bool], lr: float, gamma: float, steps: int, seed: int,
               n: int) -> torch.Tensor:
    """The update written out per run and per answer, with the GRPO advantage by hand."""
    gen = torch.Generator().manual_seed(seed)
    theta = theta0.clone()
    runs, m_answers = theta.shape
    for _ in range(steps):
        pi = theta.softmax(-1)
        answers = torch.multinomial(pi, n, replacement=True, generator=gen)  # the simulation's call
        new = theta.clone()
        for r in range(runs):
            a = [int(x) for x in answers[r]]
            rewards = [1.0 if correct[x] else 0.0 for x in a]
            mean = sum(rewards) / n
            std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / (n - 1))
            adv = [0.0] * n if std <= 1e-8 else [(x - mean) / (std + 1e-4) for x in rewards]
            w = (1.0 - mean) ** gamma
            for j in range(m_answers):
                grad = sum(adv[i] * ((1.0 if a[i] == j else 0.0) - float(pi[r, j])) for i in range(n)) / n
                new[r, j] = theta[r, j] + lr * w * grad
        theta = new
    return theta


@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0])
def test_simulation_equals_a_hand_written_update_for_two_steps(gamma):
    pi0 = bf.initial_policy()
    correct, rare = bf.answer_sets()
    runs, seed = 6, 3
    sim = bf.simulate(pi0, correct, rare, gamma=gamma, lr=0.2, runs=runs, steps=2, seed=seed)
    theta0 = pi0.log().expand(runs, -1).clone()
    want = _reference(theta0, correct.tolist(), 0.2, gamma, 2, seed, bf.GROUP_SIZE)
    assert not torch.allclose(want, theta0)  # some group had mixed rewards: the check has something to check
    torch.testing.assert_close(sim.theta, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(sim.curves["correct_mass"][-1], want.softmax(-1)[:, :4].sum(1), rtol=0, atol=1e-12)


def test_measures_of_a_small_run_keep_their_exact_invariants():
    pi0 = bf.initial_policy()
    correct, rare = bf.answer_sets()
    sim = bf.simulate(pi0, correct, rare, gamma=1.0, lr=0.5, runs=16, steps=20, seed=1)
    c = sim.curves
    K, tiny = bf.N_CORRECT, 1e-12
    assert c["correct_mass"].shape == (21, 16)
    for v in c.values():
        assert ((v >= 0) & (v <= 1)).all()
    assert (c["rare_correct_mass"] <= c["correct_mass"]).all()
    assert (c["unsampled_correct_mass"] <= c["correct_mass"]).all()
    torch.testing.assert_close(c["pass@1"], c["correct_mass"], rtol=0, atol=tiny)
    torch.testing.assert_close(c["coverage@1"], c["correct_mass"] / K, rtol=0, atol=tiny)
    for k in bf.PASS_KS:
        # E[#distinct correct]/K ≤ P(any correct) ≤ E[#distinct correct]
        assert (c[f"coverage@{k}"] <= c[f"pass@{k}"] + tiny).all()
        assert (c[f"pass@{k}"] / K <= c[f"coverage@{k}"] + tiny).all()
    for k0, k1 in zip(bf.PASS_KS, bf.PASS_KS[1:]):
        assert (c[f"pass@{k0}"] <= c[f"pass@{k1}"] + tiny).all()
        assert (c[f"coverage@{k0}"] <= c[f"coverage@{k1}"] + tiny).all()
    # row 0 is π₀: 0.30 + 3 × 0.02 correct, 0.06 rare; Σ_c π_c (1 − π_c)^8 by hand
    assert torch.allclose(c["correct_mass"][0], torch.tensor(0.36, dtype=torch.float64), atol=tiny)
    assert torch.allclose(c["rare_correct_mass"][0], torch.tensor(0.06, dtype=torch.float64), atol=tiny)
    want_u = 0.30 * 0.70 ** 8 + 3 * 0.02 * 0.98 ** 8
    assert torch.allclose(c["unsampled_correct_mass"][0], torch.tensor(want_u, dtype=torch.float64), atol=tiny)
    # the score e_a − π sums to 0 over answers, so every update keeps Σ_m θ_m
    torch.testing.assert_close(sim.theta.sum(-1), pi0.log().sum().expand(16), rtol=0, atol=1e-9)


def test_tail_miss_formula_and_unsampled_mass_agree_with_monte_carlo():
    pi0 = bf.initial_policy()
    correct, rare = bf.answer_sets()
    assert bf.tail_miss_probability(pi0, correct, rare, 1) == pytest.approx(0.0, abs=1e-15)
    assert bf.tail_miss_probability(pi0, correct, rare, 2) == pytest.approx(2 * 0.30 * 0.64)  # 2 q_c q_w
    n_groups, N = 40_000, 8
    gen = torch.Generator().manual_seed(0)
    a = torch.multinomial(pi0.expand(n_groups, -1), N, replacement=True, generator=gen)  # [G, N]
    r = correct[a]
    miss = (r.any(1) & ~r.all(1) & ~rare[a].any(1)).double()
    p = bf.tail_miss_probability(pi0, correct, rare, N)
    assert abs(miss.mean().item() - p) <= 4 * math.sqrt(p * (1 - p) / n_groups)
    present = torch.nn.functional.one_hot(a, pi0.numel()).any(1)  # [G, M]
    unsampled = (pi0 * (correct & ~present)).sum(1)  # mass of the correct answers absent from the group
    want = bf.policy_measures(pi0[None], correct, rare, N)["unsampled_correct_mass"].item()
    assert abs(unsampled.mean().item() - want) <= 4 * unsampled.std().item() / math.sqrt(n_groups)


def test_main_prints_the_table_and_verdicts_and_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "focal.json"
    assert bf.main(["--runs", "4", "--steps", "3", "--lr", "0.3", "--seed", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    fig = json.loads(out.read_text())
    assert set(fig["arms"]) == {"grpo", "focal_gamma1", "focal_gamma2"}
    assert len(fig["arms"]["grpo"]["measures"]["correct_mass"]["mean"]) == 4
    assert fig["tail_miss"]["N"] == list(range(1, 65))
    assert len(fig["verdicts"]) == 1 + 2 + 2 * 4
    assert [v["claim"] for v in fig["verdicts"]] == [c for c, _, _ in bf.verdicts(fig)]
    for v in fig["verdicts"]:
        assert f"{v['claim']} — measured: {v['measured']}: {'reproduced' if v['reproduced'] else 'not reproduced'}" \
            in text
    assert "64.1 (GRPO) → 70.3 (GRPO + focal); this simulation does not measure it" in text
    assert "focal γ=2       3" in text  # the last step is a table row even when it is not one of 0/50/100/200
    with pytest.raises(SystemExit):
        bf.main(["--runs", "1"])


def test_planted_figures_are_not_modified_by_verdicts():
    figures = _planted_reproduced()
    before = copy.deepcopy(figures)
    bf.verdicts(figures)
    assert figures == before
