"""The Python API: the package's docstring example, run as written, on a planted pair; the results are
the ones the command line writes for the same settings."""

from __future__ import annotations

import numpy as np

import graftkit
from graftkit import DeltaConfig, DeltaResult, EvalConfig, GraftConfig, read_result, run_delta, run_eval, run_graft
from planted import planted_pair


def test_the_documented_api_runs_and_matches_the_command_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from graftkit.cli import app

    monkeypatch.chdir(tmp_path)
    sft, rl = planted_pair(tmp_path / "runs")
    d = run_delta(DeltaConfig(rl=[rl]))  # base: the recorded SFT parent
    assert isinstance(d, DeltaResult) and d.runs == ["rl"]
    share = dict(zip(d.groups, d.group("share", 0)))
    assert share["embed"] > 0.5 and share["norm"] == 0  # the planted delta: embed dominates, norms untouched
    assert read_result(d.path).attrs["config"] == DeltaConfig(rl=[rl]).as_dict()

    r = CliRunner().invoke(app, ["delta", "--from", str(rl), "--save", str(tmp_path / "cli.h5")])
    assert r.exit_code == 0, r.output
    cli = read_result(tmp_path / "cli.h5")
    for name in d.result.data:
        np.testing.assert_array_equal(np.asarray(d.result[name]), np.asarray(cli[name]), err_msg=name)

    ev = run_eval(EvalConfig(model=sft, tasks="click-tab", seeds=2, episodes=1))
    pooled = ev.rows[-1]
    assert pooled["task"] == "all" and pooled["model"]["n"] == 2 and 0 <= pooled["model"]["rate"] <= 1
    out = run_graft(GraftConfig(rl=rl, groups="all", out_dir=tmp_path / "g"))
    graft_ck, rl_ck = graftkit.open_checkpoint(out["out"]), graftkit.open_checkpoint(rl)
    assert all(np.array_equal(graft_ck.read(n).numpy(), rl_ck.read(n).numpy()) for n in rl_ck.metas)  # graft(all) == RL


def test_one_function_per_command_and_the_grafted_context(tmp_path, monkeypatch):
    """gk.delta / gk.graft / gk.rank / gk.eval build the command's config (bad options are its one-line
    errors), graftkit.graft and graftkit.rank stay packages, and gk.grafted is the graft inside the block
    and the base again after it, bit for bit."""
    import pytest
    import torch

    import graftkit as gk
    import graftkit.graft as graft_pkg
    from graftkit.core.errors import GraftkitError

    monkeypatch.chdir(tmp_path)
    sft, rl = planted_pair(tmp_path / "runs")
    assert graft_pkg is gk.graft and gk.graft.GraftSpec is graftkit.GraftSpec  # still the package
    d = gk.delta(rl)
    assert d.group_shares(0)["embed"] > 0.5
    assert gk.figures.anatomy_heatmap(d).data  # the README's calls, as written
    ds = gk.open_result(d.path)
    assert list(ds["share"].dims) == ["run", "tensor"] and (ds["share"].values == d.result["share"]).all()
    plan = gk.graft(rl, ["attn", "mlp"], dry_run=True)
    assert {row["group"] for row in plan["selected"]} == {"attn", "mlp"}
    ranks = gk.rank(rl, what="delta", base=sft)
    assert ranks["what"] == "delta" and ranks["models"]
    with pytest.raises(GraftkitError, match="--unknown"):
        gk.delta(rl, unknown="maybe")
    with pytest.raises(GraftkitError, match="--seeds"):
        gk.eval(sft, seeds=0)

    policy = gk.load_policy(sft)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    rl_ck = graftkit.open_checkpoint(rl)
    with gk.grafted(policy, base=sft, rl=rl, groups=["attn", "mlp"]):
        inside = dict(policy.model.named_parameters())
        late_q = "model.layers.5.self_attn.q_proj.weight"  # planted: the late layers' attention
        assert torch.equal(inside[late_q], rl_ck.read(late_q)) and not torch.equal(inside[late_q], before[late_q])
        assert torch.equal(inside["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters())
