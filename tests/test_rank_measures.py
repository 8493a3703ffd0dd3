"""rank.spectra against an independent numpy float64 SVD written out here, closed forms, and planted cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graftkit.core.errors import GraftkitError
from graftkit.rank import spectra as sp

RNG = np.random.default_rng(0)
_EPS64 = float(np.finfo(np.float64).eps)


def _orth(n: int, k: int, rng) -> np.ndarray:
    q, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return q


def _planted(m: int, n: int, s: np.ndarray, rng) -> np.ndarray:
    """U diag(s) Vᵀ with random orthonormal U [m r], V [n r]."""
    r = len(s)
    return _orth(m, r, rng) @ np.diag(s) @ _orth(n, r, rng).T


def _matrices():
    rng = np.random.default_rng(1)
    return {
        "random_tall": rng.standard_normal((48, 20)),
        "random_wide": rng.standard_normal((20, 48)),
        "lowrank_tall": _planted(40, 16, np.array([5.0, 3.0, 2.0, 1.0]), rng),
        "lowrank_wide": _planted(16, 40, np.array([5.0, 3.0, 2.0, 1.0]), rng),
        "rank_one": np.outer(rng.standard_normal(30), rng.standard_normal(12)),
        "identity": np.eye(17),
    }


MATS = _matrices()


# -- independent references (plain numpy float64 SVD, formulas written out) ---------------------------

def ref_sigma(W):
    return np.linalg.svd(np.asarray(W, dtype=np.float64), compute_uv=False)


def ref_H(p):
    p = p[p > 0]
    return -np.sum(p * np.log(p))


def ref_all(W):
    s = ref_sigma(W)
    p = s / s.sum()
    q = s**2 / (s**2).sum()
    return {
        "erank": math.exp(ref_H(p)),
        "erank_sq": math.exp(ref_H(q)),
        "stable_rank": (s**2).sum() / s.max() ** 2,
        "participation_ratio": (s**2).sum() ** 2 / (s**4).sum(),
        "rankme": math.exp(-np.sum((p + 1e-7) * np.log(p + 1e-7))),
        "top1_energy": s.max() ** 2 / (s**2).sum(),
    }


# -- spectra ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MATS))
@pytest.mark.parametrize("method", ["gram", "svd"])
def test_singular_values_match_reference(name, method):
    W = MATS[name]
    s = sp.singular_values(W, method)
    ref = ref_sigma(W)
    assert s.dtype == np.float64 and s.shape == (min(W.shape),)
    assert np.all(np.diff(s) <= 0), "descending"
    # gram loses relative accuracy only below sqrt(eps)·σ₁; compare absolutely on that scale
    np.testing.assert_allclose(s, ref, rtol=0, atol=1e-7 * ref[0])


@pytest.mark.parametrize("shape", [(30, 50), (50, 30), (40, 40)])
def test_gram_and_svd_agree_on_well_conditioned(shape):
    rng = np.random.default_rng(2)
    n = min(shape)
    W = _planted(*shape, np.linspace(1.0, 3.0, n), rng)
    g, s = sp.singular_values(W, "gram"), sp.singular_values(W, "svd")
    assert np.max(np.abs(g - s) / s) <= 1e-10


def test_torch_input_any_float_dtype_is_upcast():
    W = torch.randn(24, 10, generator=torch.Generator().manual_seed(0))
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        Wd = W.to(dt)
        spec = sp.spectrum(Wd)
        np.testing.assert_allclose(spec.sigma, ref_sigma(Wd.double().numpy()), rtol=1e-9, atol=1e-9)
        assert spec.dtype == str(dt).removeprefix("torch.")
        assert spec.dtype_eps == torch.finfo(dt).eps
        assert spec.shape == (24, 10) and spec.method == "gram-eigvalsh-fp64"
    assert sp.spectrum(W, "svd").method == "svd-fp64"


# -- single-matrix measures vs reference ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MATS))
def test_measures_match_reference(name):
    W = MATS[name]
    ref = ref_all(W)
    got = sp.measures(W)
    for key, want in ref.items():
        assert got[key] == pytest.approx(want, rel=1e-9), key
        assert key in got["conventions"]
    s = ref_sigma(W)
    assert sp.erank(s) == pytest.approx(ref["erank"], rel=1e-12)
    assert sp.erank_sq(s) == pytest.approx(ref["erank_sq"], rel=1e-12)
    assert sp.stable_rank(s) == pytest.approx(ref["stable_rank"], rel=1e-12)
    assert sp.participation_ratio(s**2) == pytest.approx(ref["participation_ratio"], rel=1e-12)
    assert sp.participation_ratio(sp.spectrum(W, "svd")) == pytest.approx(ref["participation_ratio"], rel=1e-9)
    assert sp.rankme(s) == pytest.approx(ref["rankme"], rel=1e-12)
    assert sp.top1_energy(W) == pytest.approx(ref["top1_energy"], rel=1e-9)
    assert got["erank_sq"] <= got["erank"] + 1e-12
    assert got["method"] == "gram-eigvalsh-fp64" and got["dtype"] == "float64" and got["shape"] == W.shape


def test_closed_forms_identity_and_rank_one():
    n = 13
    I = np.eye(n)
    m = sp.measures(I)
    for key in ("erank", "erank_sq", "stable_rank", "participation_ratio"):
        assert m[key] == pytest.approx(n, rel=1e-12), key
    assert m["numerical_rank"] == n
    assert m["top1_energy"] == pytest.approx(1 / n, rel=1e-12)

    R = np.outer(np.arange(1.0, 8.0), np.linspace(-1, 2, 5))
    r = sp.measures(R, "svd")
    for key in ("erank", "erank_sq", "stable_rank", "participation_ratio", "top1_energy"):
        assert r[key] == pytest.approx(1.0, abs=1e-7), key
    assert r["numerical_rank"] == 1
    assert sp.top1_energy(R) == pytest.approx(1.0, abs=1e-12)
    # RankMe's ε biases upward: 1 + small
    assert 1.0 < r["rankme"] < 1.0 + 1e-4


def test_rankme_is_the_paper_formula_not_renormalised():
    s = np.array([3.0, 1.0, 0.0, 0.0])
    p = s / s.sum() + 1e-3
    assert sp.rankme(s, eps=1e-3) == pytest.approx(math.exp(-np.sum(p * np.log(p))), rel=1e-14)
    assert sp.rankme(s, eps=0.0) == pytest.approx(sp.erank(s), rel=1e-14)


def test_erank_is_scale_invariant_and_ignores_zeros():
    s = np.array([4.0, 2.0, 1.0])
    assert sp.erank(s) == pytest.approx(sp.erank(7.5 * s), rel=1e-14)
    assert sp.erank(np.r_[s, 0, 0]) == pytest.approx(sp.erank(s), rel=1e-14)
    assert sp.erank(torch.tensor(s)) == pytest.approx(sp.erank(s))


# -- numerical rank ---------------------------------------------------------------------------------

def test_numerical_rank_explicit_tolerances():
    s = np.array([10.0, 5.0, 1e-3, 1e-9])
    assert sp.numerical_rank(s, tol=1e-6) == 3
    assert sp.numerical_rank(s, tol=1.0) == 2
    assert sp.numerical_rank(s, rtol=1e-5) == 3  # threshold 1e-4
    with pytest.raises(GraftkitError, match="tolerance"):
        sp.numerical_rank(s)
    with pytest.raises(GraftkitError):
        sp.numerical_rank(s, tol=1.0, rtol=0.1)


def test_numerical_rank_default_uses_input_dtype_eps():
    rng = np.random.default_rng(3)
    n, r = 64, 4
    W = _planted(n, n, np.ones(r), rng)
    Wb = torch.from_numpy(W).to(torch.bfloat16)  # rounding noise fills the whole spectrum
    spec = sp.spectrum(Wb)
    s = ref_sigma(Wb.double().numpy())
    assert spec.dtype == "bfloat16"
    bf16_tol = n * 2.0**-7 * s[0]
    assert spec.default_tol() == pytest.approx(bf16_tol, rel=1e-9)
    assert sp.numerical_rank(spec) == int((s > bf16_tol).sum()) == r
    fp32_tol = n * float(np.finfo(np.float32).eps) * s[0]
    fp32_rank = sp.numerical_rank(spec, tol=fp32_tol)
    assert fp32_rank == int((s > fp32_tol).sum()) and fp32_rank > 8 * r
    m = sp.measures(Wb)
    assert m["numerical_rank"] == r and m["dtype"] == "bfloat16"
    assert "bfloat16" in m["numerical_rank_tol_rule"] and m["numerical_rank_tol"] == pytest.approx(bf16_tol)
    # the same values as a fp32 tensor get the fp32 tolerance
    assert sp.measures(Wb.float())["numerical_rank"] == fp32_rank


def test_measures_on_zero_matrix():
    m = sp.measures(np.zeros((4, 6)))
    assert m["numerical_rank"] == 0 and math.isnan(m["erank"]) and math.isnan(m["stable_rank"])
    with pytest.raises(GraftkitError, match="zero"):
        sp.erank(np.zeros(3))


# -- pair measures ------------------------------------------------------------------------------------

def _ref_angles(A, B, k, side="left"):
    def basis(W):
        U, _, Vt = np.linalg.svd(W, full_matrices=False)
        return U[:, :k] if side == "left" else Vt[:k].T
    c = np.linalg.svd(basis(A).T @ basis(B), compute_uv=False)
    return np.sort(np.arccos(np.clip(c, -1, 1)))


def test_principal_angles():
    rng = np.random.default_rng(4)
    s = np.array([6.0, 4.0, 3.0, 2.0, 1.0, 0.5])
    U, V = _orth(30, 12, rng), _orth(20, 12, rng)
    W0 = U[:, :6] @ np.diag(s) @ V[:, :6].T
    assert np.max(sp.principal_angles(W0, W0, 3)) < 1e-7
    assert np.max(sp.principal_angles(W0, 2.0 * W0, 4, side="right")) < 1e-7
    W_orth = U[:, 6:] @ np.diag(s) @ V[:, 6:].T  # both sides orthogonal to W0's
    np.testing.assert_allclose(sp.principal_angles(W0, W_orth, 4), np.pi / 2, atol=1e-10)
    np.testing.assert_allclose(sp.principal_angles(W0, W_orth, 4, side="right"), np.pi / 2, atol=1e-10)
    A, B = rng.standard_normal((25, 15)), rng.standard_normal((25, 15))
    got = sp.principal_angles(A, B, 5)
    assert np.all(np.diff(got) >= 0)
    np.testing.assert_allclose(got, _ref_angles(A, B, 5), atol=1e-7)
    np.testing.assert_allclose(sp.principal_angles(A, B, 5, "right"), _ref_angles(A, B, 5, "right"), atol=1e-7)


def test_spectral_drift():
    A = MATS["random_tall"]
    B = A + 0.1 * np.random.default_rng(5).standard_normal(A.shape)
    s0, s1 = ref_sigma(A), ref_sigma(B)
    assert sp.spectral_drift(A, B) == pytest.approx(np.linalg.norm(s1 - s0) / np.linalg.norm(s0), rel=1e-9)
    assert sp.spectral_drift(A, A) == 0.0
    assert sp.spectral_drift(A, 3 * A) == pytest.approx(2.0, rel=1e-12)


def test_delta_energy_in_topk():
    rng = np.random.default_rng(6)
    U, V = _orth(30, 10, rng), _orth(20, 10, rng)
    W0 = U @ np.diag(np.arange(10.0, 0.0, -1)) @ V.T
    k = 3
    inside = U[:, :k] @ rng.standard_normal((k, 20))
    outside = U[:, k:] @ rng.standard_normal((10 - k, 20))
    assert sp.delta_energy_in_topk(W0, inside, k) == pytest.approx(1.0, abs=1e-12)
    assert sp.delta_energy_in_topk(W0, outside, k) == pytest.approx(0.0, abs=1e-12)
    D = rng.standard_normal((30, 20))
    Uk = np.linalg.svd(W0)[0][:, :k]
    want = np.linalg.norm(Uk.T @ D) ** 2 / np.linalg.norm(D) ** 2
    assert sp.delta_energy_in_topk(W0, D, k) == pytest.approx(want, rel=1e-10)
    with pytest.raises(GraftkitError, match="zero"):
        sp.delta_energy_in_topk(W0, np.zeros_like(W0), k)


def test_intruder_dimensions_planted_and_absent():
    rng = np.random.default_rng(7)
    n = 64
    U, V = _orth(n, n, rng), _orth(n, n, rng)
    W0 = U @ np.diag(np.geomspace(10.0, 0.1, n)) @ V.T
    # u spreads evenly over W0's bottom 32 left singular vectors: |cos| = 1/sqrt(32) ≈ 0.18 with each
    u = U[:, 32:] @ (rng.choice([-1.0, 1.0], 32) / np.sqrt(32))
    v = rng.standard_normal(n)
    v /= np.linalg.norm(v)
    W1 = W0 + 100.0 * np.outer(u, v)
    got = sp.intruder_dimensions(W0, W1, k=10, eps=0.5)
    assert got.indices == (0,) and got.count == 1 and got.k == 10 and got.eps == 0.5
    assert got.max_abs_cos[0] < 0.25 and min(got.max_abs_cos[1:]) > 0.5
    # reference: loop over W1's top-10 vectors
    U0, U1 = np.linalg.svd(W0)[0], np.linalg.svd(W1)[0]
    ref = [j for j in range(10) if max(abs(U0[:, i] @ U1[:, j]) for i in range(n)) < 0.5]
    assert list(got.indices) == ref

    small = W0 + 1e-3 * rng.standard_normal((n, n))
    none = sp.intruder_dimensions(W0, small)
    assert none.count == 0 and min(none.max_abs_cos) > 0.9


def _form(L) -> str:
    return "U" if L.U is not None else "V" if L.V is not None else "QR"


@pytest.mark.parametrize("shape, decades, form", [
    ((3000, 96), 2.4, "V"),  # tall, every σ resolved by the Gram: u = W v / σ
    ((3000, 96), 6.0, "QR"),  # tall, σ spanning six decades: the Gram's floor is too close, W = QR
    ((200, 200), 5.0, "U"),  # square: W Wᵀ's eigenvectors
    ((64, 900), 4.0, "U"),  # wide
])
def test_vector_measures_match_the_float64_svd_on_every_route(shape, decades, form):
    """Singular vectors from the Gram (or the QR) against numpy's float64 SVD written out here: a direction
    planted across W₀'s bottom half of singular vectors intrudes (|cos| ≈ 1/sqrt(r/2) with each), every other
    top vector of W₁ stays; cosines, the count, the energy share and principal angles agree."""
    rng = np.random.default_rng(9)
    m, n = shape
    r = min(shape)
    W0 = torch.from_numpy(_planted(m, n, np.logspace(0, -decades, r), rng)).to(torch.float32)
    A0 = W0.double().numpy()
    U0 = np.linalg.svd(A0, full_matrices=False)[0]
    u = U0[:, r // 2:] @ (rng.choice([-1.0, 1.0], r - r // 2) / math.sqrt(r - r // 2))
    W1 = torch.from_numpy(A0 + 2.0 * np.outer(u, _orth(n, 1, rng)[:, 0])).to(torch.float32)
    assert _form(sp.left_singular(W0)) == form
    assert _form(sp.left_singular(W0, k=10)) == ("V" if m > n else "U")  # the top 10 alone: always resolved
    U1 = np.linalg.svd(W1.double().numpy(), full_matrices=False)[0]
    best = np.abs(U0.T @ U1[:, :10]).max(axis=0)
    got = sp.intruder_dimensions(W0, W1, 10)
    np.testing.assert_allclose(got.max_abs_cos, best, rtol=0, atol=1e-9)
    assert got.indices == (0,) and got.max_abs_cos[0] < 0.25 and min(got.max_abs_cos[1:]) > 0.8
    D = sp.delta_matrix(W0, W1)
    Dn = D.double().numpy()
    P = U0[:, :8].T @ Dn
    assert sp.delta_energy_in_topk(W0, D, 8) == pytest.approx((P * P).sum() / (Dn * Dn).sum(), rel=1e-10)
    # (the reference takes every angle from arccos, which near 0 resolves ~1e-8: hence atol 1e-7, as above)
    np.testing.assert_allclose(sp.principal_angles(W0, W1, 5), _ref_angles(A0, W1.double().numpy(), 5), atol=1e-7)
    gram, svd = (sp.pair_measures(W0, W1, D, energy_k=8, intruder_k=10, method=m) for m in ("gram", "svd"))
    assert gram["intruders"] == svd["intruders"] == 1.0
    assert gram["delta_energy_topk"] == pytest.approx(svd["delta_energy_topk"], rel=1e-8, abs=1e-15)


def test_top1_energy_of_delta():
    rng = np.random.default_rng(8)
    D = rng.standard_normal((12, 9))
    s = ref_sigma(D)
    assert sp.top1_energy(D) == pytest.approx(s[0] ** 2 / np.linalg.norm(D) ** 2, rel=1e-10)
    assert sp.top1_energy(torch.tensor(D, dtype=torch.bfloat16)) == pytest.approx(
        ref_sigma(torch.tensor(D, dtype=torch.bfloat16).double().numpy())[0] ** 2
        / np.linalg.norm(torch.tensor(D, dtype=torch.bfloat16).double().numpy()) ** 2, rel=1e-9)


# -- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    (np.ones(5), "2-D"),
    (np.ones((2, 3, 4)), "one matrix"),
    (torch.ones(2, 3, 4), "MoE"),
    (np.ones((3, 4), dtype=np.int64), "floating"),
    (torch.ones(3, 4, dtype=torch.int32), "floating"),
    (np.zeros((0, 4)), "empty"),
    (np.array([[1.0, np.nan], [0.0, 1.0]]), "NaN"),
    ([[1.0, 2.0]], "torch tensor or numpy array"),
])
def test_bad_matrix_input_is_one_line_error(bad, match):
    with pytest.raises(GraftkitError, match=match) as e:
        sp.spectrum(bad)
    assert "\n" not in str(e.value)


def test_bad_arguments_are_one_line_errors():
    A, B = np.ones((4, 5)), np.ones((5, 4))
    cases = [
        lambda: sp.spectrum(A, method="fp32-gram"),
        lambda: sp.principal_angles(A, B, 2),
        lambda: sp.principal_angles(A, A, 0),
        lambda: sp.principal_angles(A, A, 5),
        lambda: sp.principal_angles(A, A, 2, side="up"),
        lambda: sp.intruder_dimensions(A, A, k=2, eps=0.0),
        lambda: sp.delta_energy_in_topk(A, B, 1),
        lambda: sp.spectral_drift(np.zeros((4, 5)), A),
        lambda: sp.erank(np.array([1.0, -1.0])),
        lambda: sp.erank(np.ones((2, 2))),
        lambda: sp.participation_ratio([]),
        lambda: sp.numerical_rank([1.0], tol=-1.0),
    ]
    for case in cases:
        with pytest.raises(GraftkitError) as e:
            case()
        assert "\n" not in str(e.value)


def test_gram_floor_zero_tail_and_float64_numerical_rank():
    rng = np.random.default_rng(9)
    R = np.outer(rng.standard_normal(30), rng.standard_normal(12))
    g = sp.spectrum(R)
    assert np.count_nonzero(g.sigma) == 1  # the Gram's rounding noise is not reported as spectrum
    W = _planted(20, 20, np.array([1.0, 1e-10]), rng)  # float64: σ₂ is real, below the Gram floor
    assert ref_sigma(W)[1] == pytest.approx(1e-10, rel=1e-3)
    m = sp.measures(W)
    assert m["numerical_rank"] == 2 and m["numerical_rank_method"] == "svd-fp64"
    assert sp.numerical_rank(sp.spectrum(W, "svd")) == 2
    with pytest.raises(GraftkitError, match="method='svd'"):
        sp.numerical_rank(sp.spectrum(W))
    m32 = sp.measures(W.astype(np.float32))
    assert m32["numerical_rank"] == 1 and m32["numerical_rank_method"] == "gram-eigvalsh-fp64"


def test_spectrum_is_frozen():
    spec = sp.spectrum(np.eye(3))
    with pytest.raises(Exception):
        spec.dtype = "float32"  # type: ignore[misc]


# -- numerical rank of a delta of two stored matrices ------------------------------------------------

def _stored_pair(m: int, n: int, s: np.ndarray, dtype, rng) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """(W_base, W_rl = fl(W_base + D)) stored in ``dtype`` and the exact float64 delta D = U diag(s) Vᵀ."""
    W = torch.from_numpy(0.02 * rng.standard_normal((m, n))).to(dtype)
    D = _planted(m, n, s, rng)
    return W, (W.double() + torch.from_numpy(D)).to(dtype), D


def ref_rounding_reference(W0, W1) -> float:
    """max row plus max column 2-norm of max(|W0|, |W1|), written out in numpy."""
    S = np.maximum(np.abs(np.asarray(W0, dtype=np.float64)), np.abs(np.asarray(W1, dtype=np.float64)))
    return float(np.sqrt((S**2).sum(1)).max() + np.sqrt((S**2).sum(0)).max())


@pytest.mark.parametrize("dtype, scale", [(torch.bfloat16, 0.1), (torch.float32, 1e-4)])
def test_delta_rule_counts_a_planted_low_rank_delta_exactly(dtype, scale):
    """A rank-4 update of 64×48 weights stored in bf16 or fp32: the delta rule counts 4; the matrix rule
    on the float32 difference (the old default) counts the weights' rounding noise as rank."""
    rng = np.random.default_rng(10)
    r = 4
    W0, W1, D = _stored_pair(64, 48, scale * np.array([4.0, 3.0, 2.0, 1.0]), dtype, rng)
    spec = sp.delta_spectrum(W0, W1)
    eps = torch.finfo(dtype).eps
    ref = ref_rounding_reference(W0.double().numpy(), W1.double().numpy())
    name = str(dtype).removeprefix("torch.")
    assert spec.is_delta and spec.dtype == name and spec.dtype_eps == eps
    assert spec.ref_norm == pytest.approx(ref, rel=1e-12)
    assert spec.default_tol() == pytest.approx(eps * ref, rel=1e-12)
    assert "delta rule" in spec.tol_rule() and name in spec.tol_rule()
    s_true = ref_sigma(D)
    s = ref_sigma((W1.double() - W0.double()).numpy())
    assert s_true[r - 1] > 4 * spec.default_tol()  # the planted directions stand well clear of the tolerance
    assert s[r] < spec.default_tol() / 2  # and the rounding noise well below it (Weyl: σ_{r+1} ≤ ‖E‖)
    assert sp.numerical_rank(spec) == int((s > eps * ref).sum()) == r
    Dc = sp.delta_matrix(W0, W1)
    assert Dc.dtype == torch.float32
    new = sp.measures(Dc, stored=(W0, W1))
    assert new["numerical_rank"] == r and new["dtype"] == name and new["computed_dtype"] == "float32"
    assert new["numerical_rank_ref_norm"] == pytest.approx(ref, rel=1e-12)
    assert "delta rule" in new["numerical_rank_tol_rule"] and name in new["numerical_rank_tol_rule"]
    old = sp.measures(Dc)  # the matrix rule on the fp32 difference: max(m, n)·eps32·σ₁(Δ)
    assert old["numerical_rank_ref_norm"] is None and old["numerical_rank_tol_rule"].startswith("max(shape)")
    assert old["numerical_rank"] == int((s > 64 * float(np.finfo(np.float32).eps) * s[0]).sum()) > 2 * r


