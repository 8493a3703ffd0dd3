"""What people read: every printed table and summary line, cell by cell against the ``--json`` value it names,
and every report figure's title and axis labels against the arrays it plots.

Each command runs once through the CLI (typer's runner): its ``run_*`` function is memoised, so ``--json`` and
the table come from one computation. Tables are parsed from the text (header row → column index); a header
is mapped to the JSON key it claims to show (the delta tables through ``graftkit.graft.anatomy.LABELS``,
the others through the spec written in each test), and each number is compared at its printed precision.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pairs as P  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import graftkit.cli as C  # noqa: E402
from graftkit.core.files import fmt_size  # noqa: E402
from graftkit.graft.anatomy import LABELS, METRICS, delta_labels, tolerance_rule  # noqa: E402

SCALES = {"embed": 0.1, "attn": lambda layer: 0.02 if layer >= 2 else 0.0, "mlp": 0.01}
NAN_TENSOR = "model.layers.2.self_attn.v_proj.weight"


# --------------------------------------------------------------------------------------------------
# reading rich's tables back


@dataclass
class Parsed:
    """One printed table: the text above it (title, and any line printed since the previous table), its
    headers, its rows as header → cell text (a cell wrapped over lines is joined with newlines), and the text
    below it up to the next table (whose ``above`` it is)."""

    above: str
    headers: list[str]
    rows: list[dict[str, str]] = field(default_factory=list)
    below: str = ""

    def column(self, header: str) -> list[str]:
        return [r[header] for r in self.rows]

    def row(self, header: str, value: str) -> dict[str, str]:
        found = [r for r in self.rows if flat(r[header]) == flat(value)]
        assert len(found) == 1, (header, value, self.rows)
        return found[0]


def _cells(line: str, sep: str) -> list[str]:
    return [c.strip() for c in line.strip()[1:-1].split(sep)]


def parse_tables(text: str) -> list[Parsed]:
    """Every table of rich's default box (HEAVY_HEAD) in ``text``, in order."""
    lines, tables, start, i = text.splitlines(), [], 0, 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("┏"):
            i += 1
            continue
        above = "\n".join(lines[start:i])
        i += 1
        heads: list[list[str]] = []
        while not lines[i].lstrip().startswith(("┡", "┗")):
            heads.append(_cells(lines[i], "┃"))
            i += 1
        headers = [" ".join(h[k] for h in heads if h[k]) for k in range(len(heads[0]))]
        body = []
        while not lines[i].lstrip().startswith(("└", "┗")):
            body.append(lines[i].strip())
            i += 1
        i += 1
        start = i
        # with lines between rows, a row is everything between two of them; else a wrapped cell goes on
        # under an empty first column
        ruled = any(line.startswith("├") for line in body)
        groups: list[list[list[str]]] = []
        for line in body[1:] if body and body[0].startswith("┡") else body:
            if line.startswith("├"):
                groups.append([])
                continue
            got = _cells(line, "│")
            if not groups or (not ruled and got[0]):
                groups.append([])
            groups[-1].append(got)
        rows = [{h: "\n".join(line[k] for line in g if line[k]) for k, h in enumerate(headers)} for g in groups if g]
        tables.append(Parsed(above, headers, rows))
    for t, after in zip(tables, [*tables[1:], None]):
        t.below = after.above if after is not None else "\n".join(lines[start:])
    return tables


def flat(text: str) -> str:
    """``text`` without whitespace (wrapped cells and titles compare whole)."""
    return "".join(text.split())


# --------------------------------------------------------------------------------------------------
# numbers at their printed precision

_NUM = re.compile(r"[+\-−]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:e[+\-]?\d+)?")


def numbers(cell: str) -> list[str]:
    return _NUM.findall(cell)


def close(text: str, value: float | None, scale: float = 1.0) -> bool:
    """Does the printed number ``text`` show ``scale·value``, to within half a unit of its last digit?"""
    text = text.strip().replace("−", "-").replace(",", "")
    if text in ("nan", "—", "undefined"):
        return value is None or not math.isfinite(value)
    if value is None:
        return False
    m = re.fullmatch(r"([+\-]?\d*)(?:\.(\d*))?(?:e([+\-]?\d+))?", text)
    assert m, text
    decimals, exp = len(m[2] or ""), int(m[3] or 0)
    half = 0.5 * 10.0 ** (exp - decimals)
    return abs(float(text) - scale * value) <= half * (1 + 1e-9) + 1e-12 * abs(scale * value)


def shows(cell: str, value: float | None) -> bool:
    """A single-number cell: a percentage (``12.34%``) shows 100·value, a plain number shows value."""
    cell = cell.strip()
    if cell.endswith("%"):
        return close(cell[:-1], value, 100.0)
    return close(cell, value)


def shows_all(cell: str, values, scale: float = 100.0) -> bool:
    """A cell of several numbers (``+1.0 [−2.0, +3.0]``, ``50.0% [23.7, 76.3]``) shows ``scale·values`` in order."""
    got = numbers(cell)
    return len(got) == len(values) and all(close(t, v, scale) for t, v in zip(got, values))


def size_shows(cell: str, n: int) -> bool:
    """``12.3 KiB`` shows ``n`` bytes, to its printed precision."""
    value, unit = cell.split()
    factor = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)
    return close(value, n / factor)


def test_close_is_as_strict_as_the_printed_precision():
    assert close("0.1235", 0.12345) and not close("0.1235", 0.1237)
    assert close("1.235e-05", 1.2349e-05) and not close("1.235e-05", 1.2e-05)
    assert shows("12.35%", 0.12349) and not shows("12.35%", 0.1236) and not shows("12.35", 0.1235)
    assert shows("1,234", 1234) and shows("nan", None) and not shows("1", None)
    assert shows_all("+1.0 [-2.0, +3.0]", [0.01, -0.02, 0.03])
    assert not shows_all("+1.0 [-2.0, +3.0]", [0.01, 0.03, -0.02])
    assert size_shows("1.5 KiB", 1536) and not size_shows("1.5 KiB", 1700) and size_shows("12 B", 12)
    text = "\n".join(["title", "┏━━━┳━━━━┓", "┃ a ┃ b  ┃", "┡━━━╇━━━━┩", "│ 1 │ xy │", "│   │ z  │", "│ 2 │ w  │",
                      "└───┴────┘", "after"])
    (t,) = parse_tables(text)
    assert t.above == "title" and t.headers == ["a", "b"] and t.below == "after"
    assert t.rows == [{"a": "1", "b": "xy\nz"}, {"a": "2", "b": "w"}]


