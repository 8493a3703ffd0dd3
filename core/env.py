"""The episode interface every task environment implements: a web page (:class:`graftkit.webenv.WebEnv`, on either
backend) or a verifiable problem played as a one-turn episode (:class:`graftkit.verifiable.ProblemEnv`), so that
rollouts, evaluation and training play both alike.

    obs = env.reset(seed=3)                  # the seeded episode's first observation
    obs, reward, done = env.step(text)       # one turn: a web action, or a problem's completion
    env.success                              # the episode ended with reward 1

``reward`` is the task's raw reward, 0 until the episode ends (MiniWoB++'s, not time-discounted; a verifier's score
in [0, 1]), and an episode is a success exactly when it ends with reward 1. A finished episode's observation is
empty (``obs.empty``). ``env.spec`` holds the task's episode rules (:class:`EpisodeSpec`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol


class Step(NamedTuple):
    """What one turn returns; a tuple, so ``obs, reward, done = env.step(text)``."""

    observation: Any
    """The next observation (empty once the episode has ended): a web page's or a problem's."""
    reward: float
    """The raw reward: 0 until the episode ends."""
    done: bool
    """Whether the episode has ended."""


class EpisodeSpec(Protocol):
    """A task's episode rules: a web task's class, or a verifiable task's one-turn rules."""

    max_steps: int
    """Turns before an unfinished episode ends as a failure."""

    def oracle(self, obs: Any) -> list[str]:
        """The actions that solve the episode from ``obs`` (a task that hides its answer: its next step)."""
        ...

    def progress(self, first: Any, obs: Any, reward: float, done: bool) -> float:
        """Progress in [0, 1] after a turn (``first``: the episode's first observation): 1 on success, else partial
        credit (a web page's, a completion's process score)."""
        ...

    def ambiguous(self, first: Any) -> bool:
        """True when the observation does not determine the answer (no oracle can be sure to solve the episode)."""
        ...


class Env(Protocol):
    """One task's environment: ``reset(seed)`` starts the seeded episode, ``step(text)`` plays one turn."""

    task: str
    """The task's name."""
    backend: str
    """Where episodes run: ``py`` (in this process) or ``miniwob`` (Chromium)."""
    spec: EpisodeSpec
    done: bool
    """Whether the current episode has ended (True before the first reset)."""
    raw_reward: float
    """The reward of the current episode's last turn."""

    def reset(self, seed: int) -> Any: ...

    def step(self, text: str) -> Step: ...

    def parseable(self, text: str) -> bool:
        """Whether a turn's text is in the task's answer format (a web action's grammar, a problem's answer tags)."""
        ...

    def demonstration(self, obs: Any) -> list[str]:
        """The demonstrator's plan from ``obs``."""
        ...

    @property
    def success(self) -> bool: ...

    def close(self) -> None: ...

    def __enter__(self) -> Env: ...

    def __exit__(self, *exc) -> None: ...
