"""Spectra on a device: the float64 Gram streamed block by block, ``--device`` on ``rank``, deltas ranked in
parallel, and the pair measures from shared SVDs.

What a GPU changes is the order of floating-point sums (whole products instead of upper tiles, other blocks,
cuSOLVER instead of LAPACK). The CPU tests below take the GPU's order (whole products, its blocks) on the
CPU and require every measure to match the default to 1e-10 relative (erank and rankme to 1e-8, ``TAIL``); the CUDA tests (skipped without one) compare
the device itself with the CPU on whole checkpoints.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.rank import delta_ranks, measures, weight_ranks
from graftkit.rank import spectra
from graftkit.rank.spectra import (as_device, delta_energy_in_topk, delta_matrix, intruder_dimensions, pair_measures,
                                   spectral_drift)
from graftkit.weights import open_checkpoint
from planted import planted_pair

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SCALARS = ("erank", "erank_sq", "stable_rank", "participation_ratio", "rankme", "numerical_rank", "top1_energy",
           "sigma_1", "frobenius_sq")
REL = 1e-10


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    sft, rl = planted_pair(tmp_path_factory.mktemp("rank-device"))
    b, r = open_checkpoint(sft), open_checkpoint(rl)
    return b, r, b.taxonomy()


def _matrices():
    """Matrices whose spectra span many decades: a bf16 weight, a long fp32 embedding, a low-rank update
    plus noise, a fat matrix (m < n)."""
    g = torch.Generator().manual_seed(0)
    decay = torch.logspace(0, -6, 96, dtype=torch.float64)
    U, _ = torch.linalg.qr(torch.randn(3000, 96, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(96, 96, generator=g, dtype=torch.float64))
    graded = ((U * decay) @ V.T).to(torch.float32)
    low = (torch.randn(400, 6, generator=g) @ torch.randn(6, 300, generator=g)) + 1e-4 * torch.randn(400, 300, generator=g)
    return {
        "bf16": (torch.randn(700, 96, generator=g) * 0.02).to(torch.bfloat16),
        "graded-embedding": graded,
        "low-rank": low,
        "fat": torch.randn(64, 900, generator=g),
        # float64 entries: every product rounds, so the order of sums shows (a float32 or bf16 product is
        # exact in float64, and at these sizes so are most of its sums)
        "float64": torch.randn(3000, 96, generator=g, dtype=torch.float64) * decay,
    }


#: Measures that weight σ itself (not σ²) take in the tail of small σ, which the Gram resolves only to about
#: sqrt(n·eps64)·σ₁ ≈ 1e-7·σ₁ whatever the engine: between two orders of sums they agree to ~1e-9, not 1e-10.
TAIL = {"erank": 1e-8, "rankme": 1e-8}


def _close(a: dict, b: dict, rel: float = REL) -> list[str]:
    bad = []
    for k in SCALARS:
        x, y = float(a[k]), float(b[k])
        r = max(rel, TAIL.get(k, 0.0)) if rel else 0.0
        if not (x == y or abs(x - y) <= r * max(abs(x), abs(y))):
            bad.append(f"{k}: {x!r} vs {y!r}")
    return bad


def test_the_gpu_order_of_sums_changes_no_measure_beyond_1e10(monkeypatch):
    """Whole products and the GPU's blocks (its path), and small tiles and blocks, run on the CPU, against the
    CPU's default, every measure; the numerical rank equal."""
    mats = _matrices()
    default = {k: measures(W) for k, W in mats.items()}
    # small tiles and blocks, so these matrices really are tiled and blocked
    monkeypatch.setattr(spectra, "GRAM_TILE_MIN_WORK", 1)
    monkeypatch.setattr(spectra, "GRAM_BLOCK_ELEMENTS", 1 << 14)
    tiled = {k: measures(W) for k, W in mats.items()}
    real = spectra._gram_upper
    monkeypatch.setattr(spectra, "_gram_upper", lambda X, device=None, tiles=None: real(X, device, tiles=False))
    monkeypatch.setattr(spectra, "GRAM_BLOCK_ELEMENTS", spectra.GRAM_BLOCK_ELEMENTS_DEVICE)
    whole = {k: measures(W) for k, W in mats.items()}
    # another eigensolver (numpy's LAPACK standing in for cuSOLVER): its rounding moves the small end
    real_eig = torch.linalg.eigvalsh
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda G, UPLO="L": torch.from_numpy(
        np.linalg.eigvalsh(G.numpy(), UPLO=UPLO)) if G.device.type == "cpu" else real_eig(G, UPLO=UPLO))
    other_eig = {k: measures(W) for k, W in mats.items()}
    for k in mats:
        for other in (tiled, whole, other_eig):
            assert not _close(default[k], other[k]), (k, _close(default[k], other[k]))
            assert default[k]["numerical_rank"] == other[k]["numerical_rank"]
    # float32 and bf16 products are exact in float64 and so, at these sizes, are their sums: tiles or whole
    # products give the same bits; another eigensolver does not, at the small end (hence TAIL)
    assert all(default[k][m] == whole[k][m] for k in mats if k != "float64" for m in SCALARS)
    assert any(abs(default[k]["erank"] - other_eig[k]["erank"]) > REL * default[k]["erank"] for k in mats)
    # the orders did differ (else this test would compare a computation with itself)
    assert any(default["float64"][m] != tiled["float64"][m] for m in SCALARS)
    # σ_k = 10^(-6k/95) above max(m, n)·eps(float32)·σ₁ = 3000·2^-23: k ≤ 54
    assert default["graded-embedding"]["numerical_rank"] == 55
    assert default["low-rank"]["numerical_rank"] == 6  # the noise lies under the tolerance