# --------------------------------------------------------------------------------------------------
# running a command once, reading both renderings


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """``cli(run_function, *args)`` → (``--json`` payload, table text) of one computation, in a fresh working
    folder with its own runs root and a console wide enough that no table is truncated."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(C.out, "width", 250)
    runner = CliRunner()

    def invoke(run_function: str, *args):
        real, memo = getattr(C, run_function), []

        def once(*a, **k):
            if not memo:
                memo.append(real(*a, **k))
            return memo[0]

        monkeypatch.setattr(C, run_function, once)
        args = [str(a) for a in args]
        j = runner.invoke(C.app, [*args, "--json"], catch_exceptions=False)
        assert j.exit_code == 0, j.output
        t = runner.invoke(C.app, args, catch_exceptions=False)
        assert t.exit_code == 0, t.output
        assert memo and len(memo) == 1
        return json.loads(j.stdout), t.stdout

    invoke.cwd = tmp_path
    return invoke


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")

    def plant(params):
        params[NAN_TENSOR][0, :3] = torch.tensor([float("nan"), float("inf"), float("-inf")])

    import shutil

    made = {"pair": P.make_pair(root / "pair", "qwen3", layers=4, scales=SCALES),
            "nan": P.make_pair(root / "nan", "llama", layers=3, scales=SCALES, mutate=plant)}
    made["copy"] = shutil.copytree(made["pair"].base, root / "copy")  # a checkpoint that did not move
    return made


# --------------------------------------------------------------------------------------------------
# delta


def _check_metric_cells(row: dict[str, str], values: dict[str, float], what: str, labels=LABELS) -> None:
    """Each metric column of a delta table row shows the JSON value of the metric its header names."""
    by_header = {shown.header: metric for metric, shown in labels.items()}
    for header, cell in row.items():
        if header == "name":
            continue
        metric = by_header[header]  # a header no metric owns fails here
        v = values[metric]
        assert cell.endswith("%") == labels[metric].percent, (what, header, cell)
        if labels[metric].count:
            assert cell == (str(int(v)) if v else ""), (what, header, cell, v)
        else:
            assert shows(cell, v), (what, header, cell, v)


def test_display_names_cover_every_metric_once():
    assert set(LABELS) == set(METRICS)
    # what each header and axis title says, written down once more: a swap inside the table shows here
    assert {m: (s.header, s.axis) for m, s in LABELS.items()} == {
        "share": ("share", "share of squared movement (%)"), "fro_delta": ("‖Δ‖_F", "‖Δ‖_F"),
        "rel_delta": ("‖Δ‖/‖W‖", "‖Δ‖_F / ‖W‖_F"), "max_abs_delta": ("max|Δ|", "max |Δ|"),
        "frac_unchanged": ("frac_same", "entries bitwise unchanged (%)"),
        "frac_within_tol": ("frac_tol", "entries with |Δ| ≤ tol (%)"),
        "n_nonfinite": ("nonfinite", "NaN/Inf entries (count)")}
    assert len({s.header for s in LABELS.values()}) == len(LABELS)
    assert all(s.axis.endswith("(%)") == s.percent for s in LABELS.values())


@pytest.mark.parametrize("which, extra", [("pair", ()), ("nan", ("--allow-nonfinite",)), ("two runs", ()),
                                          ("relative", ("--rtol", "0.05", "--tol", "0")), ("unmoved", ())])
def test_delta_tables(cli, pairs, which, extra):
    pair = pairs["nan" if which == "nan" else "pair"]
    rls = {"two runs": (pair.rl, pair.rl), "unmoved": (pair.rl, pairs["copy"])}.get(which, (pair.rl,))
    args = [a for rl in rls for a in ("--from", rl)]
    j, text = cli("run_delta", "delta", *args, "--top", "6", "--save", cli.cwd / "d.h5", *extra)
    tables = parse_tables(text)
    runs = list(j["runs"])
    moved = [lab for lab in runs if not j["runs"][lab]["identical"]]
    assert moved == [lab for lab in runs if lab != "copy"]  # the copy of the base, and only it, did not move
    assert len(tables) == 2 * len(moved) + 2 * (len(runs) > 1)  # with several runs: cosine, then overlap
    labels = delta_labels(j["tol"], j["rtol"])  # the tolerance column names its tolerance
    assert labels["frac_within_tol"].header == ("|Δ|≤0+0.05|W|" if which == "relative" else f"|Δ|≤{j['tol']:g}")
    for k, lab in enumerate(moved):
        run = j["runs"][lab]
        groups, movers = tables[2 * k], tables[2 * k + 1]
        assert flat(f"{lab} vs {j['base']}: groups") in flat(groups.above)
        assert groups.headers == ["name", *(s.header for s in labels.values())]
        assert groups.column("name") == sorted(run["groups"], key=lambda g: -run["groups"][g]["share"])
        for row in groups.rows:
            _check_metric_cells(row, run["groups"][row["name"]], f"{lab} group {row['name']}", labels)
        assert f"largest movers (top 6 of {len(run['tensors'])} tensors)" in movers.above
        assert [flat(n) for n in movers.column("name")] == [t["name"] for t in run["tensors"][:6]]
        tensors = {t["name"]: t for t in run["tensors"]}
        for row in movers.rows:
            _check_metric_cells(row, tensors[flat(row["name"])], f"{lab} tensor {row['name']}", labels)
        total = next(line for line in movers.below.splitlines() if line.startswith("total "))
        m = re.fullmatch(r"total ‖Δ‖_F (\S+), ‖Δ‖/‖W‖ (\S+); entries: (\S+)% bitwise unchanged, (\S+)% with (.+)",
                         total)
        assert m, total
        assert close(m[1], run["total"]["fro_delta"]) and close(m[2], run["total"]["rel_delta"])
        assert close(m[3], run["total"]["frac_unchanged"], 100.0) and close(m[4], run["total"]["frac_within_tol"], 100.0)
        assert m[5] == tolerance_rule(j["tol"], j["rtol"]) == (
            "|Δ| ≤ 0 + 0.05·|W_base|" if which == "relative" else f"|Δ| ≤ {j['tol']:g}")
        assert j["conventions"]["atol"] == j["tol"] and j["conventions"]["rtol"] == j["rtol"]
    if which == "nan":
        assert tables[0].row("name", "attn")["nonfinite"] == "3"  # the group of the tensor with NaN/±Inf
    if which == "unmoved":  # one line, in the table's place, as the JSON's note says it; no "noise of ∞"
        line = next(n for n in j["notes"] if n.startswith("copy is bit-identical to base"))
        assert text.count(line) == 1 and "∞" not in text and "nan" not in text
        assert j["runs"]["copy"]["precision"]["moved"] is False and j["runs"]["rl"]["precision"]["moved"] is True
        assert all(v["share"] == 0 for v in j["runs"]["copy"]["groups"].values())
    if len(runs) > 1:
        over = tables[-1]  # the overlap table: each cell the JSON's Jaccard (or chance [interval]) for its row
        pairs = {(flat(" · ".join(r["runs"])), r["group"]): r for r in j["overlap"]["pairs"]}
        assert len(over.rows) == len(pairs)
        heads = {"moved": "moved", "moved (bf16)": "moved_bf16", f"top {j['overlap']['top_frac']:g}": "top"}
        for row in over.rows:
            want = pairs[flat(row["runs"]), row["group"]]
            for head, mask in heads.items():
                value, chance = want[mask]["jaccard"], want[mask]
                assert (row[head] == "—") if value is None else close(row[head], value), (row, head)
                shown = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", row[f"{head}: chance"])
                if chance["chance"] is None:
                    assert row[f"{head}: chance"] == "—"
                    continue
                assert shown and all(close(x, chance[k]) for x, k in zip(shown.groups(),
                                                                         ("chance", "chance_low", "chance_high")))
        cos = tables[-2]
        assert cos.headers == ["run", *runs] and cos.column("run") == runs
        for a, row in enumerate(cos.rows):
            for b, lab in enumerate(runs):
                want = j["cosine"]["total"][a][b]  # null: undefined, a run that did not move has no direction
                assert (row[lab] == "—") if want is None else close(row[lab], want), (a, b, row[lab], want)
        assert (j["cosine"]["total"][0][1] is None) == (which == "unmoved")


# --------------------------------------------------------------------------------------------------
# inspect, graft (plans), sweep (plan)


def test_inspect_table(cli, pairs):
    j, text = cli("run_inspect", "inspect", pairs["pair"].base)
    (t,) = parse_tables(text)
    assert t.headers == ["group", "tensors", "params", "bytes"] and t.column("group") == list(j["groups"])
    assert flat(f"{j['layers']['decoder']} decoder layers") in flat(t.above)
    for row in t.rows:
        want = j["groups"][row["group"]]
        assert int(row["tensors"]) == want["tensors"] and row["params"] == f"{want['params']:,}"
        assert size_shows(row["bytes"], want["bytes"]), (row, want)


def test_graft_dry_run_table(cli, pairs):
    j, text = cli("run_graft", "graft", "--from", pairs["pair"].rl, "--groups", "attn,mlp", "--layers", "late",
                  "--dry-run")
    (t,) = parse_tables(text)
    assert t.headers == ["group", "layer", "tensors", "bytes"] and len(t.rows) == len(j["selected"]) > 0
    for row, want in zip(t.rows, j["selected"]):
        assert row["group"] == want["group"] and row["layer"] == ("—" if want["layer"] is None else str(want["layer"]))
        assert int(row["tensors"]) == want["tensors"] and size_shows(row["bytes"], want["bytes"])
    m = re.search(r"^(\S+ \S+) of (\S+ \S+) selected$", t.below, re.M)
    assert m and size_shows(m[1], j["selected_bytes"]) and size_shows(m[2], j["total_bytes"])


def test_graft_sweep_plan_table(cli, pairs):
    j, text = cli("run_graft", "graft", "--from", pairs["pair"].rl, "--sweep", "factorial", "--groups", "attn,mlp",
                  "--dry-run")
    (t,) = parse_tables(text)
    assert t.headers == ["config", "groups", "layers", "α", "role"]
    assert f"{j['count']} configurations" in t.above and len(t.rows) == len(j["experiments"]) == j["count"]
    for row, e in zip(t.rows, j["experiments"]):
        assert row["config"] == e["label"] and row["groups"] == (",".join(e["groups"]) or "—")
        assert row["layers"] == e["layers"] and float(row["α"]) == e["alpha"] and row["role"] == e["role"]


def test_sweep_plan_table(cli):
    grid = cli.cwd / "grid.yaml"
    grid.write_text("out: runs\ninits:\n  sft: /nowhere/sft\nbase: {init: sft, steps: 2}\n"
                    "product: {lr: [1.0e-4, 1.0e-3], beta: [0.0, 0.04]}\n")
    j, text = cli("run_sweep_grid", "sweep", grid, "--dry-run")
    (t,) = parse_tables(text)
    assert t.headers[:2] == ["name", "status"] and len(t.rows) == len(j["runs"]) == 4
    for row, r in zip(t.rows, j["runs"]):
        for header, cell in row.items():  # every column is headed by the JSON key it shows
            assert cell == (Path(r[header]).name if header == "init" else str(r[header])), (header, cell, r[header])


# --------------------------------------------------------------------------------------------------
# rank, couple


def _rank_cells(t: Parsed, rows: list[dict], metrics: list[str]) -> None:
    assert len(t.rows) == len(rows) > 0
    for row, want in zip(t.rows, rows):
        for m in metrics:
            assert shows(row[m], want[m]), (m, row, want)


def test_rank_weights_and_delta_tables(cli):
    from planted import planted_pair

    planted_pair(cli.cwd / "runs")
    for what in ("weights", "delta"):
        j, text = cli("run_rank", "rank", "--what", what, "--metric", "erank,stable_rank,numerical_rank")
        tables = parse_tables(text)
        assert len(tables) == len(j["models"]) > 0
        for t, (lab, m) in zip(tables, j["models"].items()):
            assert flat(f"{lab}: {what} ranks per layer") in flat(t.above)
            assert t.headers == ["layer", *j["metrics"]]
            rows = m["layers"] + m["outside_decoder"]
            assert [flat(c) for c in t.column("layer")] == [str(r["layer"]) if "layer" in r else r["tensor"] for r in rows]
            _rank_cells(t, rows, j["metrics"])
            said = re.search(r"saved (\S+) \((\d+) matrices, (\d+) 1-D tensors skipped", flat_lines(t.below))
            assert said and said[1] == m["result_file"] and int(said[2]) == m["matrices"] and int(said[3]) == m["skipped"]


def flat_lines(text: str) -> str:
    """Text printed with soft wrapping off, joined back into one line per paragraph."""
    return " ".join(text.split())


def test_rank_activations_table(cli):
    from planted import planted_pair

    planted_pair(cli.cwd / "runs")
    j, text = cli("run_rank", "rank", "--what", "activations", "--probes", "4", "--metric", "erank,participation_ratio")
    tables = parse_tables(text)
    assert len(tables) == len(j["models"]) == 2
    for t, (lab, m) in zip(tables, j["models"].items()):
        assert flat(f"{lab}: activation ranks per hidden state") in flat(t.above)
        assert t.headers == ["layer", "block", "tokens", *j["metrics"]]
        for row, want in zip(t.rows, m["layers"]):
            assert row["layer"] == str(want["layer"]) and int(row["tokens"]) == want["n_tokens"]
            assert row["block"] == ("emb" if want["block"] is None else str(want["block"]))
        _rank_cells(t, m["layers"], j["metrics"])
        assert f"saved {m['result_file']} ({m['n_prompts']} prompts)" in flat_lines(t.below)


@pytest.fixture
def coupling_run(tmp_path):
    """The synthetic grid of test_rank_coupling: an SFT and 8 RL runs (4 better, 4 worse), rank following success."""
    import test_rank_coupling as RC

    run, rng = tmp_path / "couple-run", np.random.default_rng(11)
    results = run / "results"
    base = (rng.random((RC.TASKS, RC.SEEDS, RC.EPISODES, 1)) < 0.5).astype(np.int8)
    descs = {"sft": RC._ckpt(run / "sft")}
    success = {"sft": base}
    for i, shift in enumerate([0.5, 0.6, 0.7, 0.8, -0.5, -0.6, -0.7, -0.8]):
        out = base.copy()
        out[rng.random(out.shape) < abs(shift)] = 1 if shift > 0 else 0
        descs[f"lr{i}"], success[f"lr{i}"] = RC._ckpt(run / f"lr{i}", run / "sft"), out
    for n, desc in descs.items():
        rate = success[n].mean()
        erank = np.concatenate([rng.normal(20, 1, RC.N_LAYERS - 2), [10 + 20 * rate, 5 + 8 * rate]])
        RC._eval_file(results, n, desc, success[n])
        RC._rank_file(results, n, desc, erank)
    return run


def test_couple_table(cli, coupling_run):
    from graftkit.rank.coupling import DIRECTIONS

    j, text = cli("run_couple", "couple", coupling_run, "--n-boot", "200")
    (t,) = parse_tables(text)
    assert t.headers == ["layer", "band", "Spearman ρ", "Pearson r", "runs", *(f"{d} agree" for d in DIRECTIONS),
                         "both directions"]
    rows = j["per_layer"] + j["per_band"]
    assert len(t.rows) == len(rows)
    for row, want in zip(t.rows, rows):
        assert row["layer"] == (str(want["layer"]) if "layer" in want else want["band"])
        assert row["band"] == (want["band"] if "layer" in want else "band mean")
        for header, key in (("Spearman ρ", "spearman"), ("Pearson r", "pearson")):
            c = want[key]
            assert shows_all(row[header], [c["estimate"], c["low"], c["high"]], 1.0), (header, row, c)
        assert int(row["runs"]) == want["n"] and row["both directions"] == want["verdict"]
        for d in DIRECTIONS:
            assert row[f"{d} agree"] == f"{want[d]['agree']}/{want[d]['total']}"
    bd = j["both_directions"]
    assert f"both directions vs SFT parent: {bd['improved']} improved, {bd['degraded']} degraded" in t.below


# --------------------------------------------------------------------------------------------------
# results, report, clean, demo


def test_results_table(cli):
    from test_report import write_run

    run = write_run(cli.cwd / "study")
    (run / "results" / "broken.h5").write_bytes(b"not hdf5")
    j, text = cli("run_results", "results", run)
    (t,) = parse_tables(text)
    assert t.headers == ["kind", "file", "created", "dimensions"] and len(t.rows) == len(j["results"]) + 1
    for row, r in zip(t.rows, j["results"]):
        assert flat(row["kind"]) == r["kind"] and flat(row["file"]) == r["file"]
        assert flat(row["created"]) == flat(r["created"])
        assert flat(row["dimensions"]) == flat(" ".join(f"{d}={n}" for d, n in r["dims"].items()))
    (bad,) = j["damaged"]
    last = t.rows[-1]
    assert last["kind"] == "damaged" and flat(last["file"]) == bad["file"] and last["created"] == "—"
    assert flat(last["dimensions"]) == flat(bad["reason"])


def test_report_summary(cli):
    from test_report import write_run

    run = write_run(cli.cwd / "study", kinds=("findings", "delta", "eval"))
    j, text = cli("run_report", "report", run, "--out", cli.cwd / "r.html")
    m = re.search(r"^report (\S+) \((\S+ \S+), (\d+) figures\)$", text, re.M)
    assert m and m[1] == j["path"] and size_shows(m[2], j["bytes"]) and int(m[3]) == j["figures"]
    assert re.search(r"^sections (.*)$", text, re.M)[1] == ", ".join(j["sections"])
    assert re.search(r"^no results for (.*)$", text, re.M)[1] == ", ".join(j["absent"])


def test_clean_summary(cli):
    run = cli.cwd / "run"
    (run / "results").mkdir(parents=True)
    (run / "results" / ".delta-rl.h5.tmp-999999999").write_bytes(b"x" * 3000)
    j, text = cli("run_clean", "clean", run, "--dry-run")
    (s,) = j["stale"]
    assert f"would remove {s['path']} (pid {s['pid']}, {fmt_size(s['bytes'])})" in flat_lines(text)
    m = re.search(r"^(\d+) stale temporaries \((\S+ \S+)\) in (\S+)", text, re.M)
    assert m and int(m[1]) == len(j["stale"]) and size_shows(m[2], j["bytes"]) and m[3] == j["run"]


def test_demo_findings_table(cli, monkeypatch):
    """The demo's table of findings (the study itself stubbed: its JSON is what the table must show)."""
    from dataclasses import asdict

    from graftkit.study.findings import Finding

    found = [Finding(1, "GRPO does not improve mastered tasks", "success fell by 4 points " * 6, -0.04, -0.08, 0.0,
                     "reproduced"),
             Finding(2, "gain with headroom", "success rose by 20 points", 0.2, 0.1, 0.3, "partly reproduced"),
             Finding(3, "attn+mlp carry the degrade", "not measured here", math.nan, math.nan, math.nan, "not measured"),
             Finding(4, "late rank tracks success", "the coupling is noise", 0.1, -0.5, 0.6, "not reproduced")]
    info = {"out": str(cli.cwd / "d"), "report": str(cli.cwd / "d" / "report.html"),
            "findings": [asdict(f) for f in found], "items_line": "items: 12 distinct", "models": {}, "seconds": 60.0}
    given = []
    monkeypatch.setattr(C, "run_study", lambda cfg, bars, on_stage: given.append(cfg) or info)
    j, text = cli("run_study", "demo", "--quick", "--workers", "1", "--out", cli.cwd / "d")
    assert given[0].workers == 1 and given[0].quick  # the command's options reach the study's preset
    (t,) = parse_tables(text)
    assert t.headers == ["#", "claim", "this run", "verdict"] and len(t.rows) == len(j["findings"]) == 4
    for row, f in zip(t.rows, j["findings"]):
        assert row["#"] == str(f["number"]) and flat(row["claim"]) == flat(f["claim"])
        assert flat(row["this run"]) == flat(f["statement"]) and flat(row["verdict"]) == flat(f["verdict"])


