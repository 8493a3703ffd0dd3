"""The findings result's typed view gives back the findings that were written."""

from __future__ import annotations

from graftkit.findings import Finding, FindingsResult, findings_result
from graftkit.store import read_result, write_result
from graftkit.study import StudyConfig


def test_findings_view_round_trips(tmp_path):
    found = [Finding(2, "claim two", "stated <b>", 0.1, 0.05, 0.15, "reproduced"),
             Finding(1, "claim one", "stated", -0.2, -0.3, -0.1, "not reproduced")]
    path = write_result(tmp_path / "findings.h5", findings_result(found, StudyConfig()))
    view = FindingsResult.from_result(read_result(path))
    assert view.has_claim and view.findings == tuple(sorted(found, key=lambda f: f.number))
    assert "paired bootstrap" in view.notes
