"""Activation ranks: streamed fp64 moments against an SVD of the stacked activations, token selection,
hooks vs TransformerLens, HF hidden states, errors, the CLI, and flat memory in the prompt count."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graftkit.agent import load_policy
from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.rank import METRICS, measures
from graftkit.rank.activations import (
    accumulate, activation_ranks, encode_prompt, hooks_runner, merge, moments, probe_prompts, prompts_from_file,
    select_tokens,
)
from graftkit.results.store import read_result

sys.path.insert(0, str(Path(__file__).parent))
from conftest import make_tiny_lm, make_tiny_tokenizer  # noqa: E402

RNG = np.random.default_rng(0)
# word prompts of 0..11 words; with BOS, lengths 1..12 (a one-token prompt has only position 0)
PROMPTS = [" ".join(f"w{i}" for i in RNG.integers(0, 60, k)) for k in [0, *RNG.integers(1, 12, 22)]]


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Tiny Qwen3 and Llama policies saved as HF folders, loaded back (float32)."""
    out = {}
    for arch in ("qwen3", "llama"):
        d = tmp_path_factory.mktemp(arch)
        make_tiny_lm(arch, num_hidden_layers=3).save_pretrained(d)
        make_tiny_tokenizer().save_pretrained(d)
        out[arch] = d
    return out