# --------------------------------------------------------------------------------------------------
# eval, headroom, graft experiments: tiny policies playing real episodes

TASKS = ("click-button", "focus-text")


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """A tiny SFT policy and two RL children, one moved in attention, one in the MLP (planted)."""
    from conftest import planted_policies

    return planted_policies(tmp_path_factory.mktemp("policies"))


def _rate(cell: str, r: dict) -> bool:
    """``50.0% [23.7, 76.3]``: a rate and its Wilson interval, in percent."""
    return cell.split()[0].endswith("%") and shows_all(cell, [r["rate"], r["low"], r["high"]])


def _diff(cell: str, r: dict, key: str) -> bool:
    """``+10.0 [-5.0, +20.0] [-4.0, +19.0]``: a difference, its bootstrap and Bayes intervals, in points."""
    return shows_all(cell, [r[key], *r["bootstrap"], *r["bayes"]])


def test_eval_tables(cli, policies):
    j, text = cli("run_eval", "eval", "--model", policies["rl"], "--compare", policies["sft"], "--tasks", ",".join(TASKS),
                  "--seeds", "2", "--episodes", "2", "--max-new-tokens", "8")
    tables = parse_tables(text)
    assert len(tables) == len(j["models"]) == 1
    for t, model in zip(tables, j["models"]):
        assert flat(f"{model['model']}: success over 2 seeds × 2 episodes (greedy") in flat(t.above)
        assert t.headers == ["task", "items", "success (95% Wilson)", "parsed", "sft", "diff [bootstrap] [Bayes]",
                             "McNemar p", "verdict"]
        assert t.column("task") == [r["task"] for r in model["tasks"]] == [*TASKS, "all"]
        for row, r in zip(t.rows, model["tasks"]):
            assert row["items"] == str(r.get("items", "?"))
            assert row["parsed"] == f"{100 * r['parsed']:.0f}%" and r["parsed"] == pytest.approx(1 - r["unparseable"])
            assert _rate(row["success (95% Wilson)"], r["model"]), (row, r["model"])
            assert _rate(row["sft"], r["compare"]), (row, r["compare"])  # the compared model's rate
            assert _diff(row["diff [bootstrap] [Bayes]"], r, "diff"), (row, r)
            assert close(row["McNemar p"], r["mcnemar_p"]) and row["verdict"] == r["verdict"]
            # the header says what the difference is: the model's rate minus the compared model's
            assert r["diff"] == pytest.approx(r["model"]["rate"] - r["compare"]["rate"])


