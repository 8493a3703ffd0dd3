"""Behavioural divergence by KL: the per-token KL against an independent float64 computation, KL(P‖P) = 0, fixed
rollouts, the graft sweep's reproduced fractions (exactly 0 at ∅ and 1 at the full graft), their Shapley values
summing to the total, the grafts restored bit for bit, the clustered intervals, and `graftkit kl` and
`graft --metric kl|both` end to end."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graftkit.agent.kl import (  # noqa: E402
    FixedEpisode,
    FixedEpisodes,
    FixedTurn,
    action_log_softmax,
    play_fixed,
    score_pair,
    token_kl,
)
from graftkit.core.errors import GraftkitError  # noqa: E402

TASKS = ("click-button", "arithmetic")  # a multi-turn web task and a one-turn verifiable one


# ------------------------------------------------------------------------------------------ the pure core


def _peaked(seed: int):
    """A tiny untied decoder whose output head is scaled up, so its next-token distributions are peaked (KL of
    order one between two of them, where float32 rounding would be visible)."""
    from conftest import make_tiny_lm

    m = make_tiny_lm("llama", seed=seed, tied=False)
    with torch.no_grad():
        m.lm_head.weight.mul_(40.0)
    return m


def _fixed(turns: list[tuple[list[int], list[int]]]) -> FixedEpisodes:
    eps = tuple(FixedEpisode("t", 0, e, e, f"{e:016x}", False, (FixedTurn(tuple(p), tuple(a), ""),))
                for e, (p, a) in enumerate(turns))
    return FixedEpisodes("rl", ("t",), (0,), len(eps), eps)


def _reference_kl(p_model, q_model, turns) -> tuple[np.ndarray, np.ndarray]:
    """Per action token KL(P‖Q) and log P(played) − log Q(played), one unpadded sequence at a time in float64."""
    p64, q64 = copy.deepcopy(p_model).double(), copy.deepcopy(q_model).double()
    kl, ratio = [], []
    with torch.no_grad():
        for prompt, action in turns:
            seq = torch.tensor([prompt + action])
            lp = torch.log_softmax(p64(input_ids=seq).logits[0], -1)  # [L, V]
            lq = torch.log_softmax(q64(input_ids=seq).logits[0], -1)
            for k, tok in enumerate(action):
                t = len(prompt) - 1 + k  # position t predicts token t + 1
                kl.append(float((lp[t].exp() * (lp[t] - lq[t])).sum()))
                ratio.append(float(lp[t, tok] - lq[t, tok]))
    return np.array(kl), np.array(ratio)


def test_kl_equals_an_independent_float64_computation():
    p, q = _peaked(0), _peaked(1)
    rng = np.random.default_rng(0)
    turns = [(rng.integers(4, 64, rng.integers(2, 12)).tolist(), rng.integers(4, 64, rng.integers(1, 6)).tolist())
             for _ in range(7)]
    fixed = _fixed(turns)
    want_kl, want_ratio = _reference_kl(p, q, turns)
    assert want_kl.mean() > 0.1  # peaked enough that rounding would show
    got = score_pair(p, q, fixed, pad_id=0, batch_size=3)  # batches of 3 right-padded turns
    assert got.kl.dtype == np.float32 and got.kl.shape == (fixed.n_tokens,)
    np.testing.assert_allclose(got.kl, want_kl, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(got.logp_p - got.logp_q, want_ratio, rtol=2e-4, atol=1e-4)
    # the full distributions, and KL from them, are the same numbers
    lp, lq = action_log_softmax(p, fixed, 0), action_log_softmax(q, fixed, 0)
    assert lp.shape == (fixed.n_tokens, 64) and lp.dtype == torch.float32
    np.testing.assert_allclose(token_kl(lp, lq).numpy(), got.kl, rtol=1e-6, atol=1e-7)
    assert fixed.per_episode(got.kl).shape == (1, 1, 7)
    assert fixed.per_episode(got.kl).sum() == pytest.approx(float(got.kl.astype(np.float64).sum()))


def test_kl_of_a_policy_with_itself_is_zero_and_zero_mass_adds_nothing():
    p = _peaked(0)
    fixed = _fixed([([5, 6, 7], [8, 9]), ([10], [11, 12, 13])])
    same = score_pair(p, p, fixed, 0)
    assert (same.kl == 0).all() and (same.logp_p == same.logp_q).all()
    lp = torch.log_softmax(torch.tensor([[0.0, 1.0, -float("inf")]]), -1)
    lq = torch.log_softmax(torch.tensor([[1.0, 0.0, 2.0]]), -1)
    kl = token_kl(lp, lq)
    p_ = lp.exp()[0]
    assert torch.isfinite(kl).all() and float(kl) == pytest.approx(float((p_[:2] * (lp[0, :2] - lq[0, :2])).sum()))
    with pytest.raises(GraftkitError, match="one vocabulary"):
        token_kl(lp, lq[:, :2])


def test_fixed_rollouts_keep_every_turn_and_replay_identically():
    from graftkit.agent import task_words, tiny_policy, tiny_words

    policy = tiny_policy(tiny_words(TASKS) or task_words(), "nano", seed=0)
    fixed = play_fixed(policy, "sft", TASKS, [0, 1], 2, max_new_tokens=4)
    again = play_fixed(policy, "sft", TASKS, [0, 1], 2, max_new_tokens=4)
    assert fixed == again  # sampled at T=1, every row seeded: the same tokens
    assert fixed.shape == (2, 2, 2) and [e.task for e in fixed.played[:4]] == ["click-button"] * 4
    problems = [e for e in fixed.played if e.task == "arithmetic"]
    assert all(len(e.turns) == 1 for e in problems)  # a verifiable problem is one turn
    web = [e for e in fixed.played if e.task == "click-button"]
    assert all(1 <= len(e.turns) for e in web)
    for e in web:
        for t in e.turns:
            assert 1 <= len(t.action_ids) <= 4 and len(t.prompt_ids) > 0
    assert fixed.token_episode().shape == fixed.token_ids().shape == (fixed.n_tokens,)
    assert fixed.tokens().sum() == fixed.n_tokens
    assert np.bincount(fixed.token_episode(), minlength=8).tolist() == fixed.tokens().ravel().tolist()
    from graftkit.agent.evaluate import plan_episodes

    _, _, items, _ = plan_episodes(list(TASKS), [0, 1], 2)
    assert (fixed.items() == items).all()  # the held-out items evaluation plays


def test_clustered_mean_and_ratio_intervals():
    from graftkit.stats import mean_interval, ratio_interval

    rng = np.random.default_rng(1)
    x = rng.gamma(2.0, 1.0, 200)
    c = np.repeat(np.arange(100), 2)
    m = mean_interval(x, clusters=c, n_boot=2000)
    assert m.estimate == pytest.approx(x.mean()) and m.low < m.estimate < m.high and m.df in (99, 199)
    n = rng.integers(1, 20, 200).astype(float)
    r = ratio_interval(x * n, n, clusters=c, n_boot=2000)
    assert r.estimate == pytest.approx((x * n).sum() / n.sum()) and r.low < r.estimate < r.high
    # rows as clusters: the same as labels
    assert mean_interval(x.reshape(100, 2), n_boot=500).bounds == mean_interval(x, clusters=c, n_boot=500).bounds
    # coverage of the mean of clustered values (random cluster effects), roughly at the level
    hits = 0
    for k in range(200):
        g = np.random.default_rng(100 + k)
        y = (g.normal(0, 1, 30)[:, None] + g.normal(0, 1, (30, 4))).ravel()
        iv = mean_interval(y, clusters=np.repeat(np.arange(30), 4), n_boot=400, seed=k)
        hits += iv.low <= 0 <= iv.high
    assert 0.88 <= hits / 200 <= 0.99
    with pytest.raises(GraftkitError, match="one cluster label per episode"):
        mean_interval(x, clusters=c[:5])


# ------------------------------------------------------------------------------------- the graft sweep


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny SFT policy and an RL child moved in every decoder-layer matrix (attention and MLP: planted), by
    half its mean magnitude: a fine-tune by graftkit's pair rule, with a clear behavioural change."""
    from graftkit.agent import tiny_policy, tiny_words
    from graftkit.weights import describe, open_checkpoint, save_model

    root = tmp_path_factory.mktemp("kl-policies")
    sft = tiny_policy(tiny_words(TASKS), "nano", seed=0)
    paths = {"sft": save_model(root / "sft", sft.model, sft.tokenizer, provenance={"producer": "test"})}
    d = describe(open_checkpoint(paths["sft"]))
    m = tiny_policy(tiny_words(TASKS), "nano", seed=0).model
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, q in m.named_parameters():
            if "layers." in n and q.dim() == 2:
                q.add_(0.5 * q.abs().mean() * torch.randn(q.shape, generator=g))
    paths["rl"] = save_model(root / "rl", m, sft.tokenizer, provenance={
        "producer": "test (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    return paths


def test_sweep_kl_fractions_shapley_and_bit_exact_restore(pair):
    from graftkit.agent import Decode, load_policy
    from graftkit.graft import attribution as A
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL, EpisodeGrid, SweepResult, SweepWorker, \
        expand_sweep, sweep_result
    from graftkit.weights import open_checkpoint, tensor_bits

    base, rl = open_checkpoint(pair["sft"]), open_checkpoint(pair["rl"])
    policy = load_policy(pair["sft"])
    exps = expand_sweep("factorial", ("attn", "mlp"), ("embed", "attn", "mlp", "norm", "lm_head"))
    grid = EpisodeGrid(TASKS, (0, 1), 1, Decode(max_new_tokens=4))
    worker = SweepWorker(base, {"A": rl}, policy=policy)
    kl = worker.score_kl("A", exps, grid)
    worker.close()
    for name in base.metas:  # every tensor the grafts wrote is the base's again, bit for bit
        got = tensor_bits(dict(policy.model.named_parameters())[name].detach())
        assert np.array_equal(got.view(np.uint32), base.array(name).view(np.uint32)), name
    res = SweepResult.from_result(sweep_result("factorial", exps, {}, grid.tasks, grid.seeds, 1, ("attn", "mlp"),
                                               metric="kl", kl=kl, n_boot=500))
    assert not res.has_success and res.has_kl and res.sides == ["rl", "sft"]
    for s in ("rl", "sft"):
        assert res.reproduced(BASE_LABEL, s).tolist() == [0.0, 0.0, 0.0]  # exactly, interval included
        assert res.reproduced(RL_LABEL, s).tolist() == [1.0, 1.0, 1.0]
    assert res.kl_per_token(RL_LABEL, "rl") == 0 and res.kl_per_token(BASE_LABEL, "sft") == 0
    assert res.kl_per_token(BASE_LABEL, "rl") > 0 and res.kl_per_token(RL_LABEL, "sft") > 0
    # the fractions by their definition, from the stored per-episode KL
    for s, (ref, sign) in {"rl": (BASE_LABEL, -1), "sft": (RL_LABEL, 1)}.items():
        den = res.kl_episode(ref, s).sum()
        for c in res.configs:
            ratio = res.kl_episode(c, s).sum() / den
            assert res.reproduced(c, s)[0] == pytest.approx(1 - ratio if sign < 0 else ratio, abs=1e-12)
            lo, hi = res.reproduced(c, s)[1:]
            assert lo <= res.reproduced(c, s)[0] + 1e-9 and res.reproduced(c, s)[0] <= hi + 1e-9
        v = {frozenset(): 0.0, frozenset({"attn"}): res.reproduced("attn", s)[0],
             frozenset({"mlp"}): res.reproduced("mlp", s)[0], frozenset({"attn", "mlp"}): res.reproduced("attn+mlp", s)[0]}
        shap = res.kl_attribution("kl_shapley", s)[:, 0]
        total = v[frozenset({"attn", "mlp"})] - v[frozenset()]
        assert shap.sum() == pytest.approx(total, abs=1e-9) and res.kl_total(s)[0] == pytest.approx(total, abs=1e-9)
        want = [A.contrast_value(v, A.shapley_weights(("attn", "mlp"), g)) for g in ("attn", "mlp")]
        assert shap == pytest.approx(want, abs=1e-9)
        main = res.kl_attribution("kl_main_effect", s)[:, 0]
        assert main == pytest.approx([A.contrast_value(v, A.main_effect_weights(("attn", "mlp"), g))
                                      for g in ("attn", "mlp")], abs=1e-9)
        assert res.kl_attribution("kl_interaction", s).shape == (2, 2, 3)


def _cli(args, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from graftkit.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


EPISODES = ("--tasks", ",".join(TASKS), "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4")


def test_kl_and_graft_metric_kl_end_to_end_agree(pair, tmp_path, monkeypatch):
    from graftkit.evaluation.kl import KLResult
    from graftkit.graft.experiments import BASE_LABEL, RL_LABEL, SweepResult
    from graftkit.results.store import read_result

    j = _cli(["kl", "--model", pair["rl"], *EPISODES, "--top", "3", "--n-boot", "500", "--json"], tmp_path,
             monkeypatch)
    assert Path(j["file"]).name == "kl-rl-vs-sft.h5" and j["base"] == str(pair["sft"])  # base: the recorded parent
    v = KLResult.read(j["file"])
    assert [r["task"] for r in j["tasks"]] == [*TASKS, "all"] and v.sides == ["rl", "sft"]
    for s in v.sides:  # per token: the stored per-token KL pooled again
        k = v.token_values(s).astype(np.float64)
        assert j["tasks"][-1][s]["kl_per_token"][0] == pytest.approx(k.sum() / v.tokens(s).sum(), rel=1e-5)
        assert j["tasks"][-1][s]["kl_per_episode"][0] == pytest.approx(v.episode_kl(s).mean(), rel=1e-9)
        assert j["tasks"][-1][s]["tokens"] == k.size == int(v.tokens(s).sum())
    assert v.conventions["direction"].startswith("forward KL") and v.conventions["log_base"] == "e (nats)"
    gained, lost = j["top"]["token"]["gained"], j["top"]["token"]["lost"]
    assert 0 < len(gained) <= 3 and all(g["log_ratio"] > 0 for g in gained) and all(x["log_ratio"] < 0 for x in lost)
    assert [g["log_ratio"] for g in gained] == sorted((g["log_ratio"] for g in gained), reverse=True)
    # graft --metric kl on the same episodes: its ∅ is SFT and its full graft RL, grafted in place
    g = _cli(["graft", "--from", pair["rl"], "--sweep", "factorial", "--groups", "attn,mlp", "--metric", "kl",
              *EPISODES, "--json"], tmp_path, monkeypatch)
    assert g["metric"] == "kl" and Path(g["files"]["A"]).name == "graft-factorial-rl-kl.h5"
    sweep = SweepResult.read(g["files"]["A"])
    assert not sweep.has_success and "success" not in g["runs"]["A"]["configs"][0]
    assert sweep.kl_per_token(BASE_LABEL, "rl") == pytest.approx(j["tasks"][-1]["rl"]["kl_per_token"][0], rel=1e-5)
    assert sweep.kl_per_token(RL_LABEL, "sft") == pytest.approx(j["tasks"][-1]["sft"]["kl_per_token"][0], rel=1e-5)
    kl_json = g["runs"]["A"]["kl"]["sides"]
    for s in ("rl", "sft"):
        shap = [kl_json[s]["attribution"][grp]["shapley"][0] for grp in ("attn", "mlp")]
        assert sum(shap) == pytest.approx(kl_json[s]["shapley_total"][0], abs=1e-9)
        assert kl_json[s]["shapley_total"][0] == pytest.approx(1.0)  # attn + mlp is every group RL moved
    # --metric both: success and KL in one result, at the success name
    b = _cli(["graft", "--from", pair["rl"], "--sweep", "single", "--groups", "attn,mlp", "--metric", "both",
              *EPISODES, "--json"], tmp_path, monkeypatch)
    res = read_result(b["files"]["A"])
    assert Path(b["files"]["A"]).name == "graft-single-rl.h5" and res.attrs["metric"] == "both"
    assert {"success", "diff_vs_base", "group_effect", "kl_reproduced", "kl_group_effect"} <= set(res.data)
    assert res.dims("kl_group_effect") == ("side", "group", "bound")
    c = b["runs"]["A"]["configs"][0]
    assert c["config"] == BASE_LABEL and "success" in c and c["kl"]["rl"]["reproduced"] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("fields, error", [
    ({"sweep": "single", "metric": "entropy"}, "--metric 'entropy' is not an option"),
    ({"sweep": "single", "metric": "kl", "sample": True}, "--sample applies to --metric success and both"),
    ({"sweep": "single", "metric": "kl", "vs": Path("rl2")}, "--vs tests a double dissociation of success effects"),
    ({"sweep": "single", "metric": "both", "vs": Path("rl2")}, None),
    ({"groups": "attn", "metric": "kl"}, "--metric applies to --eval, --sweep and --vs, not to an export"),
    ({"groups": "attn", "eval_": True, "metric": "both"}, None),
])
def test_graft_metric_is_checked(fields, error):
    from graftkit.graft.commands import GraftConfig

    if error is None:
        GraftConfig(rl=Path("rl"), **fields)
        return
    with pytest.raises(GraftkitError, match=error.replace("(", r"\(").replace("'", "'")):
        GraftConfig(rl=Path("rl"), **fields)


def test_kl_refuses_two_vocabularies_in_one_line(pair, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from graftkit.agent import tiny_policy, tiny_words
    from graftkit.cli import app
    from graftkit.weights import save_model

    other = tiny_policy(tiny_words(("countdown",)), "nano", seed=0)
    path = save_model(tmp_path / "other", other.model, other.tokenizer, provenance={"producer": "test"})
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["kl", "--model", str(pair["rl"]), "--base", str(path), "--tasks", "arithmetic",
                                 "--seeds", "1", "--episodes", "1"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert "do not share one tokenizer" in r.stderr and str(path) in r.stderr and "compare a fine-tune" in r.stderr


def test_kl_config_refuses_what_it_cannot_measure(pair):
    from graftkit.evaluation.kl import KLConfig

    with pytest.raises(GraftkitError, match="temperature 1"):
        KLConfig(model=pair["rl"], temperature=0.7)
    with pytest.raises(GraftkitError, match="--top 0 must be ≥ 1"):
        KLConfig(model=pair["rl"], top=0)
    with pytest.raises(GraftkitError, match="unknown task"):
        KLConfig(model=pair["rl"], tasks="no-such-task")
