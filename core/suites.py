"""Named task suites: the names every ``--tasks`` accepts for a list of tasks (``mastered``, ``headroom``, ``control``).

Which tasks a suite holds is the study's design (:mod:`graftkit.study.design` names this table :data:`SUITES`);
the table sits here, below every package that resolves task names (agent, train, evaluation), so each reads it
without importing the study. A suite changed here is the suite every command and the study play.
"""

from __future__ import annotations

from typing import Mapping

#: The three named suites of web tasks, set by measurement on held-out items of the study's SFT policy
#: (:data:`graftkit.study.design.STUDY_SFT`; ``graftkit headroom --seeds 25 --episodes 4 --k 8``, 100 held-out items
#: per task).
#: ``mastered``: a task the SFT policy solves greedily below the ceiling — click-tab 92% (sampled 75%); the SFT
#: trains until its greedy success on training items reaches 93%, so the held-out baseline sits in 90–97% and an
#: improvement could show (the full study plays 100 items per task, where +8 points is detectable). ``headroom``: a
#: task it has learnt in part, whose reward sampling reaches and whose sampled policy beats its greedy one
#: (click-button: greedy 27%, sampled 36.5%, pass@8 91%: credible headroom); click-link (greedy 28%, sampled 29%,
#: pass@8 81%) has none, so it is in no suite. Whether the sampled policy beats the greedy one is measured again by
#: every study, not assumed. ``control``: the positive control's task (:data:`graftkit.study.design.CONTROL`): the
#: mastered task under a planted position bias, where greedy fails and sampling succeeds, so a GRPO recipe that
#: learns must raise it.
#: Tasks with one or a few distinct items (focus-text, focus-text-2) cannot be held out and are in no suite.
SUITES: dict[str, tuple[str, ...]] = {
    "mastered": ("click-tab",),
    "headroom": ("click-button",),
    "control": ("click-tab",),
}


def suites() -> Mapping[str, tuple[str, ...]]:
    """The named suites (name → task names)."""
    return SUITES
