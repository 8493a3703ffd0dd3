"""Named task suites: the names every ``--tasks`` accepts for a list of tasks (``mastered``, ``headroom``).

Which tasks a suite holds is the study's design (:data:`graftkit.study.design.SUITES`). The packages that resolve
task names (agent, train, evaluation) sit below the study and may not import it, so they read the suites here,
and the study's design registers its table here when ``graftkit/__init__.py`` — which runs before any graftkit
module does — imports it first.
"""

from __future__ import annotations

from typing import Mapping

_suites: Mapping[str, tuple[str, ...]] = {}


def register_suites(suites: Mapping[str, tuple[str, ...]]) -> None:
    """Make ``suites`` (name → task names) the named suites. The mapping itself is kept, not a copy, so that
    the study's table stays the one place a suite's tasks are written."""
    global _suites
    _suites = suites


def suites() -> Mapping[str, tuple[str, ...]]:
    """The named suites (name → task names)."""
    return _suites
