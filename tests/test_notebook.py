"""docs/tour.ipynb: stored without outputs, and executed headless end to end (nbclient, the venv's kernel).

The tour trains two tiny GRPO runs from the embedded SFT policy, then runs delta, an in-place graft scored
by a function the notebook defines, rank, eval, couple and the report, writing only into a temporary
folder (here: the test's, through TMPDIR).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[1] / "docs" / "tour.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"


def _read():
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(TOUR, as_version=4)


def _by_tag(nb) -> dict:
    return {tag: c for c in nb.cells if c.cell_type == "code" for tag in c.metadata.get("tags", [])}


def test_tour_is_stored_without_outputs():
    nb = _read()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"
    assert set(_by_tag(nb)) >= {"setup", "train", "delta", "graft", "rank", "eval", "couple", "report"}


@pytest.mark.slow
def test_tour_runs_headless(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    import nbformat

    nb = _read()
    # Everything the kernel writes stays under tmp_path: the tour's temporary folder, IPython's profile,
    # the kernel's connection file.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    monkeypatch.chdir(tmp_path)
    probe = nbformat.v4.new_code_cell("import sys; print(sys.prefix)")
    nb.cells.append(probe)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # The kernel is this venv's python (the venv's ipykernel provides the python3 kernelspec).
    assert probe.outputs[0].text.strip() == sys.prefix

    def text(cell) -> str:
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")

    def figures(cell) -> int:
        return sum(PLOTLY in o.get("data", {}) for o in cell.outputs)

    cells = _by_tag(nb)
    for tag, n in (("train", 1), ("delta", 1), ("rank", 1), ("eval", 2), ("couple", 1)):
        assert figures(cells[tag]) == n, tag
    assert "grpo-lr1e-2 {" in text(cells["delta"])
    lines = (line.split(maxsplit=1) for line in text(cells["graft"]).splitlines())
    scores = {name: float(score) for score, name in lines}
    assert scores["SFT after the block"] == scores["SFT"]
    assert scores["SFT with the high-lr run's attn + mlp"] != scores["SFT"]  # the graft changed the policy
    assert text(cells["couple"]).count("success") == 3
    run = Path(text(cells["setup"]).split("run folder:")[1].strip())
    assert run.is_relative_to(tmp_path)
    assert (run / "report.html").is_file()
    results = {p.name.split("-")[0] for p in (run / "results").glob("*.h5")}
    assert results >= {"train", "delta", "rank", "eval", "coupling"}