def test_headroom_table(cli, policies):
    j, text = cli("run_headroom", "headroom", "--model", policies["sft"], "--tasks", TASKS[0], "--k", "3",
                  "--seeds", "2", "--episodes", "2", "--max-new-tokens", "8")
    (t,) = parse_tables(text)
    assert "k=3" in t.above
    assert t.headers == ["task", "items", "greedy", "sampled", "pass@3", "parsed", "headroom [bootstrap] [Bayes]",
                         "verdict"]
    assert t.column("task") == [r["task"] for r in j["tasks"]]
    for row, r in zip(t.rows, j["tasks"]):
        assert row["items"] == str(r.get("items", "?")) and row["verdict"] == r["verdict"]
        assert row["parsed"] == f"{100 * r['parsed']:.0f}%"
        for key in ("greedy", "sampled", "pass@3"):
            assert row[key].endswith("%") and shows(row[key], r[key]), (key, row, r)
        assert _diff(row["headroom [bootstrap] [Bayes]"], r, "headroom"), (row, r)
        assert r["headroom"] == pytest.approx(r["sampled"] - r["greedy"])  # what the header says it is


def _pts(cell: str, b) -> bool:
    """``+1.0 [-2.0, +3.0]``: (estimate, low, high) in points; ``—`` for an undefined one."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return cell == "—"
    return shows_all(cell, b)


def test_graft_experiment_tables(cli, policies):
    j, text = cli("run_graft", "graft", "--from", policies["rl"], "--sweep", "factorial", "--groups", "attn,mlp",
                  "--tasks", TASKS[0], "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4",
                  "--vs", policies["rl2"])
    tables = parse_tables(text)
    assert len(tables) == 2 * len(j["runs"]) + 1  # per run: configurations, attribution; then the dissociation
    for k, run in enumerate(j["runs"].values()):
        configs, attribution = tables[2 * k], tables[2 * k + 1]
        assert f"({j['seeds']} seeds × {j['episodes']} episodes per task)" in flat_lines(configs.above)
        assert configs.headers == ["config", "success", "vs base [95%]", "verdict vs base", "vs RL [95%]", "verdict vs RL",
                                   "parsed"]
        assert configs.column("config") == [c["config"] for c in run["configs"]]
        for row, c in zip(configs.rows, run["configs"]):
            assert row["success"].endswith("%") and shows(row["success"], c["success"])
            assert _pts(row["vs base [95%]"], c["diff_vs_base"]) and row["verdict vs base"] == c["verdict_vs_base"]
            assert _pts(row["vs RL [95%]"], c["diff_vs_rl"]) and row["verdict vs RL"] == c["verdict_vs_rl"]
            assert 0 <= c["parsed"] <= 1 and row["parsed"] == f"{100 * c['parsed']:.0f}%"
        assert attribution.column("group") == list(run["attribution"])
        names = {"movement share": "movement_share", "group effect": "group_effect", "main effect": "main_effect",
                 "shapley": "shapley"}
        assert attribution.headers[0] == "group" and set(attribution.headers[1:]) <= set(names)
        assert "shapley" in attribution.headers and "movement share" in attribution.headers
        for row in attribution.rows:
            want = run["attribution"][row["group"]]
            for header in attribution.headers[1:]:
                value = want.get(names[header])
                if header == "movement share":
                    assert row[header] == "—" if value is None else shows(row[header], value), (row, want)
                else:
                    assert _pts(row[header], value), (header, row, want)
        said = [line for line in configs.below.splitlines() + attribution.below.splitlines()
                if line.startswith("interaction ")]
        inter = run.get("interactions", [])
        assert len(said) == len(inter) > 0
        for line, want in zip(said, inter):
            name, cell = line.removeprefix("interaction ").split(": ", 1)
            assert name == "×".join(want["groups"]) and _pts(cell, want["interaction"])
    dis, want = tables[-1], j["dissociation"]
    assert dis.headers == ["group", "effect A", "effect B", "A − B", "verdict"]
    assert dis.column("group") == list(want["groups"])
    for row in dis.rows:
        g = want["groups"][row["group"]]
        assert _pts(row["effect A"], g["A"]) and _pts(row["effect B"], g["B"]) and _pts(row["A − B"], g["difference"])
        assert row["verdict"] == g["verdict"]
        assert g["difference"][0] == pytest.approx(g["A"][0] - g["B"][0])  # "A − B" is what it says


def _nats(cell: str, b) -> bool:
    """``0.0123 [0.0101, 0.0145]``: (estimate, low, high) in nats."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return cell == "—"
    return shows_all(cell, b, 1.0)


def _frac(cell: str, b) -> bool:
    """``37.5% [20.1, 50.2]``: a fraction and its interval, in percent."""
    if b is None or any(v is None or not math.isfinite(v) for v in b):
        return cell == "—"
    return cell.split()[0].endswith("%") and shows_all(cell, b)


def test_kl_tables(cli, policies):
    j, text = cli("run_kl", "kl", "--model", policies["rl"], "--tasks", ",".join(TASKS), "--seeds", "2",
                  "--episodes", "1", "--max-new-tokens", "4", "--top", "3", "--n-boot", "300")
    summary, tokens, actions = parse_tables(text)
    assert flat(f"{j['model']} (RL) vs {j['base']} (SFT): KL in nats") in flat(summary.above)
    assert flat(f"({j['seeds']} seeds × {j['episodes']} episodes per task") in flat(summary.above)
    kl_headers = {"RL tokens": ("rl", "tokens"), "RL parsed": ("rl", "parsed"),
                  "KL(RL‖SFT)/token [95%]": ("rl", "kl_per_token"), "KL(RL‖SFT)/episode [95%]": ("rl", "kl_per_episode"),
                  "SFT tokens": ("sft", "tokens"), "SFT parsed": ("sft", "parsed"),
                  "KL(SFT‖RL)/token [95%]": ("sft", "kl_per_token"), "KL(SFT‖RL)/episode [95%]": ("sft", "kl_per_episode")}
    assert summary.headers == ["task", "items", *kl_headers]
    assert summary.column("task") == [r["task"] for r in j["tasks"]] == [*TASKS, "all"]
    for row, r in zip(summary.rows, j["tasks"]):
        assert row["items"] == str(r["items"])
        for header, (side, key) in kl_headers.items():
            want = r[side][key]
            if key == "parsed":
                assert 0 <= want <= 1 and row[header] == f"{100 * want:.0f}%", (header, row, want)
            else:
                assert row[header] == str(want) if key == "tokens" else _nats(row[header], want), (header, row, want)
    for t, what in ((tokens, "token"), (actions, "action")):
        assert t.headers == ["direction", what, "log π_RL − log π_SFT", "count"]
        want = [{"direction": d, **x} for d in ("gained", "lost") for x in j["top"][what][d]]
        assert len(t.rows) == len(want) > 0
        for row, w in zip(t.rows, want):
            assert row["direction"] == w["direction"] and flat(row[what]) == flat(repr(w["text"]))
            assert close(row["log π_RL − log π_SFT"], w["log_ratio"]) and row["count"] == str(w["count"])
            assert (w["log_ratio"] > 0) == (w["direction"] == "gained")
    assert f"saved {j['file']}" in flat_lines(actions.below)


