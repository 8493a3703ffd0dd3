"""Progress on stderr: rich bars on an interactive terminal, occasional plain lines in a log (core/progress.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.core import progress
from planted import planted_pair


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def log(monkeypatch):
    """stderr as a log file (no terminal), the clock under the test's control; yields (clock, lines written)."""
    clock, written = Clock(), []
    monkeypatch.setattr(progress, "monotonic", clock)
    monkeypatch.setattr(progress, "err", Console(stderr=True, force_terminal=False, force_interactive=False))
    monkeypatch.setattr(progress.err, "print", lambda text, **_: written.append(str(text)))
    return clock, written


def test_a_log_gets_a_line_per_bar_at_most_every_interval_and_its_last(log):
    clock, written = log
    bars = progress.Bars()
    assert bars.lines is not None
    bars("rank rl", 1, 10, "matrices")
    clock.now += progress.EVERY_S - 1
    bars("rank rl", 1, 10, "matrices")
    assert written == []  # nothing before the interval
    clock.now += 1
    bars("rank rl", 2, 10, "matrices")
    assert written == ["rank rl: 4/10 matrices (40%), 30 s elapsed, about 45 s left"]
    bars("rank rl", 1, 10, "matrices")
    clock.now += 5
    bars("copy", 2 << 20, 4 << 20, "bytes")  # another bar: its own clock, from the last report before it (30 s)
    bars("rank rl", 5, 10, "matrices")  # the end: written because the bar wrote before
    assert written[1:] == ["rank rl: 10/10 matrices (100%), 35 s elapsed, done"]
    clock.now += 100
    bars("rank rl", 0, 10, "matrices")  # a closed bar writes no more
    bars("copy", 2 << 20, 4 << 20, "bytes")
    assert written[2:] == ["copy: 4.0 MiB/4.0 MiB (100%), 1 min 45 s elapsed, done"]


def test_work_that_ends_within_the_interval_writes_nothing_to_a_log(log):
    clock, written = log
    bars = progress.Bars()
    for _ in range(10):
        clock.now += 2
        bars("eval", 1, 10, "episodes")
    assert written == []


def test_training_steps_in_a_log_name_their_metrics(log):
    clock, written = log
    p, on_step = progress.step_printer(100, "sft", ("loss", "lr"))
    with p:
        clock.now += 31
        on_step({"step": 25, "loss": 0.5, "lr": 1e-5})
        clock.now += 1
        on_step({"step": 30, "loss": 0.4, "lr": 1e-5})
    assert written == ["sft: 25/100 steps (25%), loss 0.5 lr 1e-05, 31 s elapsed, about 1 min 33 s left"]


@pytest.fixture()
def planted_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    planted_pair(tmp_path / "runs")
    return tmp_path / "runs"


def test_rank_draws_a_bar_on_an_interactive_terminal(planted_run, monkeypatch):
    monkeypatch.setattr(progress, "err", Console(stderr=True, force_terminal=True, force_interactive=True, width=120))
    res = CliRunner().invoke(app, ["rank", "--what", "delta", "--layers", "late"])
    assert res.exit_code == 0, res.output
    assert "rank rl" in res.stderr and "14/14 matrices" in res.stderr and "━" in res.stderr
    assert "rank rl" not in res.stdout  # the tables go to stdout, the bar to stderr


def test_rank_writes_plain_lines_to_a_log(planted_run, monkeypatch):
    monkeypatch.setattr(progress, "err", Console(stderr=True, force_terminal=False, force_interactive=False))
    res = CliRunner().invoke(app, ["rank", "--what", "delta", "--layers", "late"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""  # a quick command: its output alone
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # every call is due
    res = CliRunner().invoke(app, ["rank", "--what", "delta", "--layers", "late"])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 14 and all(line.startswith("rank rl: ") for line in lines)
    assert lines[-1].startswith("rank rl: 14/14 matrices (100%)") and lines[-1].endswith("done")
    assert "\x1b" not in res.stderr and "\r" not in res.stderr


def test_report_reports_a_step_for_the_results_each_section_and_the_page(tmp_path):
    from graftkit.figures.commands import ReportConfig, run_report
    from graftkit.figures.report import SECTIONS

    (tmp_path / "run" / "results").mkdir(parents=True)
    calls = []
    info = run_report(ReportConfig(run=tmp_path / "run"), lambda *a: calls.append(a))
    assert Path(info["path"]).is_file()
    assert {c[0] for c in calls} == {"report"} and {c[2] for c in calls} == {len(SECTIONS) + 2}
    assert sum(c[1] for c in calls) == len(SECTIONS) + 2
