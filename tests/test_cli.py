"""The command line, end to end: demo, delta, graft, inspect; every bad input is one line and exit 2."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from graftkit.cli import app  # noqa: E402
from graftkit.graft.experiments import SweepResult  # noqa: E402
from graftkit.results.store import read_result  # noqa: E402
from graftkit.weights import band_rule  # noqa: E402

NAN_TENSOR = "model.layers.2.self_attn.v_proj.weight"
SCALES = {"embed": 0.1, "attn": lambda layer: 0.02 if layer >= 2 else 0.0, "mlp": 0.01}


def _strict(text: str):
    """json.loads that refuses NaN and Infinity (not JSON, though Python writes them)."""
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    pair = P.make_pair(root / "pair", "qwen3", layers=4, scales=SCALES)

    def plant(params):
        params[NAN_TENSOR][0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])

    nan_pair = P.make_pair(root / "nan", "llama", layers=3, scales=SCALES, mutate=plant)
    other_vocab = P.save_base(root / "vocab80", P.tiny_model("qwen3", 4, vocab=80))
    return {"root": root, "pair": pair, "nan": nan_pair, "vocab80": other_vocab}


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Invoke the app in a fresh working folder with its own runs root."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=True)

    invoke.cwd = tmp_path
    return invoke


def assert_one_line_error(result, *needles, code=2):
    assert result.exit_code == code, (result.exit_code, result.output)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    err = result.stderr.strip()
    assert err.startswith("error:"), err
    assert "\n" not in err, err
    assert "Traceback" not in result.output
    for n in needles:
        assert n in err, (n, err)
    return err


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ------------------------------------------------------------------------------------------- demo


def test_graft_and_delta_as_written_on_a_run(cli):
    from planted import planted_pair

    sft, rl = planted_pair(cli.cwd / "runs")  # the current run by default

    # as written in docs/design.md: the base comes from the RL model's graftkit.json
    g = cli("graft", "--from", rl, "--groups", "attn,mlp")
    assert g.exit_code == 0, g.output
    recorded = Path(json.loads((rl / "graftkit.json").read_text())["base_model"]["path"])
    assert recorded == sft.resolve()
    grafted = next(p for p in (cli.cwd / "runs").rglob("rl-attn+mlp-all") if p.is_dir())
    got, s, r_ = P.read_all(grafted), P.read_all(sft), P.read_all(rl)
    for n, t in got.items():
        want = r_[n] if P.group_of(n) in ("attn", "mlp") else s[n]
        P.assert_bit_equal(t, want, n)
    prov = json.loads((grafted / "graftkit.json").read_text())
    assert prov["base_model"]["path"] == str(sft.resolve())
    assert {p["role"] for p in prov["parents"]} == {"base", "rl"}

    d = cli("delta", "--from", rl, "--json")
    assert d.exit_code == 0, d.output
    assert _strict(d.stdout)["runs"]["rl"]["groups"]["embed"]["share"] > 0.5

    again = cli("graft", "--from", rl, "--groups", "attn,mlp")
    assert_one_line_error(again, "already exists", "--force")


@pytest.mark.slow
def test_quick_demo_then_graft_and_rank_as_written(tmp_path):
    exe = Path(sys.executable).with_name("graftkit")
    env = {**os.environ, "GRAFTKIT_RUNS": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1"}

    def run(*args):
        return subprocess.run([str(exe), *map(str, args)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=900)

    demo = run("demo", "--quick", "--json", "--out", tmp_path / "runs" / "d")
    assert demo.returncode == 0, demo.stderr
    info = _strict(demo.stdout)
    assert [f["number"] for f in info["findings"]] == ["control", 1, 2, 3, 4]  # the positive control first
    for f in info["findings"]:
        assert f["verdict"] in ("reproduced", "partly reproduced", "not reproduced", "not testable here", "not measured",
                                "learns", "does not learn", "undecided"), f
        assert f["statement"]
    assert Path(info["report"]).is_file()
    kinds = {read_result(p).kind for p in (tmp_path / "runs" / "d" / "results").glob("*.h5")}
    assert {"train-sft", "train-grpo", "headroom", "eval", "delta", "graft-sweep", "graft-dissociation",
            "rank-weights", "rank-delta", "rank-activations", "coupling", "findings", "kl", "forgetting"} <= kinds
    # the field's questions, as the demo answers them: the sparsity sweep, the weight path, the forgetting fit
    assert (tmp_path / "runs" / "d" / "results" / "graft-sparsity-degrade-s0.h5").is_file()
    assert (tmp_path / "runs" / "d" / "results" / "delta-degrade-s0-trajectory.h5").is_file()
    fg = run("forgetting", tmp_path / "runs" / "d", "--json")
    assert fg.returncode == 0, fg.stderr
    fj = _strict(fg.stdout)
    row = next(r for r in fj["runs"] if r["run"] == "degrade-s0")
    ev, parent = (read_result(tmp_path / "runs" / "d" / "results" / f"eval-{m}-greedy.h5") for m in ("degrade-s0", "sft"))
    held = [i for i, t in enumerate(ev.coords["task"]) if t not in row["trained"]]
    want = ev["success"][held].mean() - parent["success"][held].mean()  # every task plays as many episodes
    assert row["forgetting"][0] == pytest.approx(float(want)) and row["untrained"] == ["click-button"]
    from graftkit.evaluation.kl import KLResult

    kl = KLResult.read(tmp_path / "runs" / "d" / "results" / "kl-degrade-s0-vs-sft.h5")
    t = kl.tasks.index("click-tab")
    assert row["kl"] == pytest.approx(float(kl.episode_kl("rl")[t].sum() / kl.tokens("rl")[t].sum()))
    assert fj["best"] in {f["predictor"] for f in fj["fits"]}
    html = Path(info["report"]).read_text()
    for heading in ("Forgetting", "The shape of the weight path", "How much of the change a fraction of the movement",
                    "Where RL moved W: along or off its principal directions", "Do runs move the same entries?"):
        assert heading in html, heading
    sweeps = [SweepResult.read(p) for p in (tmp_path / "runs" / "d" / "results").glob("graft-factorial-*.h5")]
    assert sweeps and all(sw.has_kl and sw.has_success for sw in sweeps)  # scored by both, after the --vs test too
    # a run stopped mid-way resumes without redoing finished work: drop the last stages' results, rerun
    results = tmp_path / "runs" / "d" / "results"
    dropped = [p for p in results.glob("*.h5") if p.name.startswith(("coupling-", "findings"))]
    assert len(dropped) == 2
    for p in dropped:
        p.unlink()
    kept = {p: p.stat().st_mtime_ns for p in results.glob("*.h5")}
    again = run("demo", "--quick", "--json", "--out", tmp_path / "runs" / "d")
    assert again.returncode == 0, again.stderr
    assert all(p.is_file() for p in dropped)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # nothing finished was redone
    assert "skip" not in again.stdout and "done before" in again.stderr
    rl = Path(info["models"]["degrade-s0"])
    # as written in docs/design.md, after the demo: defaults come from the current run and graftkit.json
    r = run("rank", "--layers", "late", "--json")
    assert r.returncode == 0, r.stderr
    assert set(_strict(r.stdout)["models"]) >= {"sft", "degrade-s0"}
    g = run("graft", "--from", rl, "--groups", "attn,mlp", "--layers", "late", "--json")
    assert g.returncode == 0, g.stderr
    info = _strict(g.stdout)
    assert Path(info["out"]).is_dir() and info["spec"]["layers"] == "late"
    again = run("graft", "--from", rl, "--groups", "attn,mlp", "--layers", "late")
    assert again.returncode == 2
    assert again.stderr.strip().startswith("error:") and "\n" not in again.stderr.strip()
    assert "Traceback" not in again.stderr and again.stdout == ""
    # every result file of the run opens as netCDF-4 (xarray, engine="h5netcdf") as the typed read gives it
    from test_store_xarray import check_file

    written = [p for p in sorted(results.rglob("*.h5")) if not p.name.startswith(".")]
    assert {read_result(p).kind for p in written} >= kinds
    for p in written:
        check_file(p)


# ------------------------------------------------------------------------------------------ delta


def test_delta_json_structure_and_values(cli, world):
    pair = world["pair"]
    save = cli.cwd / "d.h5"
    r = cli("delta", "--from", pair.rl, "--json", "--tol", "1e-3", "--save", save)
    assert r.exit_code == 0, r.output
    j = _strict(r.stdout)
    assert set(j) >= {"base", "tol", "runs", "result_file", "seconds"}
    assert Path(j["base"]) == pair.base and j["tol"] == 1e-3 and Path(j["result_file"]) == save
    assert save.is_file() and read_result(save).kind == "delta"
    run = j["runs"]["rl"]
    metrics = {"fro_delta", "rel_delta", "share", "max_abs_delta", "frac_unchanged", "frac_within_tol", "n_nonfinite"}
    assert set(run["total"]) == metrics
    assert set(run["groups"]) == set(pair.groups_present())
    assert {t["name"] for t in run["tensors"]} == set(pair.names)
    shares = [t["share"] for t in run["tensors"]]
    assert shares == sorted(shares, reverse=True)  # largest movers first

    # values, from the in-memory tensors
    sq = {n: float(((pair.rl_sd[n].double() - pair.base_sd[n].double()) ** 2).sum()) for n in pair.names}
    total = sum(sq.values())
    assert run["total"]["fro_delta"] == pytest.approx(math.sqrt(total), rel=1e-6)
    for g in pair.groups_present():
        members = [n for n in pair.names if P.group_of(n) == g]
        assert run["groups"][g]["share"] == pytest.approx(sum(sq[n] for n in members) / total, rel=1e-6, abs=1e-12)
        assert run["groups"][g]["n_nonfinite"] == 0
    assert run["groups"]["norm"]["share"] == 0 and run["groups"]["norm"]["frac_unchanged"] == 1
    for t in run["tensors"]:
        assert t["group"] == P.group_of(t["name"])
        assert t["layer"] == (P.layer_of(t["name"]) if P.layer_of(t["name"]) is not None else -1)
        b, rl = pair.base_sd[t["name"]], pair.rl_sd[t["name"]]
        assert t["max_abs_delta"] == pytest.approx(float((rl.double() - b.double()).abs().max()), rel=1e-6)
        assert t["frac_unchanged"] == pytest.approx(float((P.bits(b) == P.bits(rl)).double().mean()))


def test_delta_default_save_location_and_table(cli, world):
    r = cli("delta", "--from", world["pair"].rl)
    assert r.exit_code == 0, r.output
    assert "largest movers" in r.stdout and "embed" in r.stdout
    assert (cli.cwd / "runs" / "results" / "delta-rl.h5").is_file()


def test_delta_two_runs_has_cosine_and_strict_json(cli, world):
    pair = world["pair"]
    r = cli("delta", "--from", pair.rl, "--from", pair.rl, "--json", "--save", cli.cwd / "two.h5")
    assert r.exit_code == 0, r.output
    j = _strict(r.stdout)  # a group that never moved has an undefined cosine: null, not NaN
    assert list(j["runs"]) == ["rl", "pair-rl"]
    assert j["cosine"]["runs"] == ["rl", "pair-rl"]
    assert np.allclose(j["cosine"]["total"], 1.0)
    assert j["cosine"]["groups"]["embed"][0][1] == pytest.approx(1.0)
    assert j["cosine"]["groups"]["norm"][0][1] is None


def test_delta_nonfinite_is_an_error_unless_allowed(cli, world):
    nan = world["nan"]
    r = cli("delta", "--from", nan.rl, "--save", cli.cwd / "n.h5")
    err = assert_one_line_error(r, NAN_TENSOR, "--allow-nonfinite")
    assert "(3)" in err
    ok = cli("delta", "--from", nan.rl, "--allow-nonfinite", "--json", "--save", cli.cwd / "n.h5")
    assert ok.exit_code == 0, ok.output
    j = _strict(ok.stdout)
    assert j["runs"]["rl"]["total"]["n_nonfinite"] == 3
    row = next(t for t in j["runs"]["rl"]["tensors"] if t["name"] == NAN_TENSOR)
    assert row["n_nonfinite"] == 3 and math.isfinite(row["fro_delta"])


def test_delta_vocabulary_mismatch(cli, world):
    r = cli("delta", "--from", world["pair"].rl, "--base", world["vocab80"])
    assert_one_line_error(r, "vocabulary", "[80, 32]", "[64, 32]")
    g = cli("graft", "--from", world["pair"].rl, "--base", world["vocab80"], "--groups", "attn")
    assert_one_line_error(g, "vocabulary")


# ------------------------------------------------------------------------------------------ graft


def test_graft_dry_run_lists_and_writes_nothing(cli, world):
    pair = world["pair"]
    before = tree(cli.cwd), tree(world["root"])
    r = cli("graft", "--from", pair.rl, "--groups", "attn,mlp", "--layers", "late", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    j = _strict(r.stdout)
    assert (tree(cli.cwd), tree(world["root"])) == before
    assert j["dry_run"] is True and j["spec"] == {"groups": ["attn", "mlp"], "layers": "late", "alpha": 1.0,
                                                   "reverse": False, "top_frac": None, "top_scope": "tensor"}
    late = {i for i in range(pair.n_layers) if 3 * i // pair.n_layers == 2}
    want = {}
    for n in pair.names:
        g, L = P.group_of(n), P.layer_of(n)
        if g in ("attn", "mlp") and L in late:
            row = want.setdefault((g, L), {"tensors": 0, "bytes": 0, "names": set()})
            row["tensors"] += 1
            row["bytes"] += pair.base_sd[n].numel() * pair.base_sd[n].element_size()
            row["names"].add(n)
    got = {(s["group"], s["layer"]): {"tensors": s["tensors"], "bytes": s["bytes"], "names": set(s["names"])}
           for s in j["selected"]}
    assert got == want
    assert j["selected_bytes"] == sum(v["bytes"] for v in want.values())
    assert j["total_bytes"] == sum(t.numel() * t.element_size() for t in pair.base_sd.values())
    assert any(band_rule(pair.n_layers) in note for note in j["notes"])

    # the table form writes nothing either, and shows the band rule
    t = cli("graft", "--from", pair.rl, "--groups", "embed", "--dry-run")
    assert t.exit_code == 0, t.output
    assert "embed" in t.stdout and "selected" in t.stdout
    assert (tree(cli.cwd), tree(world["root"])) == before


def test_graft_writes_and_refuses_an_existing_output(cli, world):
    pair = world["pair"]
    dest = cli.cwd / "g"
    r = cli("graft", "--from", pair.rl, "--groups", "mlp", "--out", dest, "--json", "--max-shard-size", "40KB")
    assert r.exit_code == 0, r.output
    j = _strict(r.stdout)
    assert Path(j["out"]) == dest.resolve() and (dest / "model.safetensors.index.json").is_file()
    got = P.read_all(dest)
    for n in pair.names:
        P.assert_bit_equal(got[n], pair.rl_sd[n] if P.group_of(n) == "mlp" else pair.base_sd[n], n)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    again = cli("graft", "--from", pair.rl, "--groups", "attn", "--out", dest)
    assert_one_line_error(again, str(dest.resolve()), "already exists", "--force")
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before

    forced = cli("graft", "--from", pair.rl, "--groups", "attn", "--out", dest, "--force")
    assert forced.exit_code == 0, forced.output
    assert "grafted" in forced.stdout
    got = P.read_all(dest)
    for n in pair.names:
        P.assert_bit_equal(got[n], pair.rl_sd[n] if P.group_of(n) == "attn" else pair.base_sd[n], n)

    # --force never replaces a folder graftkit did not write
    foreign = cli.cwd / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    f = cli("graft", "--from", pair.rl, "--groups", "attn", "--out", foreign, "--force")
    assert_one_line_error(f, "not written by graftkit")
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_graft_all_none_reverse_alpha(cli, world):
    pair = world["pair"]
    for args, want in ((["--groups", "all"], pair.rl_sd), (["--groups", "none"], pair.base_sd),
                       (["--groups", "all", "--reverse"], pair.base_sd),
                       (["--groups", "all", "--alpha", "0"], pair.base_sd)):
        dest = cli.cwd / "x"
        r = cli("graft", "--from", pair.rl, *args, "--out", dest, "--force")
        assert r.exit_code == 0, (args, r.output)
        P.assert_checkpoint_equals(dest, want)


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--from", "{cwd}/nope", "--groups", "attn"], ["nope", "no such file"]),
        (["--from", "{cwd}/nope", "--base", "{base}", "--groups", "attn"], ["nope", "no such file"]),
        (["--from", "{rl}", "--base", "{cwd}/nobase", "--groups", "attn"], ["nobase", "no such file"]),
        (["--from", "{rl}", "--groups", "attn,visionn"], ["unknown group", "visionn"]),
        (["--from", "{rl}", "--groups", "vision"], ["vision", "no tensors"]),
        (["--from", "{rl}", "--groups", "attn", "--layers", "9"], ["--layers", "0–3"]),
        (["--from", "{rl}", "--groups", "attn", "--layers", "late,x"], ["--layers", "'x'"]),
        (["--from", "{rl}", "--groups", "attn", "--layers", "3-1"], ["--layers"]),
        (["--from", "{rl}", "--groups", "attn", "--max-shard-size", "lots"], ["--max-shard-size", "lots"]),
        (["--from", "{rl}", "--groups", "attn", "--max-shard-size", "5XB"], ["--max-shard-size"]),
        (["--from", "{rl}", "--groups", "attn", "--out", "{rl}/graft"], ["overlaps"]),
        (["--from", "{rl}", "--groups", "attn", "--out", "{base}"], ["overlaps"]),
        (["--from", "{rl}", "--groups", "attn", "--out", "{root}"], ["overlaps"]),
        (["--from", "{rl}", "--groups", "attn", "--alpha", "nan"], ["--alpha"]),
        (["--from", "{base}", "--groups", "attn"], ["records no SFT parent", "--base"]),
        (["--from", "{rl}", "--groups", "attn", "--unknown", "maybe"], ["--unknown"]),
    ],
)
def test_graft_bad_input_is_one_line_exit_2(cli, world, args, needles):
    pair = world["pair"]
    fill = {"cwd": cli.cwd, "rl": pair.rl, "base": pair.base, "root": world["root"] / "pair"}
    before = tree(world["root"])
    r = cli("graft", *[a.format(**fill) for a in args])
    assert_one_line_error(r, *needles)
    assert tree(world["root"]) == before
    assert not (cli.cwd / "runs").exists()


@pytest.mark.parametrize(
    "cmd",
    [["delta", "--from", "{cwd}/nope"], ["delta", "--from", "{cwd}/nope", "--base", "{base}"],
     ["inspect", "{cwd}/nope"], ["delta", "--from", "{rl}", "--unknown", "maybe"]],
)
def test_other_bad_inputs_are_one_line_exit_2(cli, world, cmd):
    fill = {"cwd": cli.cwd, "rl": world["pair"].rl, "base": world["pair"].base}
    r = cli(*[a.format(**fill) for a in cmd])
    assert_one_line_error(r)
    if "nope" in " ".join(cmd):
        assert "no such file" in r.stderr


# ---------------------------------------------------------------------------------------- inspect


def test_inspect_json(cli, world):
    pair = world["pair"]
    r = cli("inspect", pair.base, "--json")
    assert r.exit_code == 0, r.output
    j = _strict(r.stdout)
    assert j["family"] == "llama" and j["model_type"] == "qwen3" and j["kind"] == "hf-folder"
    assert j["tied_embeddings"] is False and j["layers"] == {"decoder": pair.n_layers}
    assert j["band_rule"] == band_rule(pair.n_layers) and j["unknown"] == []
    for g in pair.groups_present():
        members = [pair.base_sd[n] for n in pair.names if P.group_of(n) == g]
        assert j["groups"][g] == {"tensors": len(members), "params": sum(t.numel() for t in members),
                                  "bytes": sum(t.numel() * t.element_size() for t in members)}
    assert set(j["groups"]) == set(pair.groups_present())
    table = cli("inspect", pair.rl)
    assert table.exit_code == 0 and "attn" in table.stdout and "band(i)" in table.stdout


def test_version(cli):
    from graftkit import __version__

    r = cli("version")
    assert r.exit_code == 0 and r.stdout.strip() == __version__


@pytest.mark.slow
def test_exact_graft_and_delta_never_import_torch(tmp_path):
    """Byte-exact grafts and delta anatomy run on headers, kernel copies and numpy: importing torch
    (a second or more) is not needed, and this keeps it so."""
    from planted import planted_pair

    sft, rl = planted_pair(tmp_path / "pair")
    code = f"""
import sys
from typer.testing import CliRunner
from graftkit.cli import app
r = CliRunner()
res = r.invoke(app, ["graft", "--base", {str(sft)!r}, "--from", {str(rl)!r}, "--groups", "attn,mlp",
                     "--layers", "late", "--out", {str(tmp_path / "g")!r}])
assert res.exit_code == 0, res.output
res = r.invoke(app, ["delta", "--base", {str(sft)!r}, "--from", {str(rl)!r}, "--save", {str(tmp_path / "d.h5")!r}])
assert res.exit_code == 0, res.output
assert "torch" not in sys.modules, "torch was imported"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "GRAFTKIT_RUNS": str(tmp_path / "runs")})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