def test_graft_kl_tables(cli, policies):
    j, text = cli("run_graft", "graft", "--from", policies["rl"], "--sweep", "factorial", "--groups", "attn,mlp",
                  "--tasks", TASKS[0], "--seeds", "2", "--episodes", "1", "--max-new-tokens", "4", "--metric", "both")
    run = j["runs"]["A"]
    success, attribution, configs, kl_attribution = parse_tables(text)
    assert success.headers[:2] == ["config", "success"] and attribution.headers[0] == "group"  # as with success alone
    assert flat("fraction of RL's behavioural change each graft reproduces, by KL") in flat(configs.above)
    assert configs.headers == ["config", "KL(RL‖C)/token", "reproduced RL [95%]", "KL(SFT‖C)/token",
                               "reproduced SFT [95%]"]
    assert configs.column("config") == success.column("config") == [c["config"] for c in run["configs"]]
    for row, c in zip(configs.rows, run["configs"]):
        for side, p in (("rl", "RL"), ("sft", "SFT")):
            assert close(row[f"KL({p}‖C)/token"], c["kl"][side]["kl_per_token"]), (row, c)
            assert _frac(row[f"reproduced {p} [95%]"], c["kl"][side]["reproduced"]), (row, c)
    assert "reproduced: reproduced_RL(C) = 1 − Σ_e K_e(π_RL‖π_C)" in flat_lines(configs.below)
    assert attribution.column("group") == kl_attribution.column("group") == list(run["attribution"])
    sides = run["kl"]["sides"]
    names = {"group effect": "group_effect", "main effect": "main_effect", "shapley": "shapley"}
    assert kl_attribution.headers == ["group", *(f"{s.upper()} {n}" for s in sides for n in names)]
    for row in kl_attribution.rows:
        for header in kl_attribution.headers[1:]:
            side, name = header.split(" ", 1)
            assert _pts(row[header], sides[side.lower()]["attribution"][row["group"]][names[name]]), (header, row)
    lines = kl_attribution.below.splitlines()
    said = dict(line.split(": ", 1) for line in lines if line.startswith("KL interaction "))
    want = {f"KL interaction {s.upper()} {'×'.join(r['groups'])}": r["interaction"]
            for s in sides for r in sides[s]["interactions"]}
    assert set(said) == set(want) and all(_pts(said[k], v) for k, v in want.items())
    # the total is of the swept groups (here every group RL moved: attention only), named as such
    of = run["kl"]["shapley_total_of"]
    assert of["what"] == "v(all swept groups: attn, mlp) − v(∅)" and of["whole_change"] is True
    totals = {m[1]: m for line in lines if (m := re.fullmatch(r"KL Shapley total (\w+) \((.+)\) = (.+) — (.+)", line))}
    assert set(totals) == {s.upper() for s in sides}
    for s in sides:
        m = totals[s.upper()]
        assert m[2] == of["what"] and _pts(m[3], sides[s]["shapley_total"]) and m[4] == "all of RL's change"


def test_the_kl_shapley_total_says_which_groups_it_is_of():
    """v(N) − v(∅) is the swept groups' total: the RL model's whole change only when the groups left out hold none
    of its movement and every layer was grafted; otherwise the line says it is not, and why (from --json)."""
    from types import SimpleNamespace

    from graftkit.graft.commands import kl_tables, shapley_total_of

    def line(groups, layers, share):
        v = SimpleNamespace(groups=groups, attrs={"layers": layers}, movement_share=share)
        of = shapley_total_of(v)
        side = {"attribution": {g: {} for g in groups}, "group_effect": None, "shapley_total": [0.4, 0.2, 0.6]}
        run = {"configs": [], "attribution": {g: {} for g in groups},
               "kl": {"reproduced": {"rl": "r", "sft": "s"}, "endpoints": "e", "sides": {"rl": side},
                      "shapley_total_of": of}}
        (text,) = [x for x in kl_tables(run, "rl", 1, 1) if isinstance(x, str) and x.startswith("KL Shapley")]
        return of, text

    of, text = line(["attn", "mlp"], "all", {"attn": 0.7, "mlp": 0.3})
    assert of["whole_change"] and of["unswept_movement_share"] == pytest.approx(0.0, abs=1e-12)
    assert text == "KL Shapley total RL (v(all swept groups: attn, mlp) − v(∅)) = +40.0 [+20.0, +60.0] — all of RL's change"
    of, text = line(["attn", "mlp"], "all", {"attn": 0.1, "mlp": 0.05})  # the embedding moved most
    assert of["whole_change"] is False and of["unswept_movement_share"] == pytest.approx(0.85)
    assert text.endswith("— not the RL model's whole change: the groups not swept hold 85% of RL's squared weight "
                         "movement")
    of, text = line(["attn"], "late", {"attn": 1.0})
    assert of["what"] == "v(all swept groups: attn; layers late) − v(∅)" and of["whole_change"] is False
    assert text.endswith("— not the RL model's whole change: only layers late were grafted")
    of, text = line(["attn"], "all", None)
    assert of["whole_change"] is None and text.endswith("— whether the swept groups hold all of RL's movement was "
                                                        "not recorded")


# --------------------------------------------------------------------------------------------------
# train: the one-line summaries


def test_train_summaries(cli):
    j, text = cli("run_train_sft", "train", "sft", "--out", cli.cwd / "sft", "--tasks", "click-button", "--budget",
                  "click-button=8", "--size", "nano", "--steps", "2", "--batch-size", "4", "--threads", "1")
    m = re.search(r"^SFT policy → (\S+): (\d+) steps, final action loss (\S+), (\d+) s$", text, re.M)
    assert m and m[1] == j["out"] and int(m[2]) == j["steps"] and close(m[3], j["final_loss"])
    j, text = cli("run_train_grpo", "train", "grpo", "--init", cli.cwd / "sft", "--out", cli.cwd / "rl", "--tasks",
                  "click-button", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8",
                  "--threads", "1")
    m = re.search(r"^GRPO policy → (\S+): (\d+) steps, (\S+) s/step, last batch success (\S+)$", text, re.M)
    assert m and m[1] == j["out"] and int(m[2]) == j["steps"]
    assert close(m[3], j["seconds_per_step"]) and close(m[4], j["final"]["success"])


# --------------------------------------------------------------------------------------------------
# the report's figures: each title, axis and series name says what its array holds

BOUND = ("estimate", "low", "high")


def axis(fig, which: str = "y") -> str:
    return getattr(fig.layout, f"{which}axis").title.text or ""


def heading(fig) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", fig.layout.title.text or "").split())


def trace(fig, name: str):
    (t,) = [t for t in fig.data if t.name == name]
    return t


@dataclass
class Shown:
    """What one entry of a figure's menu shows: its label, the traces it makes visible, and the title and axis
    titles it sets (the figure's own where it sets none)."""

    label: str
    data: list
    title: str
    x: str
    y: str

    def trace(self, name: str):
        (t,) = [t for t in self.data if t.name == name]
        return t


def options(fig) -> list[Shown]:
    """Every entry of a figure's menu (one entry showing everything without a menu). Every trace is shown by
    exactly one entry of a run menu (a menu of groups may show a trace in several), the first entry's traces
    are those visible as drawn, and ``layout.meta`` names the same traces as the buttons."""
    plain = lambda text: " ".join(re.sub(r"<[^>]+>", " ", text or "").split())  # noqa: E731
    if not fig.layout.updatemenus:
        return [Shown("", list(fig.data), heading(fig), axis(fig, "x"), axis(fig))]
    (menu,) = fig.layout.updatemenus
    out = []
    for b in menu.buttons:
        mask = b.args[0]["visible"]
        assert len(mask) == len(fig.data)
        changes = b.args[1] if len(b.args) > 1 else {}
        out.append(Shown(b.label, [t for t, v in zip(fig.data, mask) if v],
                         plain(changes.get("title.text", fig.layout.title.text)),
                         changes.get("xaxis.title.text", axis(fig, "x")), changes.get("yaxis.title.text", axis(fig))))
    meta = fig.layout.meta
    assert [o["label"] for o in meta["options"]] == [b.label for b in menu.buttons]
    for o, b in zip(meta["options"], menu.buttons):
        assert o["traces"] == [i for i, v in enumerate(b.args[0]["visible"]) if v]
    first = menu.buttons[0].args[0]["visible"]
    assert [t.visible is not False for t in fig.data] == list(first) and heading(fig) == out[0].title
    if meta["selector"] != "regime":  # a run menu: each trace belongs to one run
        assert sum(len(o.data) for o in out) == len(fig.data)
    return out