def test_delta_rule_full_rank_and_zero_deltas():
    rng = np.random.default_rng(11)
    for dtype, scale in ((torch.bfloat16, 0.1), (torch.float32, 1e-4)):
        W0, W1, D = _stored_pair(40, 24, scale * np.linspace(1.0, 2.0, 24), dtype, rng)
        spec = sp.delta_spectrum(W0, W1)
        assert ref_sigma(D)[-1] > 4 * spec.default_tol()
        assert sp.numerical_rank(spec) == 24
    W = torch.from_numpy(rng.standard_normal((12, 9))).to(torch.bfloat16)
    zero = sp.measures(sp.delta_matrix(W, W.clone()), stored=(W, W.clone()))
    assert zero["numerical_rank"] == 0 and zero["numerical_rank_tol"] > 0 and math.isnan(zero["erank"])


def test_delta_rule_uses_the_coarser_storage_dtype():
    rng = np.random.default_rng(12)
    W = torch.from_numpy(rng.standard_normal((16, 10)))
    for a, b, want in ((torch.bfloat16, torch.float32, "bfloat16"), (torch.float32, torch.float16, "float16"),
                       (torch.float16, torch.bfloat16, "bfloat16"), (torch.float64, torch.float32, "float32")):
        tol, dtype, ref = sp.delta_tolerance(W.to(a), W.to(b))
        assert dtype == want and tol == pytest.approx(float(torch.finfo(getattr(torch, want)).eps) * ref, rel=1e-12)
        assert sp.delta_spectrum(W.to(a), W.to(b)).dtype == want
    # fp32 arithmetic on bf16 operands: the difference is float32, the tolerance bf16's; float64 wins the work dtype
    assert sp.delta_matrix(W.to(torch.bfloat16), W.to(torch.bfloat16)).dtype == torch.float32
    assert sp.delta_matrix(W.to(torch.float32), W).dtype == torch.float64
    # numpy operands, blocked accumulation (a block of one row) agree with the reference
    A, B = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))
    assert sp.rounding_reference(A, B) == pytest.approx(ref_rounding_reference(A, B), rel=1e-12)
    old_block = sp.GRAM_BLOCK_ELEMENTS
    try:
        sp.GRAM_BLOCK_ELEMENTS = 1
        assert sp.rounding_reference(A, B) == pytest.approx(ref_rounding_reference(A, B), rel=1e-12)
    finally:
        sp.GRAM_BLOCK_ELEMENTS = old_block


