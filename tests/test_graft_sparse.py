"""Top-fraction grafts (``graft --top-frac``): exactly ⌈F·n⌉ entries move, the largest |Δ| first, ties in flat
order; F = 1 is the whole graft bit for bit; in place equals the export; the command says what it selected."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from graftkit.cli import app  # noqa: E402
from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.graft import GraftSpec, InPlaceGraft, export_graft, plan_graft  # noqa: E402
from graftkit.graft.plan import sparsify  # noqa: E402
from graftkit.graft.sparse import delta_key, mask_of, top_fraction  # noqa: E402
from graftkit.weights import load_model, open_checkpoint  # noqa: E402

FRACS = (1e-3, 0.01, 0.1, 0.5, 0.999, 1.0)


def _pairs(seed=0):
    g = torch.Generator().manual_seed(seed)
    base = {f"t{i}": torch.randn(40, 25, generator=g) for i in range(4)}
    rl = {k: v + (i + 1) * 0.01 * torch.randn(v.shape, generator=g) for i, (k, v) in enumerate(base.items())}
    rl["t1"][:3] = base["t1"][:3]  # rows that did not move
    return base, rl


@pytest.mark.parametrize("scope", ["tensor", "global"])
@pytest.mark.parametrize("frac", FRACS)
def test_a_cut_selects_exactly_the_top_entries(frac, scope):
    base, rl = _pairs()
    sizes = {k: v.numel() for k, v in base.items()}
    keys = {k: delta_key(base[k], rl[k], k) for k in base}
    cuts = top_fraction(keys.__getitem__, sizes, frac, scope)
    masks = {k: mask_of(keys[k], c) for k, c in cuts.items()}
    groups = [[k] for k in sizes] if scope == "tensor" else [list(sizes)]
    for names in groups:
        want = math.ceil(frac * sum(sizes[k] for k in names))
        key = torch.cat([keys[k] for k in names])
        mask = torch.cat([masks[k] for k in names])
        assert int(mask.sum()) == want == sum(cuts[k].selected for k in names)
        kth = key.sort(descending=True).values[want - 1]  # the reference: a full sort
        assert bool((key[mask] >= kth).all()) and bool((key[~mask] <= kth).all())
        delta = torch.cat([(rl[k] - base[k]).abs().flatten() for k in names])
        assert sum(cuts[k].changed for k in names) == int((delta[mask] != 0).sum())


def test_ties_are_taken_in_flat_order_tensor_by_tensor():
    base = {"a": torch.zeros(10), "b": torch.zeros(10)}
    rl = {"a": torch.ones(10), "b": torch.ones(10)}
    keys = {k: delta_key(base[k], rl[k]) for k in base}
    cuts = top_fraction(keys.__getitem__, {"a": 10, "b": 10}, 0.65, "global")  # 13 of 20 equal entries
    assert mask_of(keys["a"], cuts["a"]).all()
    assert mask_of(keys["b"], cuts["b"]).nonzero().flatten().tolist() == [0, 1, 2]


def test_bad_fractions_and_deltas_are_refused():
    base, rl = _pairs()
    for frac in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(GraftkitError, match="not a fraction"):
            GraftSpec(("attn",), top_frac=frac)
    with pytest.raises(GraftkitError, match="--top-scope"):
        GraftSpec(("attn",), top_frac=0.1, top_scope="layer")
    bad = rl["t0"].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(GraftkitError, match="t0: the delta is not finite at 1 of 1000"):
        delta_key(base["t0"], bad, "t0")
    with pytest.raises(GraftkitError, match="cannot rank"):
        delta_key(torch.zeros(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64), "ids")


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("sparse")
    return P.make_pair(root, "qwen3", layers=3, dtype=request.param), root


@pytest.mark.parametrize("scope", ["tensor", "global"])
def test_an_exported_top_fraction_graft_moves_exactly_its_entries(pair, scope):
    p, root = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    b, r = P.read_all(p.base), P.read_all(p.rl)
    chosen = [n for n in b if P.group_of(n) in ("attn", "mlp")]
    for frac in (0.01, 0.3):
        plan = sparsify(plan_graft(tax, GraftSpec(("attn", "mlp"), top_frac=frac, top_scope=scope)), base, rl)
        got = P.read_all(export_graft(base, rl, plan, root / f"top-{scope}-{frac}", force=True))
        moved = {n: (P.bits(got[n]) != P.bits(b[n])) for n in b}
        for n in b:  # a moved entry holds RL's bits, every other entry base's
            P.assert_bit_equal(torch.where(moved[n], r[n], b[n]), got[n], n)
            if n not in chosen:
                assert not moved[n].any(), n
        counts = {n: int(moved[n].sum()) for n in chosen}
        if scope == "tensor":
            assert counts == {n: math.ceil(frac * b[n].numel()) for n in chosen}
        else:
            assert sum(counts.values()) == math.ceil(frac * sum(b[n].numel() for n in chosen))
        assert plan.sparsity["selected"] == sum(counts.values()) == plan.sparsity["changed"]
        smallest_moved = min(float((r[n] - b[n]).float().abs()[moved[n]].min()) for n in chosen if counts[n])
        if scope == "global":  # no entry left behind moved more than the smallest one taken
            assert all(float((r[n] - b[n]).float().abs()[~moved[n]].max()) <= smallest_moved for n in chosen)


def test_the_whole_fraction_is_the_whole_graft_bit_for_bit(pair):
    p, root = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    for spec, whole in ((GraftSpec(("attn", "mlp"), top_frac=1.0, top_scope="global"), GraftSpec(("attn", "mlp"))),
                        (GraftSpec(("mlp",), top_frac=1.0, alpha=0.5), GraftSpec(("mlp",), alpha=0.5)),
                        (GraftSpec(("attn",), top_frac=1.0, reverse=True), GraftSpec(("attn",), reverse=True))):
        plan = sparsify(plan_graft(tax, spec), base, rl)
        assert not plan.cuts and plan.sparsity["selected"] == plan.sparsity["entries"]
        a = P.read_all(export_graft(base, rl, plan, root / "whole-top", force=True))
        want = P.read_all(export_graft(base, rl, plan_graft(tax, whole), root / "whole", force=True))
        for n in want:
            P.assert_bit_equal(a[n], want[n], f"{spec}: {n}")


def test_in_place_equals_the_export_and_restores(pair):
    p, root = pair
    base, rl = open_checkpoint(p.base), open_checkpoint(p.rl)
    tax = base.taxonomy()
    model, _ = load_model(p.base, need_tokenizer=False, dtype=p.dtype)
    original = {n: t.detach().clone() for n, t in model.state_dict().items()}
    specs = [GraftSpec(("attn", "mlp"), top_frac=0.05), GraftSpec(("attn", "mlp"), top_frac=0.2, top_scope="global"),
             GraftSpec(("mlp",), top_frac=0.1, alpha=0.5), GraftSpec(("attn",), top_frac=0.1, reverse=True),
             GraftSpec(("attn", "mlp"))]
    with InPlaceGraft(model, base, rl) as session:
        for i, spec in enumerate(specs):
            plan = sparsify(plan_graft(tax, spec), base, rl)
            session.apply(plan)
            want, _ = load_model(export_graft(base, rl, plan, root / f"inplace-{i}", force=True), need_tokenizer=False,
                                 dtype=p.dtype)
            for n, t in want.state_dict().items():
                P.assert_bit_equal(model.state_dict()[n], t, f"{spec}: {n}")
        with pytest.raises(ValueError, match="sparsif"):
            session.apply(plan_graft(tax, specs[0]))
    for n, t in model.state_dict().items():
        P.assert_bit_equal(t, original[n], f"restored {n}")


def test_graft_top_frac_from_the_command_line(pair, tmp_path, monkeypatch):
    p, _ = pair
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()

    def cli(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=True)

    r = cli("graft", "--from", p.rl, "--groups", "mlp", "--top-frac", "0.1", "--top-scope", "global", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    n = sum(t.numel() for k, t in p.base_sd.items() if P.group_of(k) == "mlp")
    assert j["sparsity"]["selected"] == math.ceil(0.1 * n) and j["sparsity"]["entries"] == n
    assert j["sparsity"]["scope"] == "global" and j["spec"]["top_frac"] == 0.1
    out = Path(j["out"])
    assert out.name.endswith("-top0.1-global")
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["sparsity"]["selected"] == j["sparsity"]["selected"]
    assert prov["config"]["top_frac"] == 0.1 and prov["config"]["top_scope"] == "global"

    dry = cli("graft", "--from", p.rl, "--groups", "mlp", "--top-frac", "0.1", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    rows = json.loads(dry.stdout)["selected"]
    mlp = {k: t.numel() for k, t in p.base_sd.items() if P.group_of(k) == "mlp"}
    for row in rows:  # per tensor: each tensor's own ⌈F·n⌉
        assert row["selected_entries"] == sum(math.ceil(0.1 * mlp[k]) for k in row["names"]), row
        assert row["entries"] == sum(mlp[k] for k in row["names"])
    k = sum(math.ceil(0.1 * v) for v in mlp.values())
    shown = cli("graft", "--from", p.rl, "--groups", "mlp", "--top-frac", "0.1", "--dry-run")
    assert f"{k:,} of {n:,} entries" in " ".join(shown.stdout.split())
    for row in rows:  # the table's entries column
        assert f"{row['selected_entries']:,} of {row['entries']:,}" in shown.stdout

    for args, needle in ((("--top-scope", "global"), "no --top-frac was given"),
                         (("--top-frac", "0"), "not a fraction in (0, 1]"),
                         (("--top-frac", "0.1", "--top-scope", "row"), "--top-scope 'row'")):
        bad = cli("graft", "--from", p.rl, "--groups", "mlp", *args)
        assert bad.exit_code == 2, bad.output
        err = bad.stderr.strip()
        assert err.startswith("error:") and "\n" not in err and needle in err, err


@pytest.mark.slow
def test_sparsity_sweep_and_eval_of_a_top_fraction_graft(tmp_path, monkeypatch):
    """``--sweep sparsity`` grafts the groups' top F entries at each F of ``--fracs`` (F = 1: the groups' whole
    graft), records F and the scope per configuration, and resumes by label; ``--eval --top-frac`` is one of them."""
    from conftest import planted_policies

    from graftkit.graft.experiments import SweepResult

    policies = planted_policies(tmp_path / "policies")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    runner = CliRunner()
    common = ["--tasks", "click-button", "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4"]

    def cli(*args):
        return runner.invoke(app, ["graft", "--from", str(policies["rl"]), *map(str, args), *common])

    r = cli("--sweep", "sparsity", "--groups", "attn", "--fracs", "0.5,0.01,1", "--top-scope", "global", "--metric",
            "both", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    sw = SweepResult.read(j["files"]["A"])
    want = ["∅ (base)", "all (rl)", "attn[top 0.01 global]", "attn[top 0.5 global]", "attn"]
    assert sw.configs == want
    assert sw.array("config_top_frac").tolist() == [1.0, 1.0, 0.01, 0.5, 1.0]
    assert sw.strings("config_top_scope") == ["tensor", "tensor", "global", "global", "tensor"]
    # the rank of what each configuration grafts, beside it: the base grafts nothing; a sparser graft, a lower rank
    # than the whole attention delta's (a planted dense delta: full rank)
    from graftkit.graft import GraftSpec, plan_graft
    from graftkit.graft.experiments import grafted_delta_erank
    from graftkit.weights import open_checkpoint

    erank = dict(zip(sw.configs, sw.array("config_delta_erank")))
    assert np.isnan(erank["∅ (base)"]) and erank["attn[top 0.01 global]"] < erank["attn"]
    b_, r_ = open_checkpoint(policies["sft"]), open_checkpoint(policies["rl"])
    whole = grafted_delta_erank(b_, r_, plan_graft(b_.taxonomy(), GraftSpec(("attn",))))
    assert erank["attn"] == pytest.approx(whole, rel=1e-12)
    rows = {c["config"]: c for c in j["runs"]["A"]["configs"]}
    assert rows["attn"]["delta_erank"] == pytest.approx(whole, rel=1e-12) and rows["∅ (base)"]["delta_erank"] is None
    shown = cli("--sweep", "sparsity", "--groups", "attn", "--fracs", "0.5,0.01,1", "--top-scope", "global", "--metric",
                "both")  # resumed: the table of what is stored
    assert shown.exit_code == 0, shown.output
    assert "erank(Δ)" in shown.stdout
    line = next(x for x in shown.stdout.splitlines() if x.strip("│ ").startswith("attn "))
    assert f"{whole:.4g}" in line
    again = cli("--sweep", "sparsity", "--groups", "attn", "--fracs", "0.5,0.01,1", "--top-scope", "global", "--metric",
                "both", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["resumed"]["A"] == sorted(want)

    # the report's curve draws what the sweep holds: each fraction's success change and reproduced fraction
    from graftkit.figures.grafts import sparsity_curve
    from graftkit.figures.report import load_run, plan_report
    from graftkit.results.store import read_result

    fig = sparsity_curve("rl", read_result(j["files"]["A"]))
    import plotly.io as pio

    from graftkit import figures

    assert pio.to_json(figures.sparsity_curve(j["files"]["A"], label="rl")) == pio.to_json(fig)  # the notebook's
    success, kl_rl = fig.data[0], fig.data[1]
    grafts = [c for c in sw.configs if c not in ("∅ (base)", "all (rl)")]
    fracs = dict(zip(sw.configs, sw.array("config_top_frac")))
    diffs = {r["config"]: r["diff_vs_base"][0] for r in j["runs"]["A"]["configs"]}
    assert list(success.x) == pytest.approx(sorted(100 * fracs[c] for c in grafts))
    order = sorted(grafts, key=fracs.get)
    assert list(success.y) == pytest.approx([100 * diffs[c] for c in order])
    assert list(kl_rl.y) == pytest.approx([100 * sw.reproduced(c, "rl")[0] for c in order])
    panels = [pn for sec in plan_report(load_run(tmp_path / "runs")) for pn in sec.panels]
    assert any("--sweep sparsity" in pn.caption for pn in panels)

    one = cli("--eval", "--groups", "attn", "--top-frac", "0.01", "--top-scope", "global", "--json")
    assert one.exit_code == 0, one.output
    ev = SweepResult.read(json.loads(one.stdout)["files"]["A"])
    assert ev.configs[-1] == "attn[top 0.01 global]"
    # the same graft plays the same episodes in the sweep and alone
    assert (ev.outcomes("attn[top 0.01 global]") == sw.outcomes("attn[top 0.01 global]")).all()

    for args, needle in ((("--sweep", "single", "--fracs", "0.1"), "--fracs applies to --sweep sparsity"),
                         (("--sweep", "sparsity", "--top-frac", "0.1"), "--sweep sparsity --fracs"),
                         (("--sweep", "sparsity", "--fracs", "0.1,2"), "--fracs 2: each must be a fraction")):
        bad = cli(*args)
        assert bad.exit_code == 2, bad.output
        assert needle in bad.stderr and "\n" not in bad.stderr.strip(), bad.stderr


def test_top_counts_of_the_delta_pass_are_the_grafts_own_selections(monkeypatch):
    """The overlap of top-fraction masks that delta counts in its one pass (numpy arrays as the pass holds them)
    selects exactly what graft --top-frac selects from the same checkpoints (torch tensors), in every float dtype,
    ties included (half the entries do not move; bf16 and fp16 deltas repeat), in a tensor small enough to be its own
    sample and in one whose candidate bound comes from the sample; a tensor it cannot rank raises."""
    from graftkit.core.errors import GraftkitError
    from graftkit.graft import sparse
    from graftkit.weights import tensor_bits

    ranked_whole = []
    whole = sparse._cuts  # the histograms' exact cut, the reference
    monkeypatch.setattr(sparse, "_cuts", lambda *a: ranked_whole.append(1) or whole(*a))
    g = torch.Generator().manual_seed(3)
    for shape in ((64, 48), (250, 400)):  # 3,072 entries; 100,000 > SAMPLE
        for dtype, code in ((torch.float32, "F32"), (torch.bfloat16, "BF16"), (torch.float16, "F16"),
                            (torch.float64, "F64")):
            base = torch.randn(*shape, generator=g).to(dtype)
            runs = [(base.double() + 1e-2 * torch.randn(*shape, generator=g, dtype=torch.float64)
                     * (torch.rand(*shape, generator=g) < 0.5)).to(dtype) for _ in range(3)]
            keys = [sparse.delta_key(base, r) for r in runs]
            for frac in (0.0001, 0.01, 0.1, 0.37, 0.8, 1.0):
                cuts = [whole(lambda _n, k=k: k, ["w"], math.ceil(frac * k.numel()))["w"] for k in keys]
                masks = [sparse.mask_of(k, c) for k, c in zip(keys, cuts)]
                want = [[int((masks[i] & masks[j]).sum()) for j in range(3)] for i in range(3)]
                ranked_whole.clear()
                got = sparse.tensor_top_counts(tensor_bits(base), [tensor_bits(r) for r in runs], code, [code] * 3,
                                               frac, "w")
                assert got.tolist() == want, (shape, code, frac)
                for k, r, c, m in zip(keys, runs, cuts, masks):  # the same cut, and its entries
                    cut, idx = sparse.top_indices(tensor_bits(base), tensor_bits(r), code, code, frac, "w")
                    assert cut == c and idx.tolist() == m.nonzero().flatten().tolist(), (shape, code, frac)
                    assert sparse.top_fraction(lambda _n, k=k: k, {"w": k.numel()}, frac)["w"] == c
                assert not ranked_whole, "the bound held: no tensor was ranked whole"

    # a sample that misleads (every sampled entry moved far, few others did): the tensor is ranked whole, the
    # same cut
    n = 200_000
    base = torch.zeros(n)
    rl = 1e-3 * torch.rand(n, generator=g)
    rl[torch.tensor(sparse.sample_positions(n))] += 10 + torch.rand(sparse.SAMPLE, generator=g)
    key = sparse.delta_key(base, rl)
    want = whole(lambda _n: key, ["w"], 10_000)["w"]
    cut, idx = sparse.top_indices(tensor_bits(base), tensor_bits(rl), "F32", "F32", 0.05, "w")
    assert ranked_whole and cut == want and idx.tolist() == sparse.mask_of(key, want).nonzero().flatten().tolist()
    ranked_whole.clear()
    assert sparse.top_fraction(lambda _n: key, {"w": n}, 0.05)["w"] == want and ranked_whole

    bad = torch.zeros(4, 4)
    with pytest.raises(GraftkitError, match="tensor w: the delta is not finite at 4 of 16"):
        sparse.tensor_top_counts(tensor_bits(bad), [tensor_bits(bad.clone().index_put_(
            (torch.tensor([0]),), torch.tensor(float("inf")))), tensor_bits(bad)], "F32", ["F32", "F32"], 0.5, "w")
    nan = rl.clone()
    nan[150_000] = float("nan")  # in a later chunk, not sampled
    with pytest.raises(GraftkitError, match=f"tensor w: the delta is not finite at 1 of {n}"):
        sparse.tensor_top_counts(tensor_bits(base), [tensor_bits(nan), tensor_bits(rl)], "F32", ["F32", "F32"],
                                 0.01, "w")
    ints = torch.zeros(4, 4, dtype=torch.int64)
    with pytest.raises(GraftkitError, match="tensor w holds I64 values"):
        sparse.tensor_top_counts(tensor_bits(ints), [tensor_bits(ints)] * 2, "I64", ["I64", "I64"], 0.5, "w")
