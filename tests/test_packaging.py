"""The repository root installs as the package `graftkit`, and only as that."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_holds_only_the_graftkit_package(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", str(ROOT), "-w", str(tmp_path)],
        check=True, capture_output=True, text=True,
    )
    # setuptools' warnings (a deprecated field, a data folder missing from the package list) are for us to fix
    warned = [line for line in (built.stdout + built.stderr).splitlines() if "BuildBackendWarning" in line]
    assert not warned, warned
    (wheel,) = tmp_path.glob("graftkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"graftkit"}, tops
    for must in ("graftkit/cli.py", "graftkit/weights/taxonomy.py", "graftkit/graft/export.py",
                 "graftkit/weights/architectures/llama.json", "graftkit/assets/sft/model.safetensors",
                 "graftkit/assets/study-sft/model.safetensors", "graftkit/grids/paper18.yaml",
                 "graftkit/configs/accelerate/zero3.yaml"):
        assert must in names
    assert not any(n.startswith("graftkit/tests/") or n.startswith("graftkit/benchmarks/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "graftkit = graftkit.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_every_subpackage_is_listed_in_pyproject():
    """A new subpackage folder must be added to pyproject's explicit package list."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"graftkit." + p.parent.relative_to(ROOT).as_posix().replace("/", ".")
             for p in ROOT.glob("*/**/__init__.py")
             if not p.relative_to(ROOT).parts[0].startswith((".", "tests", "benchmarks", "build"))}
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
