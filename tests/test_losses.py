"""GRPO-family losses and advantages against an independent re-derivation from the formulas.

The reference below is written from the formulas (train/losses.py's module docstring; TRL 1.16's
`_compute_loss`), in plain Python floats over rows and tokens, with every gradient derived by hand — it
never calls the implementation.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from graftkit.core.errors import GraftkitError
from graftkit.train.advantages import (focal_weight, group_advantages, scatter_token_advantages,
                                       verigate_advantages, veto_mask, veto_trigger)
from graftkit.train.losses import LOSSES, policy_loss

LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "cispo", "gspo", "gspo_token"]
EPS = {"grpo": (0.2, 0.28), "dr_grpo": (0.2, 0.28), "dapo": (0.2, 0.28), "cispo": (0.2, 1.3),
       "gspo": (0.05, 0.08), "gspo_token": (0.05, 0.08)}
MAX_LEN = 12


# ----------------------------------------------------------------------------------------------------
# the reference: loops over rows and tokens, floats, hand-derived gradients

def _surrogate(rho, a, lo, hi):
    """−min(ρa, clip(ρ, 1−lo, 1+hi)a) and its derivative in ρ."""
    clipped = min(max(rho, 1.0 - lo), 1.0 + hi)
    unclipped_val, clipped_val = rho * a, clipped * a
    val = -min(unclipped_val, clipped_val)
    if a == 0.0:
        return val, 0.0
    # the min picks ρa when it is the smaller; when equal, ρ lies inside the range and both branches
    # move together (derivative a); when the clipped branch is strictly smaller it is constant in ρ.
    d_rho = -a if unclipped_val <= clipped_val else 0.0
    return val, d_rho


def reference(kind, logp, old, ref, adv, mask, *, lo, hi, beta, max_len, weight, veto):
    B, T = len(logp), len(logp[0])
    A = [[adv[i]] * T for i in range(B)] if not isinstance(adv[0], list) else adv
    loss = 0.0
    grad = [[0.0] * T for _ in range(B)]
    N = sum(sum(r) for r in mask)
    for i in range(B):
        act = [t for t in range(T) if mask[i][t]]
        n = len(act)
        w = weight[i]
        if kind in ("grpo", "gspo", "gspo_token"):
            norm = B * max(n, 1)
        elif kind == "dr_grpo":
            norm = B * max_len
        else:
            norm = N
        # KL k3 and its derivative in logp: d/dx [e^{r−x} − (r−x) − 1] = 1 − e^{r−x}
        for t in act:
            if beta != 0.0:
                r = ref[i][t] - logp[i][t]
                loss += beta * (math.exp(r) - r - 1.0) / norm
                grad[i][t] += beta * (1.0 - math.exp(r)) / norm
        if kind in ("grpo", "dr_grpo", "dapo"):
            for t in act:
                rho = math.exp(logp[i][t] - old[i][t])
                val, d_rho = _surrogate(rho, A[i][t], lo, hi)
                loss += w * veto[i][t] * val / norm
                grad[i][t] += w * veto[i][t] * d_rho * rho / norm  # dρ/dlogp = ρ
        elif kind == "cispo":
            for t in act:
                rho = math.exp(logp[i][t] - old[i][t])
                c = min(rho, hi)  # constant (stop-gradient)
                loss += w * veto[i][t] * (-c * A[i][t] * logp[i][t]) / norm
                grad[i][t] += w * veto[i][t] * (-c * A[i][t]) / norm
        elif kind == "gspo":  # s = exp(mean_t(logp − old)); every token's term moves with s, ds/dlogp_t = s/n
            if n == 0:
                continue
            s = math.exp(sum(logp[i][t] - old[i][t] for t in act) / n)
            d_s = 0.0
            for t in act:
                val, d = _surrogate(s, A[i][t], lo, hi)
                loss += w * veto[i][t] * val / norm
                d_s += w * veto[i][t] * d / norm
            for t in act:
                grad[i][t] += d_s * s / n
        else:  # gspo_token: s_t = sg[s]·π_t/sg[π_t] is worth s but moves with its own token only, ds_t/dlogp_t = s
            if n == 0:
                continue
            s = math.exp(sum(logp[i][t] - old[i][t] for t in act) / n)
            for t in act:
                val, d = _surrogate(s, A[i][t], lo, hi)
                loss += w * veto[i][t] * val / norm
                grad[i][t] += w * veto[i][t] * d * s / norm
    return loss, grad


# ----------------------------------------------------------------------------------------------------
# fixed data

def _data(token_adv: bool, dtype=torch.float64):
    g = torch.Generator().manual_seed(7)
    B, T = 7, 9
    mask = torch.zeros(B, T)
    mask[0, :] = 1
    mask[1, :5] = 1
    mask[2, 2:4] = 1
    mask[2, 6:9] = 1  # two turns with an observation between
    mask[3, 4] = 1  # one action token
    mask[4, 1:8] = 1
    mask[5, :3] = 1
    # row 6: no action token at all
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = logp + 0.35 * torch.randn(B, T, generator=g, dtype=torch.float64)
    old[4] = logp[4] + 0.01 * torch.randn(T, generator=g, dtype=torch.float64)  # a row whose s stays inside
    ref = logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    if token_adv:
        adv = torch.randn(B, T, generator=g, dtype=torch.float64)
        adv[5] = 0.0
    else:
        adv = torch.tensor([1.3, -0.8, 0.0, 0.6, -1.4, 0.0, 0.9], dtype=torch.float64)
    # padding holds garbage: −inf log-probs and huge reference values must not leak
    logp = torch.where(mask.bool(), logp, torch.tensor(-math.inf, dtype=torch.float64))
    ref = torch.where(mask.bool(), ref, torch.tensor(1e4, dtype=torch.float64))
    weight = torch.tensor([1.0, 0.5, 0.25, 0.9, 0.1, 0.7, 0.3], dtype=torch.float64)
    veto = torch.ones(B, T)
    veto[0, 5:] = 0
    veto[4, 3:] = 0
    return [x.to(dtype) for x in (logp, old, ref, adv, mask, weight, veto)]


def _run(kind, logp, old, ref, adv, mask, **kw):
    lp = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(kind, lp, old, adv, mask, ref_logp=ref, **kw)
    loss.backward()
    return loss, lp.grad, metrics


@pytest.mark.parametrize("kind", LOSS_TYPES)
@pytest.mark.parametrize("token_adv", [False, True], ids=["row-adv", "token-adv"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "weight+veto"])
def test_loss_and_gradient_equal_rederivation(kind, token_adv, beta, extras):
    logp, old, ref, adv, mask, weight, veto = _data(token_adv)
    lo, hi = EPS[kind]
    kw = dict(eps_low=lo, eps_high=hi, beta=beta, max_len=MAX_LEN)
    if extras:
        kw.update(weight=weight, veto=veto)
    loss, grad, metrics = _run(kind, logp, old, ref, adv, mask, **kw)

    m = mask.tolist()
    safe = lambda x: torch.where(mask.bool(), x, torch.zeros_like(x)).tolist()  # noqa: E731
    want_loss, want_grad = reference(
        kind, safe(logp), safe(old), safe(ref), adv.tolist(), m, lo=lo, hi=hi, beta=beta, max_len=MAX_LEN,
        weight=weight.tolist() if extras else [1.0] * len(m),
        veto=(veto * mask).tolist() if extras else m)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert loss.item() == pytest.approx(want_loss, rel=1e-12, abs=1e-14)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=torch.float64), rtol=1e-11, atol=1e-14)
    assert (grad[~mask.bool()] == 0).all()
    assert "kl_k3_mean" in metrics  # a reference was given: its KL is reported even at β = 0
    assert ("veto_frac" in metrics) == extras


def test_the_fixed_data_exercises_both_sides_of_every_clip():
    """Guard against a vacuous comparison: the data must have clipped and unclipped tokens/rows."""
    logp, old, ref, adv, mask, *_ = _data(False)
    for kind in LOSS_TYPES:
        lo, hi = EPS[kind]
        _, _, metrics = _run(kind, logp, old, ref, adv, mask, eps_low=lo, eps_high=hi, max_len=MAX_LEN)
        assert metrics["clip_frac_high"] > 0, kind
        if kind != "cispo":
            assert metrics["clip_frac_low"] > 0, kind
    _, _, metrics = _run("gspo", logp, old, ref, adv, mask, eps_low=0.05, eps_high=0.08)
    assert 0 < metrics["clip_frac_low"] + metrics["clip_frac_high"] < 1


# ----------------------------------------------------------------------------------------------------
# clipping at the boundaries

def _one_token(rho, a, kind="dapo", lo=0.2, hi=0.28):
    logp = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - math.log(rho)
    loss, metrics = LOSSES[kind](logp, old, torch.tensor([a], dtype=torch.float64), torch.ones(1, 1),
                                 eps_low=lo, eps_high=hi)
    loss.backward()
    return loss.item(), logp.grad.item(), metrics


@pytest.mark.parametrize("kind", ["grpo", "dapo", "gspo"])
def test_clip_boundaries(kind):
    lo, hi, d = 0.2, 0.28, 1e-6
    # A > 0: the update is cut just above 1 + ε_high, alive just below; a small ratio is not clipped
    v, g, mt = _one_token(1 + hi - d, 2.0, kind, lo, hi)
    assert g == pytest.approx(-2.0 * (1 + hi - d)) and mt["clip_frac_high"] == 0
    v, g, mt = _one_token(1 + hi + d, 2.0, kind, lo, hi)
    assert g == 0.0 and v == pytest.approx(-2.0 * (1 + hi)) and mt["clip_frac_high"] == 1
    v, g, mt = _one_token(1 - lo - 0.1, 2.0, kind, lo, hi)
    assert g == pytest.approx(-2.0 * (1 - lo - 0.1)) and mt["clip_frac_low"] == 0
    # A < 0: cut just below 1 − ε_low, alive just above; a large ratio is not clipped
    v, g, mt = _one_token(1 - lo + d, -2.0, kind, lo, hi)
    assert g == pytest.approx(2.0 * (1 - lo + d)) and mt["clip_frac_low"] == 0
    v, g, mt = _one_token(1 - lo - d, -2.0, kind, lo, hi)
    assert g == 0.0 and v == pytest.approx(2.0 * (1 - lo)) and mt["clip_frac_low"] == 1
    v, g, mt = _one_token(1 + hi + 0.5, -2.0, kind, lo, hi)
    assert g == pytest.approx(2.0 * (1 + hi + 0.5)) and mt["clip_frac_high"] == 0


def test_cispo_caps_the_weight_but_never_drops_the_gradient():
    cap = 1.5
    _, g_in, mt = _one_token(1.4, 2.0, "cispo", hi=cap)
    assert g_in == pytest.approx(-2.0 * 1.4) and mt["clip_frac_high"] == 0
    _, g_out, mt = _one_token(3.0, 2.0, "cispo", hi=cap)
    assert g_out == pytest.approx(-2.0 * cap) and mt["clip_frac_high"] == 1  # capped, still a gradient
    _, g_neg, mt = _one_token(3.0, -2.0, "cispo", hi=cap)
    assert g_neg == pytest.approx(2.0 * cap) and mt["clip_frac_high"] == 0  # TRL counts A > 0 only
    with pytest.raises(GraftkitError, match="ε_max"):
        _one_token(1.0, 1.0, "cispo", hi=0.2)


# ----------------------------------------------------------------------------------------------------
# properties

@pytest.mark.parametrize("kind", LOSS_TYPES)
def test_beta_zero_makes_the_reference_irrelevant(kind):
    logp, old, ref, adv, mask, *_ = _data(False)
    lo, hi = EPS[kind]
    kw = dict(eps_low=lo, eps_high=hi, beta=0.0, max_len=MAX_LEN)
    l1, g1, _ = _run(kind, logp, old, ref, adv, mask, **kw)
    l2, g2, _ = _run(kind, logp, old, ref + 3.0, adv, mask, **kw)
    l3, g3, _ = _run(kind, logp, old, None, adv, mask, **kw)
    assert l1.item() == l2.item() == l3.item()
    assert torch.equal(g1, g2) and torch.equal(g1, g3)


def test_gspo_sequence_ratio_is_exp_of_the_mean_log_ratio():
    logp, old, ref, adv, mask, *_ = _data(False)
    for i in range(6):  # rows with action tokens
        row = slice(i, i + 1)
        _, _, mt = _run("gspo", logp[row], old[row], None, adv[row], mask[row], eps_low=0.05, eps_high=0.08)
        act = mask[i].bool()
        want = math.exp(statistics.fmean((logp[i, act] - old[i, act]).tolist()))
        assert mt["ratio_mean"].item() == pytest.approx(want, rel=1e-13)


def test_gspo_token_equals_gspo_for_row_advantages():
    logp, old, ref, adv, mask, weight, veto = _data(False)
    kw = dict(eps_low=0.05, eps_high=0.08, beta=0.04, weight=weight)
    l1, g1, _ = _run("gspo", logp, old, ref, adv, mask, **kw)
    l2, g2, _ = _run("gspo_token", logp, old, ref, adv, mask, **kw)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-13)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-15)


def test_on_policy_gspo_equals_grpo():
    """old_logp = None → every ratio is 1, so the sequence ratio changes nothing (TRL paper index note)."""
    logp, _, ref, adv, mask, *_ = _data(False)
    l1, g1, _ = _run("grpo", logp, None, ref, adv, mask, beta=0.04)
    l2, g2, _ = _run("gspo", logp, None, ref, adv, mask, beta=0.04)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-13)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-15)


def test_dr_grpo_and_dapo_normalisers_differ_by_the_expected_factor():
    logp, old, ref, adv, mask, *_ = _data(True)
    kw = dict(beta=0.04, max_len=MAX_LEN)
    l_dr, g_dr, _ = _run("dr_grpo", logp, old, ref, adv, mask, **kw)
    l_da, g_da, _ = _run("dapo", logp, old, ref, adv, mask, **kw)
    factor = mask.sum().item() / (mask.shape[0] * MAX_LEN)  # N / (B · L_max)
    assert l_dr.item() == pytest.approx(l_da.item() * factor, rel=1e-13)
    torch.testing.assert_close(g_dr, g_da * factor, rtol=1e-12, atol=1e-15)
    # the generation-batch normaliser (TRL's num_items_in_batch) replaces N exactly
    l_n, _, _ = _run("dapo", logp, old, ref, adv, mask, token_normaliser=100.0, **kw)
    assert l_n.item() == pytest.approx(l_da.item() * mask.sum().item() / 100.0, rel=1e-13)


@pytest.mark.parametrize("kind", LOSS_TYPES)
def test_focal_weights_scale_each_rows_contribution(kind):
    logp, old, _, adv, mask, *_ = _data(False)
    lo, hi = EPS[kind]
    B = mask.shape[0]
    kw = dict(eps_low=lo, eps_high=hi, max_len=MAX_LEN)
    w = focal_weight(torch.tensor([0.0, 0.25, 0.5, 0.75, 0.125, 0.9, 0.3], dtype=torch.float64), 2.0)
    l_w, g_w, _ = _run(kind, logp, old, None, adv, mask, weight=w, **kw)
    l_1, g_1, _ = _run(kind, logp, old, None, adv, mask, **kw)
    torch.testing.assert_close(g_w, g_1 * w[:, None], rtol=1e-12, atol=1e-15)
    per_row = [_run(kind, logp, old, None, adv, mask, weight=torch.eye(B, dtype=torch.float64)[i], **kw)[0]
               for i in range(B)]
    assert l_w.item() == pytest.approx(sum(w[i].item() * per_row[i].item() for i in range(B)), rel=1e-12)
    assert l_1.item() == pytest.approx(sum(r.item() for r in per_row), rel=1e-12)


def test_focal_weight_values():
    p = torch.tensor([0.0, 0.25, 0.5, 1.0])
    assert torch.equal(focal_weight(p, 0.0), torch.ones(4))
    torch.testing.assert_close(focal_weight(p, 2.0), torch.tensor([1.0, 0.5625, 0.25, 0.0]))
    torch.testing.assert_close(focal_weight(0.5, 1.0), torch.tensor(0.5))
    with pytest.raises(GraftkitError, match="\\[0, 1\\]"):
        focal_weight(torch.tensor([1.2]), 1.0)
    with pytest.raises(GraftkitError, match="gamma"):
        focal_weight(p, -1.0)


def test_group_advantages_match_the_formula():
    R = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0], [0.2, 0.9, 0.4, 0.4, 0.1],
                      [0.3, 0.3, 0.3, 0.3, 0.3]], dtype=torch.float64)
    rows = R.tolist()
    sd_batch = statistics.stdev([r for row in rows for r in row])
    for scale in ("group", "batch", "none"):
        A, zero = group_advantages(R, scale=scale)
        assert zero.tolist() == [False, True, False, True]
        for i, row in enumerate(rows):
            mu, sd = statistics.fmean(row), statistics.stdev(row)  # stdev: unbiased, n − 1 (TRL's torch.std)
            div = {"group": sd + 1e-4, "batch": sd_batch + 1e-4, "none": 1.0}[scale]
            want = [0.0] * 5 if sd == 0 else [(r - mu) / div for r in row]
            assert A[i].tolist() == pytest.approx(want, rel=1e-12, abs=0)
        assert (A[zero] == 0).all()
    A1, z1 = group_advantages(torch.tensor([1.0, 0.0, 1.0]))
    assert A1.shape == (3,) and not z1
    with pytest.raises(GraftkitError, match="group size"):
        group_advantages(torch.tensor([[1.0]]))
    with pytest.raises(GraftkitError, match="reward scale"):
        group_advantages(R, scale="std")


@pytest.mark.parametrize("kind", LOSS_TYPES)
def test_zero_std_groups_give_zero_advantage_and_zero_gradient(kind):
    G = 4
    R = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    A, zero = group_advantages(R)
    assert zero.tolist() == [True, False] and (A[0] == 0).all()
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(2 * G, 6, generator=g, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(2 * G, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(2 * G, 6)
    mask[1, 4:] = 0
    lo, hi = EPS[kind]
    _, grad, _ = _run(kind, logp, old, None, A.reshape(-1), mask, eps_low=lo, eps_high=hi, max_len=6)
    assert (grad[:G] == 0).all() and (grad[G:] != 0).any()


@pytest.mark.parametrize("kind", LOSS_TYPES)
def test_the_loss_is_differentiable_in_logp_only(kind):
    logp, old, ref, adv, mask, weight, _ = _data(False)
    old, ref, adv, weight = (x.clone().requires_grad_(True) for x in (old, ref, adv, weight))
    lo, hi = EPS[kind]
    lp = logp.clone().requires_grad_(True)
    loss, metrics = policy_loss(kind, lp, old, adv, mask, ref_logp=ref, beta=0.04, eps_low=lo, eps_high=hi,
                                max_len=MAX_LEN, weight=weight)
    loss.backward()
    assert lp.grad is not None
    assert old.grad is None and ref.grad is None and adv.grad is None and weight.grad is None
    assert all(not v.requires_grad for v in metrics.values())


def test_float32_agrees_with_float64():
    for kind in LOSS_TYPES:
        lo, hi = EPS[kind]
        kw = dict(eps_low=lo, eps_high=hi, beta=0.04, max_len=MAX_LEN)
        l64, g64, _ = _run(kind, *_data(True)[:5], **kw)
        l32, g32, _ = _run(kind, *_data(True, torch.float32)[:5], **kw)
        assert l32.dtype == torch.float32
        assert l32.item() == pytest.approx(l64.item(), rel=1e-4, abs=1e-6)
        torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-6)


def test_metrics_are_the_quantities_they_name():
    logp, old, ref, adv, mask, _, veto = _data(False)
    _, _, mt = _run("dapo", logp, old, ref, adv, mask, beta=0.04, eps_low=0.2, eps_high=0.28, veto=veto)
    act = mask.bool()
    rho = torch.exp(logp - old)[act]
    A = adv[:, None].expand_as(mask)[act]
    r = torch.where(act, ref - logp, torch.zeros_like(logp))[act]
    assert mt["ratio_mean"].item() == pytest.approx(rho.mean().item(), rel=1e-13)
    assert mt["clip_frac_low"].item() == pytest.approx(((rho < 0.8) & (A < 0)).double().mean().item())
    assert mt["clip_frac_high"].item() == pytest.approx(((rho > 1.28) & (A > 0)).double().mean().item())
    assert mt["kl_k3_mean"].item() == pytest.approx((r.exp() - r - 1).mean().item(), rel=1e-13)
    assert mt["veto_frac"].item() == pytest.approx(((veto == 0) & act).sum().item() / act.sum().item())


def test_bad_input_is_one_clear_error():
    logp, old, ref, adv, mask, *_ = _data(False)
    with pytest.raises(GraftkitError, match="unknown loss type"):
        policy_loss("ppo", logp, old, adv, mask)
    with pytest.raises(GraftkitError, match="max_len"):
        policy_loss("dr_grpo", logp, old, adv, mask)
    with pytest.raises(GraftkitError, match="no reference"):
        policy_loss("grpo", logp, old, adv, mask, beta=0.1)
    with pytest.raises(GraftkitError, match="old_logp has shape"):
        policy_loss("grpo", logp, old[:, :3], adv, mask)
    with pytest.raises(GraftkitError, match="advantages have shape"):
        policy_loss("grpo", logp, old, adv[:3], mask)
    with pytest.raises(GraftkitError, match="clip range"):
        policy_loss("grpo", logp, old, adv, mask, eps_low=1.0)


# ----------------------------------------------------------------------------------------------------
# Mu-GRPO negative-advantage veto

def _veto_row(k, T=8, rho_k=1.5, eps_v=0.2):
    old = torch.full((T,), -1.0)
    new = old.clone()
    new[:k] += torch.log(torch.tensor(1.1))  # inside [0.8, 1.2] before the trigger
    new[k] += math.log(rho_k)
    new[k + 1:] += torch.log(torch.tensor(3.0))  # wild afterwards: irrelevant, the trigger is the first
    return new, old


def test_veto_drops_the_suffix_after_the_trigger_in_negative_rows():
    k, T = 3, 8
    new, old = _veto_row(k, T)
    mask = torch.ones(T)
    assert veto_trigger(new, old, mask, 0.2).item() == k
    keep = veto_mask(new, old, -1.0, mask, 0.2)
    assert keep.tolist() == [True] * (k + 1) + [False] * (T - k - 1)  # trigger kept, suffix dropped
    keep = veto_mask(new, old, -1.0, mask, 0.2, keep_trigger=False)
    assert keep.tolist() == [True] * k + [False] * (T - k)
    new_low, _ = _veto_row(k, T, rho_k=0.7)  # leaving the range downwards triggers too
    assert veto_trigger(new_low, old, mask, 0.2).item() == k
    for a in (1.0, 0.0):  # positive and zero advantage: untouched
        assert torch.equal(veto_mask(new, old, a, mask, 0.2), mask.bool())


def test_veto_without_a_trigger_or_on_padding_changes_nothing():
    T = 6
    old = torch.full((T,), -2.0)
    new = old + torch.log(torch.tensor([1.0, 1.19, 0.81, 1.2, 0.8, 1.05]))  # bounds are inside
    mask = torch.ones(T)
    assert veto_trigger(new, old, mask, 0.2 + 1e-6).item() == -1
    assert torch.equal(veto_mask(new, old, -2.0, mask, 0.2 + 1e-6), mask.bool())
    new2 = new.clone()
    new2[1] = 5.0  # a wild ratio on a padding position
    mask2 = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.equal(veto_mask(new2, old, -2.0, mask2, 0.25), mask2.bool())


def test_veto_batched_over_rows():
    k, T = 2, 7
    rows = [_veto_row(k, T), _veto_row(k, T), _veto_row(4, T), (torch.full((T,), -1.0), torch.full((T,), -1.0))]
    new = torch.stack([r[0] for r in rows])
    old = torch.stack([r[1] for r in rows])
    mask = torch.ones(4, T)
    mask[2, 6] = 0
    adv = torch.tensor([-0.5, 0.7, -1.2, -0.3])
    keep = veto_mask(new, old, adv, mask, 0.2)
    assert veto_trigger(new, old, mask, 0.2).tolist() == [2, 2, 4, -1]
    assert keep[0].tolist() == [True] * 3 + [False] * 4
    assert keep[1].tolist() == [True] * T  # positive advantage
    assert keep[2].tolist() == [True] * 5 + [False] * 2
    assert keep[3].tolist() == [True] * T  # no trigger
    # the veto removes exactly those tokens from the update (dapo, β = 0)
    lp = new.double().requires_grad_(True)
    loss, mt = LOSSES["dapo"](lp, old.double(), adv.double(), mask, veto=keep)
    loss.backward()
    assert (lp.grad[~keep] == 0).all() and (lp.grad[keep] != 0).any()
    assert mt["veto_frac"].item() == pytest.approx(5 / mask.sum().item())  # 4 + 1 (row 2's last is padding)
    with pytest.raises(GraftkitError, match="one advantage per response"):
        veto_mask(new, old, torch.zeros(4, T), mask, 0.2)


# ----------------------------------------------------------------------------------------------------
# VeriGate

def test_verigate_outcome_path_when_rewards_differ():
    R = torch.tensor([1.0, 0.0, 0.0, 1.0])
    scores = [[0.1, 0.9], [0.5], [0.0, 0.2, 0.3], [1.0]]
    counts = [[3, 2], [4], [1, 1, 2], [5]]
    out = verigate_advantages(R, scores, counts)
    assert out.path == "outcome"
    sd = statistics.stdev([1.0, 0.0, 0.0, 1.0])
    for i, toks in enumerate(out.token_advantages):
        want = (R[i].item() - 0.5) / (sd + 1e-4)
        assert toks.shape == (sum(counts[i]),)
        assert toks.tolist() == pytest.approx([want] * sum(counts[i]), rel=1e-6)


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_verigate_process_path_when_rewards_are_equal(gamma):
    R = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    scores = [[0.2, 0.5, 1.0], [0.0, 0.3], [0.4]]
    counts = [[2, 1, 3], [1, 2], [2]]
    out = verigate_advantages(R, scores, counts, gamma=gamma)
    assert out.path == "process"
    # reward-to-go by hand: G_k = r_k + γ r_{k+1} + γ² r_{k+2} + …
    returns = [[0.2 + gamma * 0.5 + gamma ** 2 * 1.0, 0.5 + gamma * 1.0, 1.0],
               [0.0 + gamma * 0.3, 0.3],
               [0.4]]
    pooled = [g for row in returns for g in row]
    mu, sd = statistics.fmean(pooled), statistics.stdev(pooled)
    for i, toks in enumerate(out.token_advantages):
        want = [(g - mu) / (sd + 1e-4) for g, c in zip(returns[i], counts[i]) for _ in range(c)]
        assert toks.tolist() == pytest.approx(want, rel=1e-12)
    # into the batch layout: row i's action tokens, in order
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 1]])
    A = scatter_token_advantages(out.token_advantages, mask)
    for i in range(3):
        assert A[i][mask[i].bool()].tolist() == out.token_advantages[i].tolist()
        assert (A[i][~mask[i].bool()] == 0).all()
    with pytest.raises(GraftkitError, match="action tokens"):
        scatter_token_advantages(out.token_advantages, torch.ones(3, 8))


def test_verigate_degenerate_cases_are_zero_not_nan():
    R = torch.tensor([1.0, 1.0, 1.0])
    out = verigate_advantages(R, [[0.0, 0.5], [0.0, 0.0, 0.5], [0.5]], [[1, 2], [2, 2, 1], [3]])
    assert out.path == "none"  # every reward-to-go is 0.5
    assert all(torch.equal(t, torch.zeros_like(t)) for t in out.token_advantages)
    out = verigate_advantages(R, [[0.0, 0.0], [0.0], [0.0, 0.0, 0.0]], [[1, 1], [2], [1, 1, 1]])
    assert out.path == "none" and all((t == 0).all() for t in out.token_advantages)
    # equal non-zero step scores are NOT degenerate once cumulated: earlier steps have more reward to go
    out = verigate_advantages(R, [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], [[1, 1]] * 3)
    assert out.path == "process"
    for t in out.token_advantages:
        assert torch.isfinite(t).all() and t[0] > 0 > t[1]
    out = verigate_advantages(torch.tensor([0.0, 0.0]), [[0.7], []], [[4], []])  # one step in the group
    assert out.path == "none" and out.token_advantages[0].tolist() == [0.0] * 4
    assert out.token_advantages[1].numel() == 0
    with pytest.raises(GraftkitError, match="one process score per step"):
        verigate_advantages(R, [[0.5], [0.2], [0.5]], [[1, 2], [2], [3]])
    with pytest.raises(GraftkitError, match="3 rewards"):
        verigate_advantages(R, [[0.5]], [[1]])