def test_matrix_rule_unchanged_and_delta_bad_input():
    W = MATS["random_tall"]
    spec = sp.spectrum(W)
    assert not spec.is_delta and spec.ref_norm is None
    assert spec.tol_rule() == "max(shape)*eps(float64)*sigma_1 (absolute)"
    assert spec.default_tol() == pytest.approx(48 * _EPS64 * ref_sigma(W)[0], rel=1e-12)
    with pytest.raises(GraftkitError, match="W_rl has") as e:
        sp.delta_spectrum(np.ones((3, 4)), np.ones((4, 3)))
    assert "\n" not in str(e.value)
    with pytest.raises(GraftkitError, match="stored operands"):
        sp.measures(np.ones((3, 4)), stored=(np.ones((4, 3)), np.ones((4, 3))))
    with pytest.raises(GraftkitError, match="floating"):
        sp.delta_tolerance(np.ones((3, 4), dtype=np.int64), np.ones((3, 4)))



def test_every_rank_measure_has_one_home_in_the_registry():
    """The registry (rank/metrics.py) is what computes, names and labels a measure: spectra.measures, the activation
    measures, the view's metric order and the figures' axis titles all read it."""
    import numpy as np

    from graftkit.figures.rank import unit
    from graftkit.rank import metrics as M
    from graftkit.rank.activations import spectrum_measures
    from graftkit.rank.results import METRICS, PAIR_METRICS
    from graftkit.rank.spectra import measures, spectrum

    W = np.random.default_rng(0).standard_normal((24, 16)) @ np.diag(np.geomspace(1, 1e-3, 16))
    got = measures(W)
    sp = spectrum(W)
    assert list(got)[: len(M.SPECTRUM)] == list(M.SPECTRUM) == list(METRICS)
    for name, m in M.SPECTRUM.items():
        if m.of is not None:
            assert got[name] == m(sp.sigma), name
    assert spectrum_measures(sp) == {k: float(got[k]) for k in METRICS}
    assert got["conventions"] == M.CONVENTIONS and PAIR_METRICS == tuple(M.PAIR)
    for name, m in M.MEASURES.items():
        assert unit(name) == m.label and m.convention and m.unit
    zero = spectrum_measures(spectrum(np.zeros((4, 3))))
    for name, m in M.SPECTRUM.items():
        assert (np.isnan(zero[name]) if m.zero is None else zero[name] == m.zero), name


