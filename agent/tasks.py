"""One task interface over both kinds: multi-turn web environments and single-turn verifiable problems.

Every command that evaluates or trains names tasks the same way (``--tasks``): web task names and suites
(``mastered``, ``headroom``, ``all``), built-in verifiable tasks (``arithmetic``, ``countdown-4``...), a
user's ``FILE.jsonl`` or entry point ``module:function`` — mixed freely. :func:`resolve_tasks` turns a
spec into task names (loading a user's tasks when it names them); :func:`make_task_env` gives either
kind's environment (``reset(seed)``, ``step(text)``, ``done``, ``success``, ``spec``) and
:func:`task_spec` its episode rules (``max_steps``, ``oracle``, ``progress``, ``ambiguous``), so items,
held-out splits, rollouts, paired statistics, pass@k and headroom treat both alike.
"""

from __future__ import annotations

from typing import Sequence

from ..core.env import Env, EpisodeSpec
from ..core.errors import GraftkitError
from ..core.suites import suites
from ..verifiable import ProblemEnv, is_verifiable, lookup, resolve_source
from ..verifiable.format import PromptFormat
from ..webenv import make_env
from ..webenv import tasks as webtasks

#: The suite names ``--tasks`` accepts beside task names.
ALL = "all"


def known(name: str) -> bool:
    """Whether ``name`` is a web task or a built-in or loaded verifiable task."""
    return name in webtasks.TASKS or is_verifiable(name)


def is_problem(name: str) -> bool:
    """Whether ``name`` is a single-turn verifiable task (not a web task)."""
    return name not in webtasks.TASKS and is_verifiable(name)


def task_spec(name: str) -> EpisodeSpec:
    """A task's episode rules: the web task class, or a verifiable task's :class:`~graftkit.verifiable.env.ProblemSpec`."""
    if name in webtasks.TASKS:
        return webtasks.TASKS[name]
    check_known([name])
    return ProblemEnv(lookup(name)).spec


def make_task_env(name: str, backend: str = "py", **kwargs) -> Env:
    """The environment of task ``name``: a web environment on ``backend``, or a verifiable problem's
    (which has no backend: a problem is the same text everywhere)."""
    if name in webtasks.TASKS:
        return make_env(name, backend, **kwargs)
    check_known([name])
    return ProblemEnv(lookup(name))


def check_known(names: Sequence[str]) -> None:
    unknown = [n for n in names if not known(n)]
    if unknown:
        raise GraftkitError(f"unknown task(s) {', '.join(unknown)}", HINT)


HINT = (f"suites: {', '.join(suites())}, all; web tasks: {', '.join(sorted(webtasks.TASKS))}; verifiable: "
        "arithmetic, multiply, countdown, multiples (-N for difficulty), FILE.jsonl, module:function")


def resolve_tasks(spec: str | Sequence[str], fmt: PromptFormat | None = None) -> list[str]:
    """Task names from a comma list (or sequence) of suites, task names, verifiable tasks, ``.jsonl`` files
    and ``module:function`` entry points (a user's tasks are loaded and registered here). ``fmt``: the command's
    prompt format of the verifiable ones (:mod:`graftkit.verifiable.format`; None leaves each as it was last
    resolved, the default format restores the task's own)."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for n in (x.strip() for x in names if x.strip()):
        if n == ALL:
            out.extend(webtasks.TASKS)
        elif n in suites():
            out.extend(suites()[n])
        elif n in webtasks.TASKS:
            out.append(n)
        else:
            found = resolve_source(n, fmt)
            if found is None:
                raise GraftkitError(f"unknown task or suite {n!r}", HINT)
            out.extend(found)
    if not out:
        raise GraftkitError("no tasks selected", "pass --tasks mastered, headroom, task names or verifiable tasks")
    return list(dict.fromkeys(out))


def task_sources(names: Sequence[str]) -> dict[str, str]:
    """Where each verifiable task of ``names`` comes from (``builtin``, a file with its digest, an entry
    point): what results record so that a user's task is identified."""
    return {n: lookup(n).source for n in names if is_problem(n)}


def prompt_formats(names: Sequence[str]) -> dict[str, dict]:
    """How each verifiable task of ``names`` was prompted and read (system message, template, answer format), as it
    is looked up now: what results record beside its outcomes."""
    out = {}
    for n in names:
        if is_problem(n):
            task = lookup(n)
            out[n] = {"system": task.system, "template": task.template, "answer_format": task.answer_format.spec}
    return out


def tiny_words(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tiny default tokenizer's vocabulary for ``tasks``: the web tasks' (:func:`~graftkit.agent.policy.task_words`)
    when any is a web task, plus the words of a few prompts and solutions of each verifiable one and the
    plain problem prompt's own words. Without a web task, numbers are not words: they are written digit by
    digit (the tokenizer's single-character pieces), so arithmetic is learnt over digits, not over a
    thousand number tokens."""
    from tokenizers import pre_tokenizers

    from .policy import format_problem, task_words

    webs = [t for t in tasks if not is_problem(t)]
    problems = [t for t in tasks if is_problem(t)]
    words = set(task_words()) if webs or not problems else set()
    split = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    texts = {format_problem("", lookup(t).system) for t in problems}
    for t in problems:
        texts |= lookup(t).words()
    for text in texts:
        words.update(w for w, _ in split.pre_tokenize_str(text) if webs or not any(c.isdigit() for c in w))
    return tuple(sorted(words))
