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
    sft, rl = planted_pair(tmp_path / "runs" / "demo")
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
