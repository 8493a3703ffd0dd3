"""A user's verifiable tasks: a JSONL file of items, or a Python entry point that returns tasks.

A JSONL task file holds one item per line (blank lines and lines starting with ``#`` are skipped)::

    {"prompt": "What is 7 * 6?", "answer": 42, "verifier": "numeric", "tolerance": 0.5}
    {"prompt": "Name a prime in 10..20.", "answer": "1[1379]", "verifier": "regex", "solution": "<answer>11</answer>"}
    {"id": "q3", "prompt": "Spell cat backwards.", "answer": "tac"}

Fields: ``prompt`` (a non-empty string) and ``answer`` (a string or number) are required; ``verifier`` is
one of

- ``exact`` (the default): the completion's stated answer (:func:`~.base.extract_answer`) equals the
  answer, both stripped and with runs of whitespace read as one space;
- ``numeric``: the stated answer (:func:`~.base.parse_number`) is within ``tolerance`` of the answer
  (absolute; default 1e-6);
- ``regex``: the answer is a Python regular expression that must match the whole stated answer;
- ``module:function``: a Python callable ``f(completion: str, item: dict) -> float`` in [0, 1], given the
  item's JSON object. **The module is imported, so its author's code runs**: a file runs only code it
  names itself, and only on this line's say-so (loading never executes anything else).

Optional fields: ``id`` (a string), ``tolerance`` (``numeric`` only), ``solution`` (a completion that
scores 1: what SFT demonstrates for ``regex`` and function-verified items, whose answer is not one),
and the item's prompt format (:mod:`.format`), as the trainer that trained on the file wrote it:

- ``system``: the item's system message (``null`` or ``""``: none), instead of the task's;
- ``prompt`` as a conversation, TRL's conversational format: a list of ``{"role": "system" | "user" |
  "assistant", "content": ...}`` messages ending with a user message, rendered as written (its own system
  message or none);
- ``answer_format``: where the item's completions state their answer (``tags``, ``last-number``, ``boxed``,
  ``whole``, ``regex:PATTERN``), instead of the command's ``--answer-format``.

Other fields are kept in the problem's data and handed to a function verifier. The task is named after the
file's stem (``gsm-mini.jsonl`` → ``gsm-mini``) and
its source is the file's absolute path with the first 16 hex digits of its sha256, so results record
which version of the file they scored. The whole file is validated when it is loaded; the first bad line
is one error naming the file, the line and the field.

Seed ``s`` shows item ``(s + (s >> 32) · 0x9E3779B1) mod n``: seeds 0..n−1 show every item once, and the
candidate seeds evaluation draws at ``base + j · 2³²`` move to other items.

An entry point ``package.module:attribute`` names a task, an iterable of tasks, or a callable (no
arguments) that returns either; importing the module runs its code.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import numbers
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..core.errors import GraftkitError
from .base import Problem, VerifiableTask, parse_number
from .format import TAGS, AnswerFormat, answer_format

_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
_BUILT_IN_VERIFIERS = ("exact", "numeric", "regex")
_DEFAULT_TOLERANCE = 1e-6
_GOLDEN = 0x9E3779B1


@dataclass(frozen=True)
class _Item:
    """One validated line: how its answer is checked."""

    line: int
    fields: dict[str, Any]
    answer: str
    verifier: str
    value: float | None = None
    tolerance: float = _DEFAULT_TOLERANCE
    pattern: re.Pattern | None = None
    function: Callable[[str, dict], float] | None = None
    solution: str | None = None
    #: The item's own answer format (None: the task's).
    reads: AnswerFormat | None = None
    #: The item's conversation (a prompt given as messages), else None.
    messages: tuple[dict, ...] | None = None


def _normalised(text: str) -> str:
    return " ".join(text.split())


def item_index(seed: int, n: int) -> int:
    """The item seed ``seed`` shows of ``n``: a bijection on 0..n−1, moved by each multiple of 2³²."""
    return (seed + (seed >> 32) * _GOLDEN) % n


class JsonlTask(VerifiableTask):
    """The items of a user's JSONL file (see the module docstring); build it with :func:`load_jsonl`."""

    def __init__(self, name: str, source: str, items: list[_Item]):
        self.name, self.source, self._items = name, source, items

    def __len__(self) -> int:
        return len(self._items)

    def problem(self, seed: int) -> Problem:
        i = item_index(int(seed), len(self._items))
        item = self._items[i]
        prompt = item.messages[-1]["content"] if item.messages else item.fields["prompt"]
        return Problem(self.name, prompt, item.answer, {**item.fields, "index": i}, item.messages)

    def _item(self, problem: Problem) -> _Item:
        return self._items[problem.data["index"]]

    def reads(self, problem: Problem) -> AnswerFormat:
        return self._item(problem).reads or self.answer_format

    def conversation(self, problem: Problem) -> list[dict]:
        """The item's conversation as written, or its system message (the task's when it gives none) and prompt."""
        item = self._item(problem)
        if item.messages:
            return [dict(m) for m in item.messages]
        system = (item.fields["system"] or "") if "system" in item.fields else self.system
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user",
                                                                             "content": problem.prompt}]

    def reward(self, problem: Problem, completion: str) -> float:
        item = self._item(problem)
        if item.function is not None:
            return self._call(item, completion)
        stated = self.stated(problem, completion)
        if stated is None:
            return 0.0
        if item.verifier == "numeric":
            value = parse_number(stated)
            return float(value is not None and abs(value - item.value) <= item.tolerance)
        if item.verifier == "regex":
            return float(item.pattern.fullmatch(stated) is not None)
        return float(_normalised(stated) == _normalised(item.answer))

    def _call(self, item: _Item, completion: str) -> float:
        score = item.function(completion, json.loads(json.dumps(item.fields)))  # a copy: its edits stay its own
        if not isinstance(score, numbers.Real) or not 0.0 <= score <= 1.0:  # a bool is 0 or 1, numpy's floats pass
            raise GraftkitError(f"verifier {item.verifier} of {self.source} line {item.line} returned {score!r}, "
                                "not a score in [0, 1]", "make the verifier return a float between 0 and 1")
        return float(score)

    def solution(self, problem: Problem) -> str:
        item = self._item(problem)
        if item.verifier in ("exact", "numeric") and (item.solution is None or self.reads(problem).state(item.answer)):
            return self.stated_answer(problem, item.answer)
        if item.solution is None:
            raise GraftkitError(f"{self.source} line {item.line}: a {item.verifier} verifier's answer is not a "
                                "completion, so SFT has nothing to demonstrate",
                                'give regex- and function-verified items a "solution" field (a completion '
                                "that scores 1)")
        return item.solution

    def words(self, seeds: int = 40) -> set[str]:
        """As the base class's, leaving out the solutions of items that have none."""
        out = {self.system} if self.system else set()
        for s in range(seeds):
            p = self.problem(s)
            item = self._item(p)
            out.update(m["content"] for m in self.conversation(p))
            if (item.verifier in ("exact", "numeric") and self.reads(p).state(item.answer) is not None
                    or item.solution is not None):
                out.add(self.solution(p))
        return out


