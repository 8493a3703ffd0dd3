"""A verifiable problem played as a one-turn episode, with the web environments' interface
(:class:`graftkit.core.env.Env`).

    env = ProblemEnv("arithmetic")
    obs = env.reset(seed=3)                        # ProblemObservation: the problem's prompt
    obs, reward, done = env.step("<answer>912</answer>")   # done after the one turn; reward from the verifier

The finished observation keeps the completion's process score (``ProblemObservation.process``), which
``spec.progress`` reports as the turn's progress: VeriGate's fallback reads it as it reads a web task's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.env import EnvBase, Prompt, Step
from ..core.errors import GraftkitError
from .base import Problem, VerifiableTask


@dataclass(frozen=True)
class ProblemObservation:
    """What the policy sees of a problem: its prompt (empty once the turn is played)."""

    task: str
    problem: Problem | None
    process: float = 0.0

    @property
    def empty(self) -> bool:
        return self.problem is None

    @property
    def utterance(self) -> str:
        return self.problem.prompt if self.problem is not None else ""

    def item_text(self) -> str:
        """The text an item id digests: the prompt the policy reads (a conversation's every message)."""
        if self.problem is not None and self.problem.messages:
            return "\n".join(f"{m['role']}: {m['content']}" for m in self.problem.messages)
        return self.utterance


class ProblemSpec:
    """A task's episode rules in the shape rollouts read from a web task: one turn, the solution as the
    oracle's plan, the completion's process score as progress."""

    max_steps = 1
    kind = "verifiable"
    reads = "completion"
    screenshots = False
    demo_pool = 1_000_000  # a generated problem's items are fresh; a file's repeat

    def __init__(self, task: VerifiableTask):
        self.task, self.name = task, task.name

    @property
    def items(self) -> int | None:
        """The number of items of a user's file (``FILE.jsonl``); None for a task that generates its problems."""
        from .user import JsonlTask

        return len(self.task) if isinstance(self.task, JsonlTask) else None

    def prompt(self, obs: ProblemObservation, history=()) -> Prompt:
        """The problem's prompt in its task's format as registered now (a command's ``--system``/``--template``
        re-registers the task: :func:`graftkit.verifiable.resolve_source`)."""
        from .format import problem_prompt
        from .registry import lookup

        task = lookup(obs.task)
        return problem_prompt(task.conversation(obs.problem), template=task.template)

    def oracle(self, obs: ProblemObservation) -> list[str]:
        return [self.task.solution(obs.problem)]

    def ambiguous(self, obs: ProblemObservation) -> bool:
        return False

    @staticmethod
    def progress(first, obs: ProblemObservation, reward: float, done: bool) -> float:
        if not done:
            return 0.0
        return 1.0 if reward == 1.0 else min(max(obs.process, 0.0), 0.99)


class ProblemEnv(EnvBase):
    """One verifiable task: ``reset(seed)`` shows problem ``seed``, ``step(completion)`` scores it and ends
    (the episode interface :class:`graftkit.core.env.Env`)."""

    backend = "py"

    def __init__(self, task: VerifiableTask):
        self.task, self.spec = task.name, ProblemSpec(task)
        self._task = task
        self.done, self.raw_reward = True, 0.0
        self._problem: Problem | None = None

    def reset(self, seed: int) -> ProblemObservation:
        self._problem = self._task.problem(int(seed))
        self.done, self.raw_reward = False, 0.0
        return ProblemObservation(self.task, self._problem)

    def step(self, completion: str) -> Step:
        if self.done or self._problem is None:
            raise GraftkitError(f"{self.task}: step() after the episode ended", "call reset(seed) first")
        reward = float(self._task.reward(self._problem, completion))
        if not 0.0 <= reward <= 1.0:
            raise GraftkitError(f"task {self.task} ({self._task.source}): its verifier returned {reward}, not a "
                                "score in [0, 1]", "make the verifier return a float between 0 and 1")
        process = float(self._task.process(self._problem, completion)) if reward < 1.0 else 1.0
        self.done, self.raw_reward = True, reward
        return Step(ProblemObservation(self.task, None, process), reward, True)

    def parseable(self, completion: str) -> bool:
        """Whether ``completion`` states an answer in the current problem's answer format."""
        return self._task.parseable(completion, self._problem)