def in_percent(label: str) -> bool:
    """Does an axis say it shows fractions ×100: '(%)' (a rate or share) or 'percentage points' (a difference)?"""
    return "(%)" in label or "(percentage points)" in label


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Results of every kind the report reads, with known arrays (tests/test_report.py's run)."""
    from test_report import write_run

    from graftkit.results.store import read_result

    run = write_run(tmp_path_factory.mktemp("figures") / "study")
    return {p.stem: read_result(p) for p in sorted((run / "results").glob("*.h5"))}


def test_success_figures(synthetic):
    from graftkit.figures import success as S

    sft, rl, head = synthetic["eval-sft-greedy"], synthetic["eval-rl-greedy"], synthetic["headroom-sft"]
    tasks = [str(t) for t in sft.coords["task"]]

    def rate(x, i=None):  # successes / episodes of task i (all tasks when None)
        x = np.asarray(x, dtype=np.float64)
        return (x if i is None else x[i]).mean()

    fig = S.success_rates([("sft", sft), ("rl", rl)])
    assert heading(fig).startswith("Success rate per task") and axis(fig) == "success rate (%)" and in_percent(axis(fig))
    assert axis(fig, "x") == "task" and fig.layout.legend.title.text == "model"
    for name, res in (("sft", sft), ("rl", rl)):
        t = trace(fig, name)
        assert list(t.x) == [*tasks, S.ALL_TASKS]
        np.testing.assert_allclose(t.y, [100 * rate(res["success"], i) for i in range(len(tasks))]
                                   + [100 * rate(res["success"])])

    fig = S.paired_differences("sft", [("rl", S.paired_vs(sft, rl))])
    assert heading(fig).startswith("Paired difference vs sft") and "success(model) − success(reference)" in heading(fig)
    assert axis(fig) == "difference in success (percentage points)" and in_percent(axis(fig))
    t = trace(fig, "rl")
    assert list(t.x) == [*tasks, S.ALL_TASKS]
    np.testing.assert_allclose(t.y, [100 * (rate(rl["success"], i) - rate(sft["success"], i)) for i in range(len(tasks))]
                               + [100 * (rate(rl["success"]) - rate(sft["success"]))])

    fig = S.headroom_rates("sft", head)
    assert heading(fig).startswith("Greedy vs sampled success — sft") and axis(fig) == "success rate (%)"
    for name, key in (("greedy", "greedy_success"), ("sampled", "success")):
        np.testing.assert_allclose(trace(fig, name).y, [100 * rate(head[key], i) for i in range(len(tasks))]
                                   + [100 * rate(head[key])])

    fig = S.headroom_differences([("sft", S.headroom_of(head))])
    assert heading(fig).startswith("Headroom: sampled − greedy success")
    assert axis(fig) == "sampled − greedy success (percentage points)" and in_percent(axis(fig))
    t = trace(fig, "sft")
    got = dict(zip(t.x, t.y))
    for i, task in enumerate(tasks):
        assert got[task] == pytest.approx(100 * (rate(head["success"], i) - rate(head["greedy_success"], i)))


@pytest.fixture(scope="module")
def trajectory(pairs, tmp_path_factory):
    """A real delta result over two checkpoints of one run (steps 10 and 20): half the planted delta, then all of it."""
    from graftkit.graft import delta_anatomy
    from graftkit.weights import open_checkpoint

    pair = pairs["pair"]
    half = P.save_rl(tmp_path_factory.mktemp("half") / "rl", P.apply_deltas(pair.model, {n: 0.5 * d for n, d in
                                                                                          pair.deltas.items()}), pair.base)
    b = open_checkpoint(pair.base)
    return delta_anatomy(b, [open_checkpoint(half), open_checkpoint(pair.rl)], ["step-10", "step-20"], b.taxonomy(),
                         provenance={"steps": [10, 20]}, force_pair=True)


def test_anatomy_figures(trajectory):
    from graftkit.figures import anatomy as A

    res = trajectory
    groups, layers = [str(g) for g in res.coords["group"]], np.asarray(res.coords["layer"])
    tg, tl = np.array([str(g) for g in res["tensor_group"]]), np.asarray(res["tensor_layer"])
    sumsq = np.asarray(res["sumsq_delta"])  # [run, tensor]: every figure below is a function of it
    in_layers = [g for g in groups if ((tg == g) & (tl >= 0)).any()]
    by_axis = {shown.axis: metric for metric, shown in LABELS.items()}
    runs = [("step-10", res, 0), ("step-20", res, 1)]
    for metric in ("share", "rel_delta"):
        # the report's figure: one heatmap per run, a menu of the runs' labels; each entry checked as drawn
        fig = A.anatomy_heatmaps(runs, metric)
        assert [o.label for o in options(fig)] == ["step-10", "step-20"]
        for r, shown in enumerate(options(fig)):
            (hm,) = shown.data
            total = sumsq[r].sum()
            named = by_axis[hm.colorbar.title.text]  # the metric the colour bar names
            assert named == metric and shown.title.startswith(f"{A.HEATMAPS[metric][1]} — {shown.label}")
            assert shown.x == "parameter group" and shown.y == "decoder layer"
            assert list(hm.x) == in_layers and list(hm.y) == list(layers)
            for i, L in enumerate(layers):
                for k, g in enumerate(in_layers):
                    cell = (tl == L) & (tg == g)
                    if metric == "share":
                        want = sumsq[r, cell].sum() / total
                    else:
                        want = math.sqrt(sumsq[r, cell].sum() / np.asarray(res["sumsq_base"])[cell].sum())
                    assert hm.z[i][k] == pytest.approx(LABELS[metric].scale * want, rel=1e-9, abs=1e-12), (metric, L, g)
        # one run alone: its figure, no menu
        assert not A.anatomy_heatmaps(runs[1:], metric).layout.updatemenus
    fig = A.top_tensors_by_run(runs, n=5)
    assert [o.label for o in options(fig)] == ["step-10", "step-20"]
    names = [str(n) for n in res.coords["tensor"]]
    for r, shown in enumerate(options(fig)):
        total = sumsq[r].sum()
        assert by_axis[shown.x] == "share" and shown.y == "tensor"
        assert shown.title.startswith(f"Largest movers — {shown.label}")
        (bar,) = shown.data
        assert bar.name == shown.label
        want = sorted(sumsq[r] / total, reverse=True)[:5]
        np.testing.assert_allclose(bar.x, [100 * w for w in want], rtol=1e-9)
        assert [sumsq[r, names.index(n)] / total for n in bar.y] == pytest.approx(want, rel=1e-9)
    fig = A.group_shares([("step-10", res, 0), ("step-20", res, 1)])
    assert by_axis[axis(fig)] == "share" and axis(fig, "x") == "parameter group"
    for r, name in enumerate(("step-10", "step-20")):
        t = trace(fig, name)
        assert list(t.x) == groups
        np.testing.assert_allclose(t.y, [100 * sumsq[r, tg == g].sum() / sumsq[r].sum() for g in groups], rtol=1e-9)

    fig = A.movement_over_steps("run", res)
    assert by_axis[axis(fig)] == "rel_delta" and axis(fig, "x") == "optimiser step"
    base = np.asarray(res["sumsq_base"])
    for g in groups:
        t = trace(fig, g)
        assert list(t.x) == [10, 20]
        want = [math.sqrt(sumsq[r, tg == g].sum() / base[tg == g].sum()) if base[tg == g].sum() else 0.0 for r in range(2)]
        np.testing.assert_allclose(t.y, want, rtol=1e-9, atol=1e-12)
    fig = A.layer_movement_over_steps("run", res)
    (hm,) = fig.data
    assert by_axis[hm.colorbar.title.text] == "fro_delta" and axis(fig, "x") == "optimiser step"
    assert axis(fig, "y") == "decoder layer" and list(hm.x) == ["10", "20"] and list(hm.y) == list(layers)
    for i, L in enumerate(layers):
        np.testing.assert_allclose(hm.z[i], [math.sqrt(sumsq[r, tl == L].sum()) for r in range(2)], rtol=1e-6)


@pytest.fixture(scope="module")
def graft_results():
    """A real factorial sweep over attn and mlp, its dissociation against a second run (test_report's recipe)."""
    from graftkit.graft import attribution as GA
    from graftkit.graft import experiments as X

    rng = np.random.default_rng(1)
    groups, present = ["attn", "mlp"], ["embed", "attn", "mlp", "norm"]
    exps = X.expand_sweep("factorial", groups, present)

    def outcomes(p_attn: float, p_mlp: float):
        return {e.label: (rng.random((2, 5, 4)) < 0.8 - p_attn * ("attn" in e.groups) - p_mlp * ("mlp" in e.groups))
                .astype(np.int8) for e in exps}

    sa, sb = outcomes(0.4, 0.1), outcomes(0.0, 0.3)
    sweep = X.sweep_result("factorial", exps, sa, ["click-button", "enter-text"], list(range(5)), 4, groups,
                           movement_share={"attn": 0.3, "mlp": 0.2}, n_boot=200)
    d = GA.dissociation(X.subset_outcomes(exps, sa), X.subset_outcomes(exps, sb), groups, n_boot=200)
    dis = X.dissociation_result(d, {"A": {"path": "/x/a", "label": "a"}, "B": {"path": "/x/b", "label": "b"}})
    return sweep, dis, sa


@pytest.fixture(scope="module")
def graft_pair(graft_results):
    """Two sweeps and two dissociations (test_report's recipe): a run's and another's, with other outcomes."""
    from graftkit.graft import attribution as GA
    from graftkit.graft import experiments as X

    rng = np.random.default_rng(2)
    groups, present = ["attn", "mlp"], ["embed", "attn", "mlp", "norm"]
    exps = X.expand_sweep("factorial", groups, present)
    sb = {e.label: (rng.random((2, 5, 4)) < 0.9 - 0.5 * ("mlp" in e.groups)).astype(np.int8) for e in exps}
    sweep_b = X.sweep_result("factorial", exps, sb, ["click-button", "enter-text"], list(range(5)), 4, groups,
                             movement_share={"attn": 0.1, "mlp": 0.6}, n_boot=200)
    sweep, dis, sa = graft_results
    d = GA.dissociation(X.subset_outcomes(exps, sb), X.subset_outcomes(exps, sa), groups, n_boot=200)
    dis_b = X.dissociation_result(d, {"A": {"path": "/x/b", "label": "b"}, "B": {"path": "/x/a", "label": "a"}})
    return {"a": sweep, "b": sweep_b}, {"a vs b": dis, "b vs a": dis_b}


def test_graft_menus_show_each_sweep_as_drawn(graft_pair):
    """The report's graft figures of several sweeps: each menu entry, named after its sweep, shows that sweep's
    arrays under that sweep's title."""
    from graftkit.figures import grafts as G

    sweeps, dissociations = graft_pair
    est = [str(b) for b in sweeps["a"].coords["bound"]].index("estimate")
    menus = {build: G.by_sweep([(lab, build(lab, res)) for lab, res in sweeps.items()])
             for build in (G.graft_effects, G.attribution, G.interaction_heatmap, G.movement_vs_effect)}
    for build, fig in menus.items():
        entries = options(fig)
        assert [o.label for o in entries] == list(sweeps)
        for o in entries:
            res = sweeps[o.label]
            assert o.title.endswith(f"— {o.label}") or f"— {o.label} " in o.title, o.title
            if build is G.graft_effects:
                assert o.title.startswith("Graft effects") and o.x == "change in success (percentage points)"
                for name, array in (("vs base (SFT)", "diff_vs_base"), ("vs RL", "diff_vs_rl")):
                    assert list(o.trace(name).y) == [str(c) for c in res.coords["config"]]
                    np.testing.assert_allclose(o.trace(name).x, _in_points(res, array)[:, est])
            elif build is G.attribution:
                assert o.y == "contribution to success (percentage points)"
                for name, array in (("Shapley value", "shapley"), ("main effect", "main_effect")):
                    np.testing.assert_allclose(o.trace(name).y, _in_points(res, array)[:, est])
            elif build is G.interaction_heatmap:
                (hm,) = o.data
                np.testing.assert_allclose(hm.z, _in_points(res, "interaction")[..., est])
            else:
                (t,) = o.data
                np.testing.assert_allclose(t.x, [100 * res["movement_share"][i] for i in range(2)])
                np.testing.assert_allclose(t.y, _in_points(res, "shapley")[:, est])
    fig = G.by_sweep([(lab, G.dissociation(lab, res)) for lab, res in dissociations.items()], "dissociation")
    assert fig.layout.meta["selector"] == "dissociation"
    for o in options(fig):
        res = dissociations[o.label]
        assert o.title.startswith(f"Double dissociation — {o.label}")
        eff = _in_points(res, "effect")
        for k, (run, name) in enumerate(zip("AB", o.label.split(" vs "))):
            np.testing.assert_allclose(o.trace(f"effect in run {run} ({name})").y, eff[k, :, est])
        np.testing.assert_allclose(o.trace("difference A − B").y, _in_points(res, "difference")[:, est])


def _in_points(res, name: str) -> np.ndarray:
    """An array of (estimate, low, high) in percentage points, by the unit its attrs give."""
    unit = str(res.var_attrs.get(name, {}).get("unit", "")).lower()
    return np.asarray(res[name], dtype=np.float64) * (1.0 if unit in ("points", "pp", "percentage points", "%") else 100.0)


@pytest.mark.parametrize("unit", [None, "points"])
def test_graft_figures(graft_results, unit):
    from graftkit.figures import grafts as G
    from graftkit.results.store import Result

    sweep, dis, played = graft_results
    if unit == "points":  # the same results stored in points: the figures must not scale them again
        def in_pts(res, names):
            data = {k: (dims, np.asarray(v) * 100 if k in names else v) for k, (dims, v) in res.data.items()}
            return Result(res.kind, res.coords, data, res.attrs,
                          {**res.var_attrs, **{k: {**res.var_attrs.get(k, {}), "unit": "points"} for k in names}})
        sweep = in_pts(sweep, [k for k in sweep.data if k in ("diff_vs_base", "diff_vs_rl", "main_effect", "shapley",
                                                              "interaction", "group_effect")])
        dis = in_pts(dis, ["effect", "difference"])
    configs = [str(c) for c in sweep.coords["config"]]
    bound = [str(b) for b in sweep.coords["bound"]]
    est = bound.index("estimate")

    fig = G.graft_effects("a", sweep)
    assert axis(fig, "x") == "change in success (percentage points)" and axis(fig, "y") == "grafted configuration"
    for name, array in (("vs base (SFT)", "diff_vs_base"), ("vs RL", "diff_vs_rl")):
        t = trace(fig, name)
        assert list(t.y) == configs
        np.testing.assert_allclose(t.x, _in_points(sweep, array)[:, est])
    # and "vs base" is what it says: the configuration's success minus the base's, in points
    base_rate = played[configs[0]].mean()
    np.testing.assert_allclose(trace(fig, "vs base (SFT)").x, [100 * (played[c].mean() - base_rate) for c in configs])

    fig = G.attribution("a", sweep)
    assert axis(fig) == "contribution to success (percentage points)" and axis(fig, "x") == "parameter group"
    for name, array in (("Shapley value", "shapley"), ("main effect", "main_effect")):
        t = trace(fig, name)
        assert list(t.x) == [str(g) for g in sweep.coords["group"]]
        np.testing.assert_allclose(t.y, _in_points(sweep, array)[:, est])

    fig = G.interaction_heatmap("a", sweep)
    (hm,) = fig.data
    assert hm.colorbar.title.text == "interaction (points)"
    np.testing.assert_allclose(hm.z, _in_points(sweep, "interaction")[..., est])

    fig = G.movement_vs_effect("a", sweep)
    assert axis(fig, "x") == LABELS["share"].axis and axis(fig) == "effect on success (percentage points)"
    (t,) = fig.data
    assert t.name == "Shapley value" and list(t.text) == ["attn", "mlp"]
    np.testing.assert_allclose(t.x, [30.0, 20.0])
    np.testing.assert_allclose(t.y, _in_points(sweep, "shapley")[:, est])

    fig = G.dissociation("a vs b", dis)
    assert axis(fig) == "effect on success (percentage points)" and axis(fig, "x") == "parameter group"
    eff = _in_points(dis, "effect")
    for k, run in enumerate(("A", "B")):
        np.testing.assert_allclose(trace(fig, f"effect in run {run} ({run.lower()})").y, eff[k, :, est])
    diff = trace(fig, "difference A − B")
    np.testing.assert_allclose(diff.y, _in_points(dis, "difference")[:, est])
    np.testing.assert_allclose(diff.y, eff[0, :, est] - eff[1, :, est])  # "A − B" is what it says


@pytest.fixture(scope="module")
def coupling_results():
    """A real coupling result: 5 checkpoints × 6 layers, rank random, success rising; the both-directions arrays."""
    from graftkit.rank.coupling import both_directions, coupling, coupling_result

    rng = np.random.default_rng(1)
    R, s = rng.random((5, 6)) * 10, np.array([0.2, 0.3, 0.5, 0.6, 0.9])
    runs = [f"r{i}" for i in range(5)]
    corr = coupling(R, s, np.full(5, 40), n_boot=200, runs=runs)
    both = both_directions(R, s, R.mean(0), 0.5, ["credibly better", "credibly worse"] * 2 + ["no credible change"],
                           runs=runs)
    return coupling_result(corr, both), R, s


def test_rank_figures(synthetic, coupling_results):
    from graftkit.figures import rank as RF

    kinds = [("rank-weights", ["rank-weights-sft", "rank-weights-rl"]), ("rank-delta", ["rank-delta-rl"]),
             ("rank-activations", ["rank-activations-sft"])]
    for kind, stems in kinds:
        results = [(s.rsplit("-", 1)[1], synthetic[s]) for s in stems]
        fig = RF.rank_by_layer(kind, results)
        metrics = [str(m) for m in results[0][1].coords["metric"]]
        assert axis(fig, "x") == RF.TARGETS[kind][1] and heading(fig).startswith(f"Rank by layer — {RF.TARGETS[kind][0]}")
        assert axis(fig) == RF.unit(metrics[0])  # the metric shown first
        buttons = fig.layout.updatemenus[0].buttons
        assert [b.label for b in buttons] == metrics
        for b in buttons:  # each menu entry shows its metric's lines under its metric's axis title
            m = b.label
            shown = [t for t, visible in zip(fig.data, b.args[0]["visible"]) if visible]
            assert b.args[1]["yaxis.title.text"] == RF.unit(m) and m in b.args[1]["title.text"]
            assert [t.name for t in shown] == [lab for lab, _ in results] and {t.meta for t in shown} == {m}
            for t, (_, res) in zip(shown, results):
                k = [str(x) for x in res.coords["metric"]].index(m)
                if "value_layer" in res.data:
                    g = [str(x) for x in res.coords["group"]].index("all")
                    np.testing.assert_allclose(t.y, np.asarray(res["value_layer"])[:, g, k])
                else:
                    np.testing.assert_allclose(t.y, np.asarray(res["value"])[:, k])
    assert RF.unit("erank") == "effective rank (dimensions)"

    res, R, s = coupling_results
    stats, bound = [str(x) for x in res.coords["stat"]], [str(b) for b in res.coords["bound"]]
    fig = RF.coupling_by_layer("c", res)
    assert axis(fig) == "correlation of rank with success" and axis(fig, "x") == "decoder layer"
    for k, st in enumerate(stats):
        t = trace(fig, {"spearman": "Spearman ρ", "pearson": "Pearson r"}[st])
        np.testing.assert_allclose(t.y, np.asarray(res["corr_layer"])[:, k, bound.index("estimate")])
    # and the trace named Pearson r holds the Pearson correlation of each layer's rank with success
    pearson = trace(fig, "Pearson r").y
    np.testing.assert_allclose(pearson, [np.corrcoef(R[:, L], s)[0, 1] for L in range(R.shape[1])], rtol=1e-9)

    fig = RF.coupling_scatter("c", res)
    assert axis(fig) == "success rate (%)" and axis(fig, "x").startswith("late-band rank")
    (t,) = fig.data
    np.testing.assert_allclose(t.y, 100 * s)
    np.testing.assert_allclose(t.x, R[:, 4:].mean(1))  # the late band of 6 layers: 4 and 5

    fig = RF.both_directions("c", res)
    assert axis(fig) == "runs agreeing in sign (%)" and in_percent(axis(fig))
    directions = [str(d) for d in res.coords["direction"]]
    frac, agree, total = (np.asarray(res[n], dtype=np.float64) for n in ("frac_layer", "agree_layer", "total_layer"))
    for k, d in enumerate(directions):
        t = trace(fig, f"{d} runs")
        np.testing.assert_allclose(t.y, 100 * frac[:, k, bound.index("estimate")])
        assert [c[0] for c in t.customdata] == [f"{int(a)}/{int(n)}" for a, n in zip(agree[:, k], total[:, k])]


def test_training_curve_figures(synthetic):
    from graftkit.figures import curves as CF

    runs = [("sft (SFT)", synthetic["train-sft-sft"]), ("rl (GRPO)", synthetic["train-grpo-rl"])]
    families = CF.families_present(runs)
    assert {f.key for f in families} == {f.key for f in CF.FAMILIES}
    for fam in families:
        fig = CF.training_curve(runs, fam)
        assert heading(fig).startswith(fam.title) and axis(fig, "x") == "optimiser step" and axis(fig) == fam.y_title
        assert ("(%)" in fam.y_title) == (fam.scale == 100.0)
        for label, res in runs:
            for metric in fam.metrics:
                if metric not in res.data:
                    continue
                name = label + (f" · {metric}" if len(fam.metrics) > 1 else "")
                t = trace(fig, name)
                np.testing.assert_allclose(t.x, res.coords["step"])
                np.testing.assert_allclose(t.y, fam.scale * np.asarray(res[metric]))


def test_training_curves_of_a_study_order_colour_and_filter_by_regime(synthetic):
    """With the runs' names, the lines come in study order in their run's colour, and each entry of the regime
    menu shows exactly that regime's runs (every line of them, each still its run's arrays)."""
    from graftkit.figures import curves as CF
    from graftkit.figures.runs import run_colours

    grpo, sft = synthetic["train-grpo-rl"], synthetic["train-sft-sft"]
    names = ["sft", "degrade-s1", "null-s0", "degrade-s0", "collapse-s0"]
    runs = [(f"{n} ({'SFT' if n == 'sft' else 'GRPO'})", sft if n == "sft" else grpo) for n in names]
    colours = dict(zip(names, run_colours(names)))
    for fam in CF.families_present(runs):
        fig = CF.training_curve(runs, fam, names)
        drawn = [n for n in ("sft", "null-s0", "degrade-s0", "degrade-s1", "collapse-s0")
                 if any(m in (sft if n == "sft" else grpo).data for m in fam.metrics)]
        order = list(dict.fromkeys(t.name.split(" (")[0] for t in fig.data))
        assert order == drawn
        for t in fig.data:
            assert t.line.color == colours[t.name.split(" (")[0]]
        entries = options(fig)
        groups = {"all runs": drawn, "null": ["null-s0"], "degrade": ["degrade-s0", "degrade-s1"],
                  "collapse": ["collapse-s0"], "runs in no regime": ["sft"]}
        present = [g for g in groups if g == "all runs" or set(groups[g]) & set(drawn)]
        if len(present) <= 2:  # the runs that logged this family sit in one group: no menu
            assert [o.label for o in entries] == [""]
            continue
        assert [o.label for o in entries] == present
        for o in entries:
            assert o.title.startswith(fam.title) and o.x == "optimiser step" and o.y == fam.y_title
            shown = [t.name.split(" (")[0] for t in o.data]
            assert list(dict.fromkeys(shown)) == [n for n in drawn if n in groups[o.label]]
            assert len(shown) == sum(sum(m in (sft if n == "sft" else grpo).data for m in fam.metrics)
                                     for n in dict.fromkeys(shown))  # every line of each run it shows
            for t in o.data:
                res = sft if t.name.startswith("sft ") else grpo
                metric = t.name.split(" · ")[-1] if len(fam.metrics) > 1 else fam.metrics[0]
                np.testing.assert_allclose(t.y, fam.scale * np.asarray(res[metric]))


def test_summary_figure(tmp_path):
    """The study at a glance: each regime's diamond is the findings' regime interval of its runs against SFT on
    its suite, each dot a run's own change, the control row the findings' control, each bar a sweep's Shapley
    value; every row and axis says which."""
    from test_report import CONTROL, STUDY_ORDER, STUDY_RUNS, STUDY_SWEPT, write_study_run

    from graftkit import figures as F
    from graftkit.figures.report import load_run
    from graftkit.results.store import read_result
    from graftkit.stats import regime_interval

    run = write_study_run(tmp_path / "demo")
    fig = F.study_summary([x.path for x in load_run(run) if x.kind in ("eval", "findings", "graft-sweep")])
    assert heading(fig).startswith("The study at a glance")
    assert axis(fig, "x") == "change in success vs SFT (percentage points)"
    assert fig.layout.xaxis2.title.text == "parameter group"
    assert fig.layout.yaxis2.title.text == "contribution to success (percentage points)"
    outcomes = {n: np.asarray(read_result(run / "results" / f"eval-{n}-greedy.h5")["success"])
                for n in ("sft", *STUDY_RUNS)}
    from graftkit.study.design import SUITES

    order = ["click-tab", "click-button", "click-link"]  # the planted run's tasks
    suites = {k: [order.index(t) for t in SUITES[k]] for k in ("mastered", "headroom")}

    def flat(x, tasks):  # [task, seed, episode, sample] → one entry per episode, clustered by seed
        x = x[tasks]
        return x.ravel(), np.broadcast_to(np.arange(x.shape[1])[None, :, None, None], x.shape).ravel().astype(str)

    regimes = {"null": STUDY_ORDER[:2], "degrade": STUDY_ORDER[2:5], "collapse": STUDY_ORDER[5:7],
               "headroom": STUDY_ORDER[7:]}
    rows = list(fig.layout.yaxis.ticktext)
    assert rows == [f"{g} · {len(r)} run{'s' * (len(r) > 1)} · {'headroom' if g == 'headroom' else 'mastered'} suite"
                    for g, r in regimes.items()] + ["positive control"]
    for i, (regime, names) in enumerate(regimes.items()):
        tasks = suites["headroom" if regime == "headroom" else "mastered"]
        a, clusters = flat(outcomes["sft"], tasks)
        ri = regime_interval([(a, flat(outcomes[n], tasks)[0], clusters) for n in names])
        t = trace(fig, regime)
        assert list(t.y) == [i]
        np.testing.assert_allclose(t.x, [100 * ri.diff])
        np.testing.assert_allclose(t.error_x.array, [100 * (ri.high - ri.diff)])
        np.testing.assert_allclose(t.error_x.arrayminus, [100 * (ri.diff - ri.low)])
        dots = trace(fig, f"{regime} · runs")
        assert list(dots.text) == names and all(abs(y - i - 0.3) <= 0.12 + 1e-9 for y in dots.y)
        np.testing.assert_allclose(dots.x, [100 * (flat(outcomes[n], tasks)[0].mean() - a.mean()) for n in names])
    t = trace(fig, "positive control")
    assert list(t.y) == [len(regimes)]
    np.testing.assert_allclose(t.x, [100 * CONTROL[1]])
    np.testing.assert_allclose([t.error_x.arrayminus[0], t.error_x.array[0]],
                               [100 * (CONTROL[1] - CONTROL[2]), 100 * (CONTROL[3] - CONTROL[1])])
    for k, name in enumerate(STUDY_SWEPT):
        bar = trace(fig, name)
        sweep = read_result(run / "results" / f"graft-factorial-{name}.h5")
        assert bar.xaxis == "x2" and list(bar.x) == [str(g) for g in sweep.coords["group"]]
        np.testing.assert_allclose(bar.y, 100 * np.asarray(sweep["shapley"])[:, 0])


def test_report_tables(synthetic, tmp_path):
    """The report's two HTML tables: the findings, and the result files (provenance)."""
    from html.parser import HTMLParser

    from graftkit.figures import make_report
    from graftkit.results.store import list_results, read_result, write_result
    from graftkit.study.findings import FindingsResult

    res = synthetic["findings"]
    run = tmp_path / "run"
    write_result(run / "results" / "findings.h5", res)
    write_result(run / "results" / "sub" / "delta-rl.h5", synthetic["delta-rl"])
    page = make_report(run).html

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    def table(pattern: str) -> list[list[str]]:
        p = Cells()
        p.feed(re.search(pattern, page, re.S)[0])
        return p.rows

    headers, *rows = table(r"<table class='findings'>.*?</table>")
    assert headers == ["#", "claim", "this run found", "estimate [interval]", "verdict"]
    fields = {"#": "number", "claim": "claim", "this run found": "statement", "verdict": "verdict"}
    findings = FindingsResult.from_result(res).findings
    assert len(rows) == len(findings)
    for cells, f in zip(rows, findings):
        row = dict(zip(headers, cells))
        for header, name in fields.items():
            assert row[header] == str(getattr(f, name)), (header, row)
        got = numbers(row["estimate [interval]"])
        want = [v for v in (f.estimate, f.low, f.high) if math.isfinite(v)]
        if not math.isfinite(f.estimate):
            assert row["estimate [interval]"].startswith("undefined")
        assert len(got) == len(want) and all(close(t, v) for t, v in zip(got, want)), (row, f)

    headers, *rows = table(r"<section id='provenance'>.*?</section>")
    assert headers == ["file", "kind", "created", "graftkit", "dimensions"]
    listed = list_results(run)
    assert len(rows) == len(listed) == 2
    for cells in rows:
        row = dict(zip(headers, cells))
        (want,) = [x for x in listed if str(Path(x["path"]).relative_to(run)) == row["file"]]
        stored = read_result(want["path"])
        assert row["kind"] == want["kind"] == stored.kind and row["created"] == want["created"]
        assert row["graftkit"] == stored.attrs["graftkit_version"]
        assert row["dimensions"] == ", ".join(f"{d}={len(c)}" for d, c in stored.coords.items())
