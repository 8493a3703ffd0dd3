"""DESIGN.md's one-way data flow, enforced by parsing every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"errors", "_version", "config", "devices", "executor", "progress", "files"}  # importable from anywhere
ALLOWED = {
    "weights": set(),
    "webenv": set(),
    "verifiable": set(),
    "stats": set(),
    "store": set(),
    "agent": {"webenv", "weights", "verifiable"},
    "train": {"agent", "webenv", "weights", "verifiable"},
    "graft": {"weights", "agent", "stats", "store", "rank"},
    "rank": {"weights", "agent", "stats", "store"},
    # figures read results through the typed views defined beside their producers
    "figures": {"store", "stats", "graft", "rank", "evaluation", "training", "findings"},
    # the run functions of eval/headroom and of training (they write results, which agent/train may not)
    "evaluation": {"agent", "webenv", "weights", "stats", "store", "verifiable"},
    "training": {"train", "agent", "webenv", "weights", "store", "verifiable"},
    # the study's findings rules, read from typed result views
    "findings": {"stats", "store", "evaluation", "graft", "rank", "webenv"},
}
EVERYTHING = {"cli", "study", "api", "__init__", "__main__"}  # the edges that know about everything


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0].removesuffix(".py")


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
                    found.add(parts[1])
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
                found.add(target[0])
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
        assert unit in ALLOWED, f"{path}: unit '{unit}' has no import rule; add it to ALLOWED and DESIGN.md"
        for target in _imports(path) - LEAVES - {unit}:
            if target not in ALLOWED[unit]:
                violations.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not violations, "import rules broken:\n" + "\n".join(violations)


def test_checker_sees_violations(tmp_path):
    """The parser resolves absolute and relative imports (so the rule test above can fail)."""
    mod = ROOT / "weights" / "checkpoint.py"
    assert "errors" in _imports(mod)
    fake = tmp_path / "probe.py"
    fake.write_text("from ..graft import plan\nimport graftkit.store\nfrom . import taxonomy\n")
    assert _imports(fake, ["weights"]) == {"graft", "store", "weights"}


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
