"""The single-turn verifiable task: a seeded problem, a completion, a reward in [0, 1].

A :class:`VerifiableTask` generates :class:`Problem` ``problem(seed)`` as a pure function of the seed,
scores a completion with ``reward(problem, completion)`` (a pure verifier: 1 is a solved problem) and,
optionally, ``process(problem, completion)``: partial credit in [0, 1] from the completion's intermediate
results (VeriGate's fallback signal when a group's rewards are all equal). ``solution(problem)`` is a
completion that scores 1 (the demonstration SFT trains on).

Answers are read in the task's answer format (:mod:`.format`): by default the last ``<answer>…</answer>``
of the completion (:func:`extract_answer`; spaces a word-level tokenizer puts inside the tags are allowed), or
the format a command or an item sets (``last-number``, ``boxed``, a regex, a function). A completion that
states no answer in it is *unparseable*: it scores 0 and is counted as an invalid output, like a web action
that does not parse. How the prompt is written (system message, template) is the task's too
(:meth:`VerifiableTask.conversation`, :attr:`VerifiableTask.template`); :meth:`VerifiableTask.with_format`
gives the task in a command's format.
"""

from __future__ import annotations

import re
import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from .format import TAGS, AnswerFormat, PromptFormat, answer_format

#: The system message of the built-in tasks (and the default of a user's).
SYSTEM = "Solve the problem. Write the final answer as <answer>ANSWER</answer>."

_ANSWER = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.S | re.I)


def extract_answer(completion: str) -> str | None:
    """The text of the completion's last ``<answer>…</answer>``, stripped, or None when it has none."""
    found = _ANSWER.findall(completion)
    return found[-1].strip() if found else None


def answer_text(answer: str) -> str:
    """A completion that states ``answer`` in the answer format."""
    return f"<answer>{answer}</answer>"


def parse_number(text: str | None) -> float | None:
    """A number written as digits (spaces, a thousands comma, a leading + allowed), or None."""
    if text is None:
        return None
    t = re.sub(r"[\s,]", "", text).lstrip("+")
    try:
        value = float(t)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


@dataclass(frozen=True)
class Problem:
    """One problem: its task, the prompt the policy reads, the reference answer and the verifier's data."""

    task: str
    prompt: str
    answer: str
    data: Mapping[str, Any] = field(default_factory=dict, compare=False)
    #: The conversation, where the prompt was given as messages (``prompt`` is then its last user message).
    messages: tuple[Mapping[str, str], ...] | None = field(default=None, compare=False)


class VerifiableTask(ABC):
    """A family of seeded single-turn problems with a pure verifier (see the module docstring)."""

    #: The task's name, as ``--tasks`` names it.
    name: str = ""
    #: The system message (a chat-template policy) or first line (a plain prompt) the problem follows.
    system: ClassVar[str] = SYSTEM
    #: Tokens a completion may take (the default of ``--max-new-tokens`` is the web tasks' 32).
    max_new_tokens: ClassVar[int] = 32
    #: Where the task comes from (``builtin``, a file, an entry point): recorded with results.
    source: str = "builtin"
    #: Where a completion states its answer (:mod:`.format`; an item of a file may set its own).
    answer_format: ClassVar[AnswerFormat] = TAGS
    #: How the prompt is written: auto, chat, plain or raw (:data:`.format.TEMPLATES`).
    template: ClassVar[str] = "auto"

    @abstractmethod
    def problem(self, seed: int) -> Problem:
        """The problem of environment seed ``seed`` (a pure function of it)."""

    @abstractmethod
    def reward(self, problem: Problem, completion: str) -> float:
        """The verifier: a score in [0, 1], 1 when the completion solves the problem."""

    def process(self, problem: Problem, completion: str) -> float:
        """Partial credit in [0, 1] from the completion's intermediate results (default: the reward)."""
        return self.reward(problem, completion)

    def solution(self, problem: Problem) -> str:
        """A completion that scores 1 (what SFT demonstrates): the answer stated in the problem's format."""
        return self.stated_answer(problem, problem.answer)

    # -------------------------------------------------------------------- the prompt format

    def reads(self, problem: Problem) -> AnswerFormat:
        """The answer format of ``problem`` (the task's; a file's item may set its own)."""
        return self.answer_format

    def stated(self, problem: Problem, completion: str) -> str | None:
        """The answer ``completion`` states in ``problem``'s answer format, or None when it states none."""
        return self.reads(problem).read(completion)

    def stated_answer(self, problem: Problem, answer: str) -> str:
        """A completion stating ``answer`` in ``problem``'s answer format (an error for a format that cannot be
        written: a regex or a function)."""
        from ..core.errors import GraftkitError

        out = self.reads(problem).state(answer)
        if out is None:
            raise GraftkitError(f"task {self.name}: answer format {self.reads(problem).spec} reads answers but cannot "
                                "write one, so SFT has nothing to demonstrate",
                                "train with --answer-format tags, last-number, boxed or whole (or give items a "
                                '"solution")')
        return out

    def conversation(self, problem: Problem) -> list[dict]:
        """The messages the policy reads: the system message (none when it is empty), then the problem."""
        system = self.system
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                             "content": problem.prompt}]

    def with_format(self, fmt: PromptFormat) -> "VerifiableTask":
        """This task in a command's prompt format: a copy with the system message, template and answer format
        ``fmt`` sets (its None fields keep the task's own)."""
        if fmt.is_default:
            return self
        out = copy.copy(self)
        if fmt.system is not None:
            object.__setattr__(out, "system", fmt.system)
        elif fmt.template == "raw" and type(self).system == self.system:
            object.__setattr__(out, "system", "")  # raw: no system message unless one is given
        object.__setattr__(out, "template", fmt.template)
        if fmt.answer is not None:
            object.__setattr__(out, "answer_format", answer_format(fmt.answer))
        return out

    def answers(self, problem: Problem) -> tuple[str, ...]:
        """Every correct answer, where the task has several (pass@k then counts distinct ones)."""
        return (problem.answer,)

    def parseable(self, completion: str, problem: Problem | None = None) -> bool:
        """Whether the completion states an answer in ``problem``'s answer format (the task's without one)."""
        fmt = self.reads(problem) if problem is not None else self.answer_format
        return fmt.read(completion) is not None

    def words(self, seeds: int = 40) -> set[str]:
        """Text the tiny default tokenizer should know: system message, prompts and solutions of a few problems."""
        out = {self.system} if self.system else set()
        for s in range(seeds):
            p = self.problem(s)
            out.update((p.prompt, self.solution(p)))
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def clipped(x: float) -> float:
    """``x`` in [0, 1] (a verifier's score)."""
    return min(1.0, max(0.0, float(x)))
