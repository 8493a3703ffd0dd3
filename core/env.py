"""The episode interface every task environment implements: a web page (:class:`graftkit.webenv.WebEnv`, on either
backend) or a verifiable problem played as a one-turn episode (:class:`graftkit.verifiable.ProblemEnv`), so that
rollouts, evaluation and training play both alike.

    obs = env.reset(seed=3)                  # the seeded episode's first observation
    obs, reward, done = env.step(text)       # one turn: a web action, or a problem's completion
    env.success                              # the episode ended with reward 1

``reward`` is the task's raw reward, 0 until the episode ends (MiniWoB++'s, not time-discounted; a verifier's score
in [0, 1]), and an episode is a success exactly when it ends with reward 1. A finished episode's observation is
empty (``obs.empty``). ``env.spec`` holds the task's episode rules (:class:`EpisodeSpec`), and with them the
task kind's two conversions the policy needs: the turn's :class:`Prompt` (``spec.prompt(obs, history)``), which a
policy renders into tokens, and how its output is read (``spec.reads``). Code above the environments asks the spec;
it never tests which kind of task it holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol


class Step(NamedTuple):
    """What one turn returns; a tuple, so ``obs, reward, done = env.step(text)``."""

    observation: Any
    """The next observation (empty once the episode has ended): a web page's or a problem's."""
    reward: float
    """The raw reward: 0 until the episode ends."""
    done: bool
    """Whether the episode has ended."""


class Prompt(NamedTuple):
    """One turn's prompt as its task writes it; a policy renders it into token ids (``Policy.turn_ids``)."""

    messages: tuple[Mapping[str, str], ...]
    """The conversation a chat template renders: a system message (where the task has one), then the turn."""
    plain: str
    """The same prompt in the plain format, for a tokenizer without a chat template."""
    template: str = "auto"
    """How it is written (:data:`graftkit.verifiable.format.TEMPLATES`): auto (the chat template where the tokenizer
    has one, else ``plain``), chat, plain, or raw (the messages' contents joined by newlines, no BOS token)."""


#: How a policy reads its output (``EpisodeSpec.reads``): ``action`` — the first line, one web action in canonical
#: spacing; ``completion`` — the whole output, every line.
READS = ("action", "completion")


class EpisodeSpec(Protocol):
    """A task's episode rules: a web task's class, or a verifiable task's one-turn rules."""

    kind: str
    """The family of tasks, as messages name it: ``web`` or ``verifiable``."""
    max_steps: int
    """Turns before an unfinished episode ends as a failure."""
    reads: str
    """How the policy's output is read: one of :data:`READS`."""
    screenshots: bool
    """Whether an observation can be shown as a screenshot (``--obs som``)."""
    demo_pool: int
    """Demonstration items SFT draws from by default (``train sft --budget``): a web task's pool, or a generated
    problem's fresh items."""
    items: int | None
    """How many distinct items a task with a fixed set holds (a user's ``FILE.jsonl``: an evaluation plays it whole
    and counts what it covered); None for a task that generates its items from the seed."""

    def prompt(self, obs: Any, history: tuple[str, ...] | list[str]) -> Prompt:
        """The prompt of the turn at ``obs``, after the episode's earlier actions ``history``."""
        ...

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


class EnvBase:
    """What every environment does alike: the demonstrator follows the spec's oracle unless a kind says otherwise,
    success is an episode that ended with reward 1, and ``with env:`` closes it (a no-op unless it holds a browser)."""

    spec: EpisodeSpec
    done: bool
    raw_reward: float

    def demonstration(self, obs: Any) -> list[str]:
        """The demonstrator's plan from ``obs``: the oracle's."""
        return self.spec.oracle(obs)

    @property
    def success(self) -> bool:
        return self.done and self.raw_reward == 1.0

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def demonstrate(env: Env, obs: Any, *, oracle: bool = False) -> Iterator[tuple[Any, str, Step]]:
    """Play the demonstrator's episode from ``obs`` (the env's current observation), turn by turn:
    (observation, action, step). Its plan is played, then made again from the next observation while
    the episode runs (a task that hides its answer plans a step at a time), for at most the task's
    ``max_steps`` turns. ``oracle``: the oracle, reading only observations, instead of the demonstrator
    (which on the web mirror may read the page: ``Task.demonstrate``)."""
    turns = 0
    while turns < env.spec.max_steps and not env.done:
        plan = env.spec.oracle(obs) if oracle else env.demonstration(obs)
        for action in plan[: env.spec.max_steps - turns]:
            step = env.step(action)
            yield obs, action, step
            turns += 1
            obs = step.observation
            if step.done:
                return