def test_delta_inside_the_principal_subspace_reads_one_and_a_random_one_its_exact_chance():
    """A Δ built inside W₀'s top-k singular subspaces puts all of its energy there, left and right; random Δs put
    k/m and k/n there on average (the exact baseline, within 4 standard errors over 200 draws); W₀ against itself
    overlaps fully, against an unrelated matrix near chance."""
    from graftkit.rank.spectra import chance_energy, delta_energy_in_topk, pair_measures, subspace_overlap

    g = torch.Generator().manual_seed(3)
    m, n, k = 90, 60, 8
    W0 = torch.randn(m, n, dtype=torch.float64, generator=g)
    U, _, Vh = torch.linalg.svd(W0, full_matrices=False)
    inside = U[:, :k] @ torch.randn(k, k, dtype=torch.float64, generator=g) @ Vh[:k]
    for side in ("left", "right"):
        assert delta_energy_in_topk(W0, inside, k, side=side) == pytest.approx(1.0, abs=1e-12)
    draws = [torch.randn(m, n, dtype=torch.float64, generator=g) for _ in range(200)]
    for side, chance in (("left", k / m), ("right", k / n)):
        assert chance_energy((m, n), k, side) == chance
        shares = np.array([delta_energy_in_topk(W0, D, k, side=side) for D in draws])
        assert abs(shares.mean() - chance) < 4 * shares.std() / np.sqrt(len(shares)), (side, shares.mean(), chance)
    assert subspace_overlap(W0, W0, k) == pytest.approx(1.0, abs=1e-12)
    assert subspace_overlap(W0, draws[0], k) < 3 * k / m
    # the pair measures' shares are the separate functions', tall and wide alike
    for W in (W0, W0.T.contiguous()):
        D = 1e-3 * torch.randn(W.shape, dtype=torch.float64, generator=g)
        pm = pair_measures(W, W + D, D, energy_k=k, intruder_k=10)
        assert pm["delta_energy_topk"] == pytest.approx(delta_energy_in_topk(W, D, k), rel=1e-10)
        assert pm["delta_energy_topk_right"] == pytest.approx(delta_energy_in_topk(W, D, k, side="right"), rel=1e-10)
        assert pm["subspace_overlap"] == pytest.approx(subspace_overlap(W, W + D, k), rel=1e-10)
