"""How a verifiable task's prompt is written and its answer read: the prompt format a trainer used.

A policy trained by another trainer (TRL, verl, OpenRLHF) on a user's problems read them in that trainer's
format and wrote its answers in the format its reward function read. graftkit evaluates it in the same format,
set per item in a task file or for a whole command (``--system``, ``--template``, ``--answer-format``):

- **system message**: the task's own (graftkit's built-ins and a JSONL file: :data:`~.base.SYSTEM`), a message of
  the user's, or none (``--system none``). An item of a file may carry its own (``"system"``), or its whole
  conversation (``"prompt"`` as a list of ``{"role", "content"}`` messages, TRL's conversational format), which is
  rendered as written.
- **template** (:data:`TEMPLATES`): ``auto`` (the tokenizer's chat template when it has one, else ``plain``),
  ``chat`` (the chat template: an error for a tokenizer without one), ``plain`` (graftkit's own: the system
  message, the problem, then ``answer:``), ``raw`` (the prompt's text exactly as written — TRL's standard,
  non-conversational format: no template, no system message unless one is given, no BOS token).
- **answer format** (:func:`answer_format`): where a completion states its answer. ``tags`` (the last
  ``<answer>…</answer>``, graftkit's default), ``last-number`` (the last number written, thousands commas
  allowed: GSM8K's convention), ``boxed`` (the last ``\\boxed{…}``, braces balanced), ``whole`` (the whole
  completion, stripped), ``regex:PATTERN`` (the last match; its first group if it has one), or
  ``module:function`` (a callable ``f(completion) -> str | None``; the module is imported because its name was
  given, so its author's code runs). A completion whose answer cannot be read is *unparseable*: it scores 0 and
  is counted, and every evaluation states the share that parsed.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Sequence

from ..core.config import CommandConfig, check_choice
from ..core.env import Prompt
from ..core.errors import GraftkitError

#: How a prompt is rendered (see the module docstring).
TEMPLATES = ("auto", "chat", "plain", "raw")
#: The answer formats that are names (besides ``regex:PATTERN`` and ``module:function``).
ANSWER_FORMATS = ("tags", "last-number", "boxed", "whole")
#: What ``--system`` takes for "no system message".
NO_SYSTEM = "none"
#: The formats, as the hint of an error lists them.
FORMATS_HINT = "tags, last-number, boxed, whole, regex:PATTERN or module:function"
#: The share of unparsed outputs above which an evaluation, a sweep or a KL table warns.
MOSTLY_UNPARSED = 0.5
#: What reads a verifiable task's answers in another format: the flags of every command that plays them.
FORMAT_FIX = (f"pass --answer-format ({FORMATS_HINT}) and, for the trainer's prompt, --template and --system")


def format_problem(prompt: str, system: str | None) -> str:
    """The plain prompt of a verifiable problem: the task's instruction (none when empty), the problem, then
    ``answer:``."""
    return f"{system}\n{prompt}\nanswer:" if system else f"{prompt}\nanswer:"


def plain_problem(messages: Sequence[Mapping[str, str]]) -> str:
    """A problem's conversation in the plain format (:func:`format_problem`): its system message, the other
    messages' contents, then ``answer:``."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
    return format_problem("\n".join(m["content"] for m in messages if m["role"] != "system"), system)


def problem_prompt(prompt: str | Sequence[Mapping[str, str]], system: str | None = None,
                   template: str = "auto") -> Prompt:
    """A problem's :class:`~graftkit.core.env.Prompt`: ``prompt`` (a conversation of messages, rendered as written,
    or the problem's text after ``system``, none when empty) in ``template``."""
    if isinstance(prompt, str):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    else:
        msgs = [dict(m) for m in prompt]
    return Prompt(tuple(msgs), plain_problem(msgs), template)