def file_seed(seed: int, episode: int, episodes: int) -> int:
    """The environment seed of episode ``episode`` of ``episodes`` under evaluation seed ``seed`` on a user's file
    played on every item: ``seed · episodes + episode``, which shows item ``(seed · episodes + episode) mod N``
    (:func:`item_index`), so seeds 0..S−1 play S·E consecutive items of the file: every
    one of N items once when S·E = N, each ⌊S·E/N⌋ or ⌈S·E/N⌉ times when it is more, the first S·E when less."""
    return seed * episodes + episode


def coverage(items, n_items: int) -> dict:
    """How the episodes whose item ids are ``items`` cover a file of ``n_items`` items: ``distinct`` items played,
    ``total`` items of the file, ``episodes``, and the least and most times an item was played (least 0 when some
    were left out)."""
    flat = items.ravel() if hasattr(items, "ravel") else items
    counts = Counter(str(x) for x in flat)
    distinct = len(counts)
    return {"distinct": distinct, "total": n_items, "episodes": int(sum(counts.values())),
            "least": min(counts.values()) if distinct >= n_items else 0, "most": max(counts.values(), default=0)}


def coverage_note(task: str, cov: dict, seeds: int, episodes: int) -> str:
    """One line on how an evaluation covered a user's file: whole (and how often each item), or which part and
    the ``--seeds`` that would cover it."""
    if cov["distinct"] < cov["total"]:
        need = -(-cov["total"] // episodes)
        return (f"{task}: {cov['distinct']} of the file's {cov['total']} items played ({seeds} seeds × {episodes} "
                f"episodes); pass --seeds {need} (seeds × episodes ≥ {cov['total']}) to play every item")
    times = ("each once" if cov["most"] == 1 else f"each {cov['most']} times" if cov["least"] == cov["most"]
             else f"each {cov['least']} or {cov['most']} times ({cov['episodes']} episodes over {cov['total']} items)")
    return f"{task}: the whole file played, {cov['total']} items, {times}"


def load_jsonl(path: str) -> JsonlTask:
    """The task a user's JSONL file holds, every line validated (the first bad one is the error)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise GraftkitError(f"{path}: no such task file", "name an existing .jsonl file (one JSON object a line)")
    digest = hashlib.sha256()
    items: list[_Item] = []
    ids: dict[str, int] = {}
    functions: dict[str, Callable] = {}
    with file.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            digest.update(raw)
            try:
                text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").strip()
            except UnicodeDecodeError as e:
                raise GraftkitError(f"{path}:{line_no}: not UTF-8 text ({e.reason} at byte {e.start})",
                                    "save the file as UTF-8") from None
            if not text or text.startswith("#"):
                continue
            item = _parse_item(path, line_no, text, functions)
            item_id = item.fields.get("id")
            if item_id is not None:
                if item_id in ids:
                    raise GraftkitError(f'{path}:{line_no}: field "id" {item_id!r} repeats line {ids[item_id]}',
                                        "give every item its own id")
                ids[item_id] = line_no
            items.append(item)
    if not items:
        raise GraftkitError(f"{path}: no items (every line is blank or a # comment)",
                            'write one JSON object a line with a "prompt" and an "answer"')
    source = f"{file.resolve()} (sha256:{digest.hexdigest()[:16]})"
    return JsonlTask(file.stem, source, items)


def _parse_item(path: str, line_no: int, text: str, functions: dict[str, Callable]) -> _Item:
    """One line's item, or the error that names its field."""
    where = f"{path}:{line_no}"
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise GraftkitError(f"{where}: not a JSON object ({e.msg} at column {e.colno})",
                            "write one JSON object a line (blank lines and # comments are skipped)") from None
    if not isinstance(fields, dict):
        raise GraftkitError(f"{where}: not a JSON object (a JSON {type(fields).__name__})",
                            "write one JSON object a line (blank lines and # comments are skipped)")

    def bad(field: str, what: str, fix: str) -> GraftkitError:
        return GraftkitError(f'{where}: field "{field}" {what}', fix)

    prompt = fields.get("prompt")
    messages = None
    if isinstance(prompt, list):
        messages = _conversation(prompt, bad)
    elif not isinstance(prompt, str) or not prompt.strip():
        raise bad("prompt", "is missing or empty" if prompt is None or isinstance(prompt, str)
                  else f"is {prompt!r:.60}, not a string or a list of messages",
                  'give every item a non-empty string "prompt" (or a list of {"role", "content"} messages)')
    if "system" in fields:
        if messages is not None:
            raise bad("system", "is given beside a conversation prompt",
                      'put the system message into the conversation as {"role": "system", ...}, or drop "system"')
        if fields["system"] is not None and not isinstance(fields["system"], str):
            raise bad("system", f"is {fields['system']!r:.60}, not a string or null",
                      'write "system" as the system message, or null for none')
    reads = None
    if "answer_format" in fields:
        spec = fields["answer_format"]
        if not isinstance(spec, str):
            raise bad("answer_format", f"is {spec!r:.60}, not a string", "write e.g. \"answer_format\": \"last-number\"")
        try:
            reads = answer_format(spec, flag='field "answer_format"')
        except GraftkitError as e:
            raise GraftkitError(f"{where}: {e.what}", e.fix) from None
    answer = fields.get("answer")
    if answer is None:
        raise bad("answer", "is missing", 'give every item an "answer" (a string or a number)')
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise bad("answer", f"is {answer!r}, not a string or a number", 'write the "answer" as a string or a number')
    answer = str(answer)
    if not answer.strip():
        raise bad("answer", "is empty", 'give every item a non-empty "answer"')
    for field in ("id", "solution"):
        if field in fields and not (isinstance(fields[field], str) and fields[field].strip()):
            raise bad(field, f"is {fields[field]!r}, not a non-empty string", f'write "{field}" as a non-empty string')

    verifier = fields.get("verifier", "exact")
    if not isinstance(verifier, str) or not (verifier in _BUILT_IN_VERIFIERS or _FUNCTION.fullmatch(verifier)):
        raise bad("verifier", f"is {verifier!r}, not a known verifier",
                  "use exact, numeric, regex or module:function (a callable f(completion, item) -> score)")
    if "tolerance" in fields and verifier != "numeric":
        raise bad("tolerance", f"applies to the numeric verifier only, not {verifier}",
                  'remove "tolerance" or set "verifier": "numeric"')
    item = dict(line=line_no, fields=fields, answer=answer, verifier=verifier, solution=fields.get("solution"),
                reads=reads, messages=messages)

    if verifier == "numeric":
        item["value"] = parse_number(answer)
        if item["value"] is None:
            raise bad("answer", f"is {answer!r}, not a number for the numeric verifier",
                      'write the "answer" as a number, or use "verifier": "exact"')
        tolerance = fields.get("tolerance", _DEFAULT_TOLERANCE)
        if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance)
                or tolerance < 0):
            raise bad("tolerance", f"is {tolerance!r}, not a number ≥ 0",
                      'write "tolerance" as an absolute difference, e.g. 0.01')
        item["tolerance"] = float(tolerance)
    elif verifier == "regex":
        try:
            item["pattern"] = re.compile(answer)
        except re.error as e:
            raise bad("answer", f"is not a regular expression the regex verifier can compile ({e})",
                      "write the answer as a Python regular expression") from None
        reader = reads or TAGS
        stated = reader.read(item["solution"]) if item["solution"] is not None else None
        if item["solution"] is not None and (stated is None or item["pattern"].fullmatch(stated) is None):
            raise bad("solution", "does not match the answer's regular expression",
                      f"give a solution whose answer ({reader.spec}) the answer's regex matches in full")
    elif verifier != "exact":
        item["function"] = functions.get(verifier) or _function(where, verifier)
        functions[verifier] = item["function"]
    return _Item(**item)