def test_gram_upper_is_the_float64_gram_on_either_path():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(5000, 200, generator=g).to(torch.bfloat16)
    want = X.double().T @ X.double()
    for tiles in (True, False):
        G = spectra._gram_upper(X, "cpu", tiles=tiles)
        assert G.dtype == torch.float64
        np.testing.assert_allclose(torch.triu(G).numpy(), torch.triu(want).numpy(), rtol=1e-12, atol=1e-9)


def test_pair_measures_equal_the_separate_functions():
    """Energy and intruders bit for bit (the same decompositions); the drift, whose σ come from eigh beside
    the vectors where spectral_drift takes eigvalsh, to the eigensolvers' 1e-10."""
    g = torch.Generator().manual_seed(2)
    for shape in ((120, 80), (60, 150)):
        W0 = torch.randn(*shape, generator=g)
        W1 = W0 + 0.05 * torch.randn(*shape, generator=g) + 0.5 * torch.outer(torch.randn(shape[0], generator=g),
                                                                               torch.randn(shape[1], generator=g))
        D = delta_matrix(W0, W1)
        got = pair_measures(W0, W1, D, energy_k=8, intruder_k=10, intruder_eps=0.5)
        assert got["spectral_drift"] == pytest.approx(spectral_drift(W0, W1), rel=REL, abs=0)
        assert got["delta_energy_topk"] == delta_energy_in_topk(W0, D, 8)
        assert got["intruders"] == float(intruder_dimensions(W0, W1, 10, 0.5).count)
        assert got["intruders"] >= 1  # the planted rank-1 direction intrudes
    with pytest.raises(GraftkitError, match="zero matrix"):
        pair_measures(W0, W0, torch.zeros_like(W0), energy_k=8, intruder_k=10)
    with pytest.raises(GraftkitError, match="must be an integer"):
        pair_measures(W0, W1, D, energy_k=0, intruder_k=10)
    with pytest.raises(GraftkitError, match="delta has"):
        pair_measures(W0, W1, D.T, energy_k=8, intruder_k=10)


def test_deltas_in_threads_equal_one_at_a_time(pair):
    b, r, tax = pair
    one = delta_ranks(b, r, tax, workers=1)
    two = delta_ranks(b, r, tax, workers=2)
    assert list(one.coords["tensor"]) == list(two.coords["tensor"])
    np.testing.assert_array_equal(one["value"], two["value"])  # bit for bit: the same arithmetic per matrix
    np.testing.assert_array_equal(one["tol"], two["tol"])
    assert two.attrs["workers"] == 2 and two.attrs["device"] == "cpu"
    seen = []
    delta_ranks(b, r, tax, workers=2, on_tensor=lambda n, nbytes: seen.append((n, nbytes)))
    assert sorted(n for n, _ in seen) == sorted(set(one["tensor_source"].tolist()))
    assert all(nbytes == 2 * b.metas[n].nbytes for n, nbytes in seen)


