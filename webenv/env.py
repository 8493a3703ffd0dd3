"""The web environment both backends implement (the episode interface :class:`graftkit.core.env.Env`), and the
pure-Python mirror backend (:func:`.backends.make_env` picks a backend).

    env = make_env("click-button")            # backend="py" (the mirror) or "miniwob" (real browser)
    obs = env.reset(seed=3)                   # Observation: utterance + element list
    obs, reward, done = env.step("click(5)")  # reward: MiniWoB's raw reward, 0 until the episode ends

``reward`` is the raw (not time-discounted) reward MiniWoB++ gives when the episode ends — 1 for a
solved episode, −1 for a wrong button, link or tab, ``r / n`` for checkboxes — and an episode counts as
a success exactly when it ends with reward 1. A finished episode's observation is empty, as in
``miniwob``. Strings are parsed with ``parse_action`` (``ParseError`` on anything outside the grammar).

Between episodes the mirror keeps one page per env, like the browser tab the real backend keeps: the
same DOM nodes persist and ``genProblem`` rewrites them. Before every reset both backends take focus
off the focused element, so an episode never inherits focus (or an open autocomplete menu) from the
previous one, and empty jQuery UI's screen-reader live region (its last message would stay visible and
take a ref). What the page still carries over, the mirror carries too: the "tampered" flag of the
button whose click ended the last episode and jQuery UI's id counter (``ui-id-N`` of autocomplete
items). Neither reaches ``render_text`` nor moves a ref, so an episode renders the same whether its
env is fresh or has played others.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..core.env import EnvBase, Step, demonstrate  # noqa: F401  (re-exported: the web package's name for it)
from ..core.errors import GraftkitError
from .actions import Action, ParseError, parse_action
from .observation import Observation, empty_observation
from .seedrandom import SeedRandom
from .tasks import TASKS, Task


class WebEnv(EnvBase, ABC):
    """One task, one page; ``reset(seed)`` starts the seeded episode, ``step(action)`` plays one action
    (the episode interface :class:`graftkit.core.env.Env`)."""

    backend: str

    def __init__(self, task: str):
        if task not in TASKS:
            raise GraftkitError(f"unknown web task {task!r}", f"choose one of: {', '.join(sorted(TASKS))}")
        self.task = task
        self.spec: type[Task] = TASKS[task]
        self.done = True
        self.raw_reward = 0.0

    @abstractmethod
    def reset(self, seed: int) -> Observation: ...

    @abstractmethod
    def _act(self, action: Action) -> Step: ...

    def step(self, action: str | Action) -> Step:
        if isinstance(action, str):
            action = parse_action(action)
        if self.done:
            raise GraftkitError(f"{self.task}: step() after the episode ended", "call reset(seed) first")
        result = self._act(action)
        self.done, self.raw_reward = result.done, result.reward
        return result

    def parseable(self, action: str) -> bool:
        """Whether ``action`` is in the action grammar (``step`` raises :class:`ParseError` on one that is not)."""
        try:
            parse_action(action)
        except ParseError:
            return False
        return True


class MirrorEnv(WebEnv):
    """The pure-Python mirror: MiniWoB++'s generators and event semantics on the ``dom.py`` page."""

    backend = "py"

    def __init__(self, task: str, screenshots: bool = False):
        """``screenshots`` is accepted for parity with the browser and ignored: the mirror has no
        pixels, and ``render_som`` draws its layout (``draw_layout``) instead."""
        super().__init__(task)
        self._task = self.spec()
        self.page = self._task.page

    def reset(self, seed: int) -> Observation:
        page = self.page
        if page.active is not None:
            page.blur(page.active)
        self._task.before_episode()
        page.start_episode()
        self._task.gen_problem(SeedRandom(seed))
        self.done, self.raw_reward = False, 0.0
        return page.observe(self.task)

    def demonstration(self, obs: Observation) -> list[str]:
        return self._task.demonstrate(obs)

    def _act(self, action: Action) -> Step:
        page = self.page

        def run() -> None:
            page.element_click(action.ref)
            for ch in action.text:
                page.key(ch)

        page.run(run)
        if page.done:
            return Step(empty_observation(self.task), page.raw_reward, True)
        return Step(page.observe(self.task), 0.0, False)