_ROLES = ("system", "user", "assistant")


def _conversation(prompt: list, bad) -> tuple[dict, ...]:
    """A prompt given as messages (TRL's conversational format), validated: roles, string contents, a system
    message only first, and a user message last (the policy answers it)."""
    fix = 'write "prompt" as [{"role": "system", "content": ...}, {"role": "user", "content": ...}]'
    if not prompt:
        raise bad("prompt", "is an empty list of messages", fix)
    out = []
    for k, m in enumerate(prompt):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise bad("prompt", f"message {k} is {m!r:.60}, not a {{\"role\": system|user|assistant, \"content\": "
                      "text}", fix)
        if m["role"] == "system" and k:
            raise bad("prompt", f"message {k} is a system message after the first", "put the system message first")
        out.append({"role": m["role"], "content": m["content"]})
    if out[-1]["role"] != "user" or not out[-1]["content"].strip():
        raise bad("prompt", "does not end with a non-empty user message", "end the conversation with the user's turn")
    return tuple(out)


def _function(where: str, spec: str) -> Callable:
    """The callable a ``module:function`` verifier names (the module is imported: its code runs)."""
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise GraftkitError(f'{where}: field "verifier" names {spec}, but module {module_name} cannot be imported '
                            f"({e})", "make the module importable (pip install -e its package, or add its "
                            "folder to PYTHONPATH)") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise GraftkitError(f'{where}: field "verifier" names {spec}, but module {module_name} has '
                            f"{'no attribute ' + repr(attr) if function is None else f'{attr} = {function!r}'}",
                            f"define a function {attr}(completion, item) -> score in [0, 1] in {module_name}")
    return function