_TAGS = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.S | re.I)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_BOXED = re.compile(r"\\boxed\s*\{")
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def _tags(text: str) -> str | None:
    found = _TAGS.findall(text)
    return found[-1].strip() if found else None


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").lstrip("+") if found else None


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` whose braces close (nested braces kept)."""
    last = None
    for m in _BOXED.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end():i - 1].strip()
    return last


def _whole(text: str) -> str | None:
    return text.strip() or None


@dataclass(frozen=True)
class AnswerFormat:
    """Where a completion states its answer: :meth:`read` finds it, :meth:`state` writes a completion that
    states a given answer (what SFT demonstrates; None where the format cannot be written, a regex or a
    function)."""

    spec: str
    reader: Callable[[str], str | None]
    writer: Callable[[str], str] | None = None

    def read(self, completion: str) -> str | None:
        """The answer the completion states, stripped, or None when it states none in this format."""
        found = self.reader(completion)
        if found is not None and not isinstance(found, str):
            raise GraftkitError(f"answer format {self.spec} returned {type(found).__name__} {found!r:.60}, not a "
                                "string or None", "make the function return the answer's text, or None")
        return found.strip() if found is not None else None

    def state(self, answer: str) -> str | None:
        """A completion stating ``answer`` (None where the format cannot write one)."""
        return self.writer(answer) if self.writer is not None else None


_NAMED = {
    "tags": (_tags, lambda a: f"<answer>{a}</answer>"),
    "last-number": (_last_number, str),
    "boxed": (_boxed, lambda a: f"\\boxed{{{a}}}"),
    "whole": (_whole, str),
}


@lru_cache(maxsize=None)
def answer_format(spec: str, flag: str = "--answer-format") -> AnswerFormat:
    """The :class:`AnswerFormat` ``spec`` names (see the module docstring); a bad one is one error naming ``flag``."""
    spec = spec.strip()
    if spec in _NAMED:
        return AnswerFormat(spec, *_NAMED[spec])
    if spec.startswith("regex:"):
        try:
            pattern = re.compile(spec[len("regex:"):], re.S)
        except re.error as e:
            raise GraftkitError(f"{flag} {spec!r}: not a regular expression ({e})",
                                "write regex:PATTERN with a Python regular expression, e.g. 'regex:#### (.+)'") from None
        if not pattern.pattern:
            raise GraftkitError(f"{flag} {spec!r}: the pattern is empty", "write regex:PATTERN, e.g. 'regex:#### (.+)'")

        def read(text: str) -> str | None:
            found = list(pattern.finditer(text))
            return (found[-1].group(1) if pattern.groups else found[-1].group(0)) if found else None

        return AnswerFormat(spec, read)
    if _FUNCTION.fullmatch(spec):
        module_name, attr = spec.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise GraftkitError(f"{flag} {spec}: module {module_name} cannot be imported ({e})",
                                "make the module importable (pip install -e its package, or add its folder to "
                                "PYTHONPATH)") from None
        function = getattr(module, attr, None)
        if not callable(function):
            raise GraftkitError(f"{flag} {spec}: module {module_name} has no function {attr}",
                                f"define {attr}(completion) -> the answer's text or None in {module_name}")
        return AnswerFormat(spec, function)
    raise GraftkitError(f"{flag} {spec!r} is not an answer format", f"use {FORMATS_HINT}")


TAGS = answer_format("tags")


@dataclass(frozen=True)
class PromptFormat:
    """A command's prompt format for verifiable tasks: what it sets, where items leave it unsaid. ``system``:
    None (the task's own), ``""`` (none) or a message; ``template``: one of :data:`TEMPLATES`; ``answer``: an
    answer format's spec, None for the task's own."""

    system: str | None = None
    template: str = "auto"
    answer: str | None = None

    @property
    def is_default(self) -> bool:
        return self == PromptFormat()

    def as_dict(self) -> dict:
        return {"system": self.system, "template": self.template, "answer": self.answer}


@dataclass(frozen=True, kw_only=True)
class PromptOption(CommandConfig):
    """The prompt format of verifiable tasks (mixed into every config that plays or trains on them)."""

    system: str | None = None
    """System message of a verifiable task's prompt, as the trainer wrote it (default: the task's own; none: no
    system message). An item's own system message or conversation wins."""
    template: str = "auto"
    """How a verifiable task's prompt is written: auto (the tokenizer's chat template if it has one, else plain),
    chat, plain (graftkit's: system, problem, 'answer:') or raw (the prompt text exactly as written, TRL's standard
    format)."""
    answer_format: str | None = None
    """Where a completion states its answer: tags (<answer>…</answer>, the default), last-number, boxed, whole,
    regex:PATTERN or module:function (the module is imported). An item's own answer_format wins."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.template, TEMPLATES, "--template")
        if self.answer_format is not None:
            answer_format(self.answer_format)

    @property
    def prompt_format(self) -> PromptFormat:
        """The fields as a :class:`PromptFormat` (``--system none`` is ``""``)."""
        system = "" if self.system is not None and self.system.strip().lower() == NO_SYSTEM else self.system
        return PromptFormat(system, self.template, self.answer_format)


__all__ = ["ANSWER_FORMATS", "AnswerFormat", "FORMAT_FIX", "FORMATS_HINT", "MOSTLY_UNPARSED", "NO_SYSTEM", "PromptFormat", "PromptOption", "TAGS",
           "TEMPLATES", "answer_format"]
