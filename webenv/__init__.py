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
on either (``tests/test_webenv_browser.py`` checks it). ``progress`` gives partial credit after each step
(a process reward).
"""

from .actions import MAX_TEXT, Action, ParseError, parse_action
from .backends import BACKENDS, check_backend, make_env
from .env import MirrorEnv, WebEnv, demonstrate
from .observation import Element, Observation
from .render import Mark, draw_layout, render_som, render_text, som_marks
from .tasks import TASKS, Task


def oracle(obs: Observation) -> list[str]:
    """The oracle's plan from ``obs``: action strings that solve the episode, or — where the page hides
    the answer (click-tab-2) — its next step; :func:`demonstrate` plays a whole episode."""
    return TASKS[obs.task].oracle(obs)


def progress(first: Observation, obs: Observation, reward: float, done: bool) -> float:
    """Partial credit in [0, 1] after a step: 1 on success, 0 on a failed end, else the task's
    measure of how far the page is toward the goal (``first`` is the episode's first observation)."""
    return TASKS[first.task].progress(first, obs, reward, done)


__all__ = [
    "MAX_TEXT", "Action", "ParseError", "parse_action", "MirrorEnv", "WebEnv", "demonstrate", "make_env", "BACKENDS",
    "check_backend", "Element",
    "Observation", "Mark", "draw_layout", "render_som", "render_text", "som_marks", "TASKS", "Task",
    "oracle", "progress",
]