def load_entry_point(spec: str) -> list[VerifiableTask]:
    """The tasks entry point ``package.module:attribute`` names (the module is imported: its code runs)."""
    if not _FUNCTION.fullmatch(spec):
        raise GraftkitError(f"entry point {spec!r} is not package.module:attribute",
                            "name the tasks as my_pkg.tasks:suite")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise GraftkitError(f"entry point {spec}: module {module_name} cannot be imported ({e})",
                            "make the module importable (pip install -e its package, or add its folder to "
                            "PYTHONPATH)") from None
    if not hasattr(module, attr):
        raise GraftkitError(f"entry point {spec}: module {module_name} has no attribute {attr!r}",
                            f"define {attr} in {module_name}: a task, a list of tasks, or a function "
                            "returning either")
    value = getattr(module, attr)
    if not isinstance(value, VerifiableTask) and callable(value):
        value = value()
    tasks = _tasks(spec, value)
    names: set[str] = set()
    for task in tasks:
        if not isinstance(task.name, str) or not task.name:
            raise GraftkitError(f"entry point {spec}: task {task!r} has no name",
                                "give every task a non-empty name attribute")
        if task.name in names:
            raise GraftkitError(f"entry point {spec}: two tasks are named {task.name!r}",
                                "give every task of the entry point its own name")
        names.add(task.name)
        if task.source == "builtin":
            object.__setattr__(task, "source", spec)  # object's setter: a frozen dataclass task records it too
    return tasks


def _tasks(spec: str, value: Any) -> list[VerifiableTask]:
    """``value`` as a non-empty list of tasks, or the error that says what it is instead."""
    expected = "a VerifiableTask, an iterable of them, or a function of no arguments returning either"
    if isinstance(value, VerifiableTask):
        return [value]
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise GraftkitError(f"entry point {spec} gave {type(value).__name__} {value!r:.80}, not tasks",
                            f"make it {expected}")
    tasks = list(value)
    if not tasks:
        raise GraftkitError(f"entry point {spec} gave no tasks", f"make it {expected}")
    for i, task in enumerate(tasks):
        if not isinstance(task, VerifiableTask):
            raise GraftkitError(f"entry point {spec}: element {i} is {type(task).__name__} {task!r:.80}, not a "
                                "VerifiableTask", f"make it {expected}")
    return tasks