def _hf_hidden(model, ids: list[int]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states


def _reference(hidden, L, tokens, centred) -> np.ndarray:
    """The stacked activation matrix of hidden state L from HF's output_hidden_states of each prompt
    run alone (no padding), position 0 dropped; centred by its column mean if asked."""
    rows = []
    for hs in hidden:
        h = hs[L][0].double().numpy()  # [T, d]
        rows.append(h[1:] if tokens == "all" else h[-1:] if len(h) > 1 else h[:0])
    X = np.concatenate(rows)
    return X - X.mean(0) if centred else X


def _independent(X: np.ndarray, eps_dtype=np.float32) -> dict[str, float]:
    s = np.linalg.svd(X, compute_uv=False)
    p, q = s / s.sum(), s**2 / (s**2).sum()
    ent = lambda v: -(v[v > 0] * np.log(v[v > 0])).sum()  # noqa: E731
    return {"erank": np.exp(ent(p)), "erank_sq": np.exp(ent(q)), "stable_rank": (s**2).sum() / s[0] ** 2,
            "participation_ratio": (s**2).sum() ** 2 / (s**4).sum(), "sigma_1": s[0], "frobenius_sq": (s**2).sum(),
            "top1_energy": s[0] ** 2 / (s**2).sum(),
            "numerical_rank": int((s > max(X.shape) * np.finfo(eps_dtype).eps * s[0]).sum())}


@pytest.mark.parametrize("tokens", ["last", "all"])
@pytest.mark.parametrize("centred", [True, False])
def test_moments_equal_svd_of_stacked_activations(tok, tokens, centred):
    model = make_tiny_lm("qwen3", num_hidden_layers=3)
    res = activation_ranks(model, tok, PROMPTS, "all", tokens=tokens, centred=centred, batch_size=5)
    assert list(res.coords["layer"]) == [0, 1, 2, 3] and list(res["block"]) == [-1, 0, 1, 2]
    col = {m: k for k, m in enumerate(res.coords["metric"])}
    hidden = [_hf_hidden(model, encode_prompt(tok, p)) for p in PROMPTS]
    for i, L in enumerate(res.coords["layer"][:-1]):  # HF's last hidden state has the final norm: see below
        X = _reference(hidden, int(L), tokens, centred)
        assert res["n_tokens"][i] == X.shape[0]
        ref = _independent(X)
        for m, v in ref.items():
            assert res["value"][i, col[m]] == pytest.approx(v, rel=1e-6), m
        # and every measure, rankme included, equals spectra.measures on the stacked float32 matrix
        full = measures(X.astype(np.float32).astype(np.float64), method="svd", tol=float(res["tol"][i]))
        for m in METRICS:
            assert res["value"][i, col[m]] == pytest.approx(full[m], rel=1e-6), m
    if tokens == "last":  # 22 tokens < d = 32: rank-deficient, the zero eigenvalues come out as exact zeros
        assert res["value"][:, col["numerical_rank"]].max() <= res["n_tokens"][0] - centred


def test_padded_batches_equal_one_prompt_at_a_time(tok):
    model = make_tiny_lm("llama", num_hidden_layers=3)
    for tokens in ("last", "all"):
        one = activation_ranks(model, tok, PROMPTS, "all", tokens=tokens, batch_size=1)
        padded = activation_ranks(model, tok, PROMPTS, "all", tokens=tokens, batch_size=16)
        np.testing.assert_array_equal(one["n_tokens"], padded["n_tokens"])
        np.testing.assert_allclose(padded["value"], one["value"], rtol=1e-6)


def test_position_zero_is_dropped_and_padding_never_counted(tok):
    B, T, d = 3, 5, 4
    hidden = torch.arange(B * T * d, dtype=torch.float32).reshape(B, T, d)
    hidden[:, 0] = 1e6  # position 0 would stand out
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    hidden[mask == 0] = -1e6  # so would padding
    last = select_tokens(hidden, mask, "last")
    torch.testing.assert_close(last, torch.stack([hidden[0, 2], hidden[2, 4]]))  # the 1-token row gives nothing
    every = select_tokens(hidden, mask, "all")
    assert every.shape == (2 + 0 + 4, d) and every.abs().max() < 1e6
    # end to end: counts are (len − 1) per prompt, the one-token prompt contributes nothing
    lens = [len(encode_prompt(tok, p)) for p in PROMPTS]
    assert min(lens) == 1
    model = make_tiny_lm("qwen3")
    r_all = activation_ranks(model, tok, PROMPTS, "0", tokens="all")
    r_last = activation_ranks(model, tok, PROMPTS, "0", tokens="last")
    assert r_all["n_tokens"][0] == sum(n - 1 for n in lens)
    assert r_last["n_tokens"][0] == sum(n > 1 for n in lens)
    with pytest.raises(GraftkitError, match="single token"):
        activation_ranks(model, tok, ["", ""], tokens="all")


def test_moments_merge_and_accumulate():
    g = torch.Generator().manual_seed(1)
    A, B = torch.randn(7, 5, generator=g), torch.randn(4, 5, generator=g) + 3
    whole = moments(torch.cat([A, B]))
    for m in (merge(moments(A), moments(B)), accumulate(accumulate(None, A), B)):
        assert m.count == 11 and m.outer.dtype == torch.float64
        torch.testing.assert_close(m.total, whole.total, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(m.outer, whole.outer, rtol=1e-13, atol=1e-13)
    X = torch.cat([A, B]).double()
    torch.testing.assert_close(whole.outer, X.T @ X)


def test_hooks_equal_hf_hidden_states_exactly(tok):
    model = make_tiny_lm("qwen3", num_hidden_layers=3)
    ids = encode_prompt(tok, PROMPTS[3])
    hs = _hf_hidden(model, ids)
    got = {}
    run = hooks_runner(model, [0, 1, 2, 3], lambda L, h: got.__setitem__(L, h.clone()))
    with torch.no_grad():
        run(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    for L in (0, 1, 2):
        assert torch.equal(got[L], hs[L]), L
    # the last block's output is taken before the final norm; HF's last hidden state is after it
    assert not torch.allclose(got[3], hs[3])
    with torch.no_grad():
        assert torch.equal(model.model.norm(got[3]), hs[3])


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_hooks_and_transformer_lens_agree(saved, arch):
    pytest.importorskip("transformer_lens")
    policy = load_policy(saved[arch])
    before = [type(b).__name__ for b in policy.model.model.layers]
    for tokens, centred in (("last", True), ("all", False)):
        h = activation_ranks(policy, None, PROMPTS, "all", tokens=tokens, centred=centred, backend="hooks")
        lens = activation_ranks(policy, None, PROMPTS, "all", tokens=tokens, centred=centred, backend="lens")
        np.testing.assert_array_equal(h["n_tokens"], lens["n_tokens"])
        np.testing.assert_allclose(lens["value"], h["value"], rtol=1e-6)
        assert lens.attrs["backend"] == "lens" and "hook_resid_post" in lens.attrs["hook_points"]
    early = activation_ranks(policy, None, PROMPTS, "early", backend="lens")  # stops after block 0
    assert list(early.coords["layer"]) == [1]
    np.testing.assert_allclose(early["value"], activation_ranks(policy, None, PROMPTS, "early")["value"], rtol=1e-6)
    # the bridge booted on a copy: the policy's own blocks and attention are untouched
    assert [type(b).__name__ for b in policy.model.model.layers] == before


def test_lens_refuses_an_unsupported_architecture_and_hooks_take_it(tok):
    pytest.importorskip("transformer_lens")
    from models import tiny_model

    model = tiny_model("qwen2_vl")  # TransformerLens 4.3 has no bridge for Qwen2-VL
    with pytest.raises(GraftkitError) as e:
        activation_ranks(model, tok, PROMPTS[:4], backend="lens")
    assert "Qwen2VLForConditionalGeneration" in str(e.value) and "--backend hooks" in str(e.value)
    res = activation_ranks(model, tok, PROMPTS[:6], "all", tokens="all")
    assert list(res.coords["layer"]) == [0, 1, 2, 3]  # the text decoder's 3 blocks, not the 2 vision blocks
    ids = encode_prompt(tok, PROMPTS[2])
    got = {}
    hooks_runner(model, [1, 2], lambda L, h: got.__setitem__(L, h.clone()))(
        torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    hs = _hf_hidden(model, ids)
    assert torch.equal(got[1], hs[1]) and torch.equal(got[2], hs[2])


def test_layer_errors_and_bad_options(tok):
    model = make_tiny_lm("qwen3")  # 2 decoder layers
    with pytest.raises(GraftkitError, match="outside the model's decoder layers 0–1"):
        activation_ranks(model, tok, PROMPTS, "7")
    with pytest.raises(GraftkitError, match="selects no decoder block"):
        activation_ranks(model, tok, PROMPTS, "late")  # band rule: 2 layers have no late third
    with pytest.raises(GraftkitError, match="--tokens"):
        activation_ranks(model, tok, PROMPTS, tokens="first")
    with pytest.raises(GraftkitError, match="--backend"):
        activation_ranks(model, tok, PROMPTS, backend="nnsight")
    with pytest.raises(GraftkitError, match="no probe prompts"):
        activation_ranks(model, tok, [])


def test_probe_prompts_are_the_policys_first_turn(tmp_path):
    from graftkit.agent import Policy, tiny_tokenizer
    from graftkit.webenv import make_env, render_text

    a, b = probe_prompts("click-button,enter-text", 5, seed=3), probe_prompts("click-button,enter-text", 5, seed=3)
    assert a == b and len(a) == 5
    obs = make_env("enter-text").reset(3 + 3 // 2)  # prompt 3: task 1, episode seed + 1
    words = sorted({w for p in a for w in p.split()})
    policy = Policy(torch.nn.Linear(1, 1), tiny_tokenizer(words))
    assert encode_prompt(policy.tokenizer, a[3]) == policy.prompt_ids(render_text(obs), [])
    assert a[3].endswith("previous: none\naction:")
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\n  second  \n")
    assert prompts_from_file(f) == ["first prompt", "second"]
    f.write_text("\n \n")
    with pytest.raises(GraftkitError, match="no non-empty line"):
        prompts_from_file(f)
    with pytest.raises(GraftkitError, match="no such probe file"):
        prompts_from_file(tmp_path / "missing.txt")
    with pytest.raises(GraftkitError, match="unknown task"):
        probe_prompts("no-such-task", 3)


@pytest.mark.slow
def test_cli_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()
    from planted import planted_pair

    planted_pair(tmp_path / "runs")  # a tiny SFT and RL pair in the current run
    res = runner.invoke(app, ["rank", "--what", "activations", "--probes", "12", "--tokens", "all", "--json",
                              "--metric", "erank,participation_ratio"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert sorted(data["models"]) == ["rl", "sft"] and data["what"] == "activations"
    sft = data["models"]["sft"]
    assert [r["layer"] for r in sft["layers"]] == list(range(7)) and sft["layers"][0]["block"] is None
    saved = read_result(sft["result_file"])
    assert Path(sft["result_file"]).name == "rank-activations-sft.h5"
    assert saved.kind == "rank-activations" and saved.attrs["tokens"] == "all" and saved.attrs["centred"] is True
    assert saved.attrs["position_0"] == "dropped" and saved.attrs["dtype"] == "float64 covariance"
    assert "divide by n" in saved.attrs["conventions"]["centred"] and saved.attrs["n_prompts"] == 12
    assert saved.attrs["model"]["fingerprint"] and saved.attrs["numerical_rank_tol_rule"]
    k = list(saved.coords["metric"]).index("erank")
    assert [r["erank"] for r in sft["layers"]] == pytest.approx(list(saved["value"][:, k]))
    # the same numbers from the API on the same probes
    api = activation_ranks(load_policy(Path(sft["path"])), None, probe_prompts("all", 12), "all", tokens="all")
    np.testing.assert_allclose(api["value"], saved["value"], rtol=1e-9)
    # a probe file, late layers, the lens backend, uncentred: table output
    probes = tmp_path / "probes.txt"
    probes.write_text("click button 3\ntype text ok\n")
    res = runner.invoke(app, ["rank", "--what", "activations", "--model", sft["path"], "--probe-file", str(probes),
                              "--layers", "late", "--backend", "lens", "--no-centred"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "runs" / "results" / "rank-activations-sft-late.h5").is_file()
    late = read_result(tmp_path / "runs" / "results" / "rank-activations-sft-late.h5")
    assert list(late.coords["layer"]) == [5, 6] and late.attrs["backend"] == "lens" and not late.attrs["centred"]
    bad = runner.invoke(app, ["rank", "--what", "activations", "--layers", "9", "--probes", "2"])
    assert bad.exit_code == 2 and "outside the model's decoder layers 0–5" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    bad = runner.invoke(app, ["rank", "--what", "activations", "--tokens", "first"])
    assert bad.exit_code == 2 and "--tokens" in bad.output


# ---------------------------------------------------------------------------------------------- memory


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _heap_in_use() -> int:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    mi = libc.mallinfo2()
    return int(mi.uordblks + mi.hblkhd)  # torch's CPU tensors are malloc'd (small chunks or mmapped)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="measures glibc's heap (mallinfo2)")
def test_memory_stays_flat_as_prompts_grow_tenfold(tok):
    """Peak heap in use over the batches, P vs 10·P prompts (of one length, so every batch has one
    shape): flat, while keeping the hidden states would have added their full size. Both runs are warmed
    up first: the first batch of a new sequence length fills bounded shape-keyed caches below torch."""
    try:
        _heap_in_use()
    except (OSError, AttributeError):
        pytest.skip("glibc mallinfo2 not available")
    rng = np.random.default_rng(1)
    P = [" ".join(f"w{i}" for i in rng.integers(0, 60, 30)) for _ in range(4)]  # 31 tokens each
    model = make_tiny_lm("qwen3", hidden_size=128, head_dim=16)

    def peak(prompts) -> int:
        top, base = [0], _heap_in_use()
        activation_ranks(model, tok, prompts, "all", tokens="all", batch_size=8,
                         on_batch=lambda n: top.__setitem__(0, max(top[0], _heap_in_use() - base)))
        return top[0]

    peak(P), peak(P * 10)  # warm up
    small, large = peak(P), peak(P * 10)
    stored_extra = 9 * len(P) * 30 * 128 * 4 * 3  # float32 hidden states of 3 layers, 9·P more prompts
    assert large < 1.5 * small, (small, large)
    assert large - small < 0.2 * stored_extra, (small, large, stored_extra)
