"""Web tasks for the agent: a pure-Python MiniWoB++ mirror (default) and the real MiniWoB++ backend.

    from graftkit import webenv
    env = webenv.make_env("click-checkboxes")          # or backend="miniwob" for Chromium
    obs = env.reset(seed=0)
    print(webenv.render_text(obs))                     # the text observation
    for obs, action, step in webenv.demonstrate(env, obs):   # a demonstration, turn by turn
        print(action, step.reward, step.done)

Both backends reproduce the same seeded episodes: the mirror ports ``Math.seedrandom`` and each task's
``genProblem()``, lays the page out with Chromium's font metrics and numbers elements as
``core.getDOMInfo`` does, so an episode's instruction, element list and rendered text are identical
on either (``tests/test_webenv_browser.py`` checks it). ``SUITES`` names the ``mastered`` and
``headroom`` task lists; ``progress`` gives partial credit after each step (a process reward).
"""

from .actions import MAX_TEXT, Action, ParseError, parse_action
from .env import MirrorEnv, Step, WebEnv, demonstrate, make_env
from .observation import Element, Observation
from .render import Mark, draw_layout, render_som, render_text, som_marks
from .tasks import SUITES, TASKS, Task


def oracle(obs: Observation) -> list[str]:
    """The oracle's plan from ``obs``: action strings that solve the episode, or — where the page hides
    the answer (click-tab-2) — its next step; :func:`demonstrate` plays a whole episode."""
    return TASKS[obs.task].oracle(obs)


def progress(first: Observation, obs: Observation, reward: float, done: bool) -> float:
    """Partial credit in [0, 1] after a step: 1 on success, 0 on a failed end, else the task's
    measure of how far the page is toward the goal (``first`` is the episode's first observation)."""
    return TASKS[first.task].progress(first, obs, reward, done)


def suite(name: str) -> tuple[str, ...]:
    """The task names of a suite (``mastered``, ``headroom``), or of a comma-separated list of tasks."""
    from ..core.errors import GraftkitError

    if name in SUITES:
        return SUITES[name]
    names = tuple(n.strip() for n in name.split(",") if n.strip())
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise GraftkitError(f"unknown web task or suite {', '.join(unknown) or name!r}",
                            f"choose a suite ({', '.join(SUITES)}) or tasks from: {', '.join(TASKS)}")
    return names


__all__ = [
    "MAX_TEXT", "Action", "ParseError", "parse_action", "MirrorEnv", "Step", "WebEnv", "demonstrate", "make_env", "Element",
    "Observation", "Mark", "draw_layout", "render_som", "render_text", "som_marks", "SUITES", "TASKS", "Task",
    "oracle", "progress", "suite",
]
