"""docs/design.md's one-way data flow, enforced by parsing every module's imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"core", "_version"}  # foundations: importable from anywhere
ALLOWED = {
    "core": set(),
    "weights": set(),
    "webenv": set(),
    "verifiable": set(),
    "stats": set(),
    "results": set(),
    "agent": {"webenv", "weights", "verifiable"},
    # the trainers, and the training commands that write their results
    "train": {"agent", "webenv", "weights", "verifiable", "results", "stats"},
    # delta writes a trainer run's curves (train's writer) beside its movement; trajectory joins each step's KL
    "graft": {"weights", "agent", "stats", "results", "rank", "verifiable", "train", "evaluation"},
    "rank": {"weights", "agent", "stats", "results"},
    # the eval/headroom commands (they write results, which agent may not)
    "evaluation": {"agent", "webenv", "weights", "stats", "results", "verifiable"},
    # figures read results through the typed views defined beside their producers
    "figures": {"results", "stats", "graft", "rank", "evaluation", "train", "study.findings", "study.design"},
    # the study's design as data: regimes, suites, presets (a variant names the policy folder it starts from)
    "study.design": {"webenv", "verifiable", "results"},
    # the study's findings rules, read from typed result views
    "study.findings": {"results", "stats", "evaluation", "graft", "rank", "webenv", "study.design"},
    # the pipeline composes every command's run function, up to the findings
    "study": {"results", "stats", "evaluation", "graft", "rank", "webenv", "verifiable", "agent", "train", "weights",
              "study.findings", "study.design"},
    # graftkit demo: the study's stages, then its report
    "demo": {"study", "figures"},
}
EVERYTHING = {"cli", "api", "__init__", "__main__"}  # the edges that know about everything


#: Modules that are units of their own inside a package: the study's design and findings rules, which figures read
#: (the report shows the findings), while the pipeline composes the commands and never draws.
SUBUNITS = {("study", "findings"), ("study", "design")}


def _unit_of(parts: list[str] | tuple[str, ...]) -> str:
    """The unit of a module path inside graftkit (``["study", "findings", ...]`` → ``"study.findings"``)."""
    parts = [p.removesuffix(".py") for p in parts]
    if len(parts) > 1 and tuple(parts[:2]) in SUBUNITS:
        return ".".join(parts[:2])
    return parts[0]


def _unit(path: Path) -> str:
    return _unit_of(path.relative_to(ROOT).parts)


def _imports(path: Path, pkg: list[str] | None = None) -> set[str]:
    """Top-level graftkit units imported by ``path`` (relative imports resolved against ``pkg``)."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = list(path.relative_to(ROOT).parts[:-1]) if pkg is None else pkg
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "graftkit" and len(parts) > 1:
                    found.add(_unit_of(parts[1:]))
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != "graftkit":
                    continue
                target = parts[1:]
            else:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                if node.level - 1 > len(pkg):
                    raise AssertionError(f"{path}: relative import climbs above the package")
                target = base + (node.module.split(".") if node.module else [])
            if target:
                if node.module is None:  # `from .pkg import module`: the names are modules
                    found.update(_unit_of(target + [a.name]) for a in node.names)
                else:
                    found.add(_unit_of(target))
            else:  # `from . import x` at the root
                found.update(a.name for a in node.names)
    return found


def _modules() -> list[Path]:
    skip = {"tests", "benchmarks", "build", "runs"}
    out = []
    for top in ROOT.iterdir():
        if top.name in skip or top.name.startswith("."):
            continue
        if top.is_dir():
            out.extend(top.rglob("*.py"))
        elif top.suffix == ".py":
            out.append(top)
    return out


def test_import_rules_hold():
    violations = []
    for path in _modules():
        unit = _unit(path)
        if unit in EVERYTHING or unit in LEAVES:
            continue
        assert unit in ALLOWED, f"{path}: unit '{unit}' has no import rule; add it to ALLOWED and docs/design.md"
        for target in _imports(path) - LEAVES - {unit}:
            if target not in ALLOWED[unit]:
                violations.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not violations, "import rules broken:\n" + "\n".join(violations)


def test_checker_sees_violations(tmp_path):
    """The parser resolves absolute and relative imports (so the rule test above can fail)."""
    mod = ROOT / "weights" / "checkpoint.py"
    assert "core" in _imports(mod)
    fake = tmp_path / "probe.py"
    fake.write_text("from ..graft import plan\nimport graftkit.results.store\nfrom . import taxonomy\n")
    assert _imports(fake, ["weights"]) == {"graft", "results", "weights"}


def _design_table(text: str) -> dict[str, set[str]]:
    """docs/design.md's import table: unit → the units it may import, read from the markdown rows under its
    ``| unit | may import (besides `core`) |`` header (several units in a row's first cell share it; a backticked
    name in the second cell is a unit it may import, "nothing of graftkit" none, "everything above" every unit of
    the rows above)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| unit | may import"))
    table: dict[str, set[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        first, second = [c.strip() for c in line.strip("|").split("|")][:2]
        units = re.findall(r"`([\w.]+)`", first)
        may = set(re.findall(r"`([\w.]+)`", second))
        if "everything above" in second:
            may |= set(table)
        for unit in units:
            table[unit] = may
    return table


def test_design_md_import_table_is_the_rules():
    """The table docs/design.md shows is ``ALLOWED``, row for row (the leaves, ``core``, are said in its header)."""
    table = _design_table((ROOT / "docs" / "design.md").read_text())
    assert table == {unit: may for unit, may in ALLOWED.items() if unit not in LEAVES}


def test_the_table_reader_reads_what_it_is_given():
    text = ("| unit | may import (besides `core`) |\n|---|---|\n| `a`, `b` | nothing of graftkit |\n"
            "| `c` | `a` (why), `b` |\n| `d` | everything above, `e` included |\n\nafter\n| `x` | `y` |\n")
    assert _design_table(text) == {"a": set(), "b": set(), "c": {"a", "b"}, "d": {"a", "b", "c", "e"}}


def test_only_safetensors_io_in_weights():
    """STYLE rule 4: nothing outside weights/ opens a safetensors file."""
    offenders = []
    for path in _modules():
        if _unit(path) == "weights":
            continue
        text = path.read_text()
        if "safe_open" in text or "safetensors.torch" in text or "import safetensors" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"safetensors used outside weights/: {offenders}"


def test_import_graftkit_loads_neither_torch_nor_plotly():
    """``import graftkit`` stays light (its docstring says so): torch loads when a model runs, plotly when a figure
    is drawn. A fresh interpreter, since this one has imported both already."""
    probe = ("import sys, graftkit; graftkit.figures; graftkit.eval; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'plotly', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    drawn = "import sys, graftkit; graftkit.figures.success_rates; print('plotly' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", drawn], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