def test_a_worker_error_is_raised_once_and_stops_the_rest(pair, monkeypatch):
    b, r, tax = pair
    from graftkit.rank import weights as rank_weights

    calls = []
    real = rank_weights.measures

    def failing(D, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise GraftkitError("planted failure", "none")
        return real(D, *a, **k)

    monkeypatch.setattr(rank_weights, "measures", failing)
    with pytest.raises(GraftkitError, match="planted failure"):
        delta_ranks(b, r, tax, workers=2)
    assert torch.get_num_threads() >= 1


def test_device_names_are_checked():
    assert as_device(None) == torch.device("cpu") == as_device("cpu")
    assert as_device(torch.device("cpu")) == torch.device("cpu")
    if not CUDA:
        with pytest.raises(GraftkitError, match="no CUDA device"):
            as_device("cuda:0")
        with pytest.raises(GraftkitError, match="no CUDA device"):
            measures(torch.randn(8, 4), device="cuda")
    with pytest.raises(GraftkitError, match="is not a device"):
        as_device("tpu")


def test_rank_cli_reports_its_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    planted_pair(tmp_path / "runs")
    runner = CliRunner()
    res = runner.invoke(app, ["rank", "--what", "delta", "--device", "cpu", "--json", "--layers", "late"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["device"] == "cpu"
    from graftkit.results.store import read_result

    saved = read_result(data["models"]["rl"]["result_file"])
    assert saved.attrs["device"] == "cpu" and saved.attrs["workers"] >= 1
    assert not any("--device" in n for n in data["models"]["rl"]["notes"])  # --device applies to spectra now
    res = runner.invoke(app, ["rank", "--layers", "late", "--dtype", "float32"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the console wraps lines at its width
    assert "spectra on cpu" in text and "--dtype float32 applies to --what activations" in text
    if not CUDA:
        bad = runner.invoke(app, ["rank", "--device", "cuda"])
        assert bad.exit_code == 2 and "no CUDA device" in bad.output
        assert len(bad.output.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------ on a GPU


def _assert_same_results(cpu, gpu):
    assert list(cpu.coords["tensor"]) == list(gpu.coords["tensor"])
    metrics = list(cpu.coords["metric"])
    for i, name in enumerate(cpu.coords["tensor"]):
        for k, m in enumerate(metrics):
            x, y = cpu["value"][i, k], gpu["value"][i, k]
            if np.isnan(x):
                assert np.isnan(y), (name, m)
            else:
                assert abs(x - y) <= REL * max(abs(x), abs(y)), (str(name), m, x, y)


@needs_cuda
def test_weight_ranks_on_the_gpu_equal_the_cpu(pair):
    b, _, tax = pair
    cpu = weight_ranks(b, tax, device="cpu")
    gpu = weight_ranks(b, tax, device="cuda")
    _assert_same_results(cpu, gpu)
    assert gpu.attrs["device"] == "cuda:0" and gpu.attrs["gpu"] and gpu.attrs["peak_device_bytes"] > 0


@needs_cuda
def test_delta_ranks_on_the_gpu_equal_the_cpu(pair):
    b, r, tax = pair
    _assert_same_results(delta_ranks(b, r, tax, device="cpu"), delta_ranks(b, r, tax, device="cuda"))


@needs_cuda
def test_device_memory_is_the_gram_plus_one_block():
    """A [40000, 256] bf16 matrix kept on the host: its device footprint is the 256² Gram and a block."""
    W = torch.randn(40_000, 256).to(torch.bfloat16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    m = measures(W, device="cuda")
    peak = torch.cuda.max_memory_allocated() - before
    block = spectra.GRAM_BLOCK_ELEMENTS_DEVICE * (8 + 2)  # the block in bf16 and its float64 upcast
    assert peak <= 3 * 256 * 256 * 8 + 2 * block, peak  # the Gram, eigvalsh's workspace, one block
    assert not _close(m, measures(W))


# ------------------------------------------------------------------------------------ the GPU check script


@pytest.mark.slow
def test_gpu_rank_check_small_on_cpu_runs_end_to_end(tmp_path):
    """benchmarks/gpu_rank_check.py on a tiny pair with the CPU on both sides: every check passes and the
    record holds the figures a GPU run reports."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_rank_check.py"), "--device", "cpu",
                           "--small", "--out", str(tmp_path / "check")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads((tmp_path / "check" / "gpu_rank_check.json").read_text())
    assert {r["check"] for r in rec["checks"]} == {"weights-time", "weights-equal-cpu", "delta-equal-cpu"}
    assert all(r["ok"] for r in rec["checks"])
    assert rec["weights"]["matrices"] == 3 * 7 + 2 and rec["weights"]["seconds"] > 0
    assert rec["cpu_subset"]["matrices"] == 7 + 2 and rec["cpu_subset"]["whole_model_estimate_s"] > 0
    assert rec["delta"]["matrices"] == 2 * 7 and not rec["delta"]["mismatches"]


def test_gpu_rank_check_compare_sees_a_difference():
    """The comparison the GPU check relies on reports a value beyond 1e-10 and a NaN mismatch."""
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_rank_check", root / "benchmarks" / "gpu_rank_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from graftkit.results.store import Result

    def res(values):
        v = np.array(values, dtype=np.float64)
        return Result("rank-weights", {"tensor": np.array(["a", "b"], dtype=object),
                                       "metric": np.array(["erank", "stable_rank"], dtype=object)},
                      {"value": (("tensor", "metric"), v)}, {})

    a = res([[1.0, 2.0], [3.0, np.nan]])
    assert mod.compare(a, res([[1.0, 2.0], [3.0, np.nan]])) == []
    assert mod.compare(a, res([[1.0 + 1e-12, 2.0], [3.0, np.nan]])) == []
    assert len(mod.compare(a, res([[1.0, 2.0 + 1e-8], [3.0, np.nan]]))) == 1  # stable rank: 1e-10
    assert mod.compare(a, res([[1.0 + 1e-9, 2.0], [3.0, np.nan]])) == []  # erank: within TAIL
    assert len(mod.compare(a, res([[1.0 + 1e-7, 2.0], [3.0, np.nan]]))) == 1
    assert len(mod.compare(a, res([[1.0, 2.0], [3.0, 1.0]]))) == 1


# ------------------------------------------------------------------------------------ streamed row blocks


def test_tall_tensors_are_ranked_from_row_blocks_bit_for_bit(pair, monkeypatch):
    """Tall matrices read a block at a time from the file give the same values, bit for bit, as when read
    whole; the whole tensor is never read for them."""
    from graftkit.rank import weights as rank_weights

    b, _, tax = pair
    whole = weight_ranks(b, tax)
    monkeypatch.setattr(rank_weights, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(spectra, "GRAM_BLOCK_ELEMENTS", 1 << 10)  # several blocks per matrix
    streamed_names = [n for n in b.metas if rank_weights._row_blocks(b, n) is not None]
    tall = [n for n, m in b.metas.items() if len(m.shape) == 2 and m.shape[0] > m.shape[1]]
    assert streamed_names == tall and tall  # the embedding and every tall projection
    read = []
    real_read = type(b).read
    monkeypatch.setattr(type(b), "read", lambda self, n: read.append(n) or real_read(self, n))
    blocked = weight_ranks(b, tax)
    assert not set(read) & set(tall)
    monkeypatch.setattr(rank_weights, "STREAM_MIN_BYTES", 1 << 62)
    ref = weight_ranks(b, tax)  # the same small blocks, every tensor read whole
    assert set(tall) <= set(read)
    np.testing.assert_array_equal(blocked["value"], ref["value"])
    np.testing.assert_allclose(blocked["value"], whole["value"], rtol=1e-12)


def test_row_blocks_are_checked_and_report_nan():
    from graftkit.rank.spectra import RowBlocks

    W = torch.randn(40, 8)
    W[3, 2] = float("nan")
    rb = RowBlocks((40, 8), torch.float32, lambda n: (W[i:i + n] for i in range(0, 40, n)))
    with pytest.raises(GraftkitError, match=r"W \(shape \[40, 8\]\) holds NaN or inf"):
        measures(rb)
    with pytest.raises(GraftkitError, match="holds NaN or inf"):
        measures(rb, method="svd")  # read whole, then checked
    with pytest.raises(GraftkitError, match="expected a tall matrix"):
        RowBlocks((8, 8), torch.float32, lambda n: iter(()))
    with pytest.raises(GraftkitError, match="expected float32, bfloat16 or float16"):
        RowBlocks((40, 8), torch.float64, lambda n: iter(()))
    ok = torch.randn(40, 8)
    good = RowBlocks((40, 8), torch.float32, lambda n: (ok[i:i + n] for i in range(0, 40, n)))
    assert not _close(measures(good), measures(ok), 0.0)


def _gpu_rank_check_module():
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    spec = importlib.util.spec_from_file_location("gpu_rank_check", root / "benchmarks" / "gpu_rank_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _without_blake3(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "blake3" else real(name, *a))


def test_gpu_rank_check_blake3_present_needs_nothing(tmp_path):
    assert _gpu_rank_check_module().ensure_blake3(tmp_path / "none") is None


def test_gpu_rank_check_without_blake3_or_its_wheel_stops_with_the_fix(tmp_path, monkeypatch, capsys):
    mod = _gpu_rank_check_module()
    _without_blake3(monkeypatch)
    with pytest.raises(SystemExit) as e:
        mod.ensure_blake3(tmp_path / "wheels")
    assert e.value.code == 2
    msg = capsys.readouterr().err.strip()
    assert "blake3 is not installed" in msg and f"no blake3 wheel in {tmp_path / 'wheels'}" in msg
    assert "make gpu-wheels" in msg and "\n" not in msg


def test_gpu_rank_check_with_a_wheel_that_does_not_install_says_so(tmp_path, monkeypatch, capsys):
    mod = _gpu_rank_check_module()
    _without_blake3(monkeypatch)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "blake3-1.0.0-cp27-cp27m-win32.whl").write_bytes(b"not a wheel")
    with pytest.raises(SystemExit) as e:
        mod.ensure_blake3(wheels)
    assert e.value.code == 2
    assert f"none of the 1 blake3 wheel(s) in {wheels} installs here" in capsys.readouterr().err
