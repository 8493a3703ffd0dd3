"""The episode protocol carries the task kind's plumbing (core/env.py): the turn's prompt, how an output is read,
whether it has a screenshot and its demonstration pool. Code above the environments asks ``env.spec``; a scan
guards that no module outside the kinds' own packages tests which kind of task it holds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from graftkit.agent.tasks import make_task_env, task_spec
from graftkit.core.env import READS, Prompt
from graftkit.core.errors import GraftkitError
from graftkit.verifiable.format import plain_problem
from graftkit.webenv.render import SYSTEM, format_prompt, render_text
from test_layout import _all_modules as _modules  # every module of the package, the layout's included

ROOT = Path(__file__).resolve().parents[1]

#: Where a task kind may be named: the protocol, the kinds' own packages, and the one dispatcher from a task's
#: name to its kind's environment (agent/tasks.py).
KIND_HOMES = ("core/env.py", "agent/tasks.py", "webenv/", "verifiable/")
#: Questions that tell a task's kind (by name, by class, by observation type).
KIND_TESTS = {"is_problem", "is_verifiable", "is_user_file", "file_size"}
KIND_CLASSES = {"ProblemObservation", "ProblemEnv", "ProblemSpec", "VerifiableTask", "JsonlTask", "WebEnv",
                "MirrorEnv", "MiniWoBEnv", "Observation"}


def _kind_tests(path: Path) -> list[str]:
    """Each place in ``path`` that asks which kind a task is: a call of a kind test, or an ``isinstance`` against
    a kind's class."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name in KIND_TESTS:
            found.append(f"{name}() at line {node.lineno}")
        elif name == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            for k in kinds:
                cls = k.id if isinstance(k, ast.Name) else getattr(k, "attr", None)
                if cls in KIND_CLASSES:
                    found.append(f"isinstance(…, {cls}) at line {node.lineno}")
    return found


def test_no_module_outside_the_protocol_tests_a_task_kind():
    leaks = [f"{p.relative_to(ROOT)}: {where}" for p in _modules()
             if not str(p.relative_to(ROOT)).startswith(KIND_HOMES) for where in _kind_tests(p)]
    assert not leaks, "ask env.spec (prompt, reads, screenshots, demo_pool, items, kind) instead: " + "; ".join(leaks)


def test_the_kind_scan_sees_each_way_of_asking(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from x import is_problem, ProblemObservation\nimport v\n"
                 "def f(obs, t):\n"
                 "    a = is_problem(t)\n"
                 "    b = isinstance(obs, ProblemObservation)\n"
                 "    c = isinstance(obs, (int, v.WebEnv))\n"
                 "    d = isinstance(obs, int)\n")
    assert _kind_tests(f) == ["is_problem() at line 4", "isinstance(…, ProblemObservation) at line 5",
                              "isinstance(…, WebEnv) at line 6"]


@pytest.mark.parametrize("task", ["click-tab", "arithmetic", "multiples"])
def test_every_kind_answers_the_protocol(task):
    spec = task_spec(task)
    assert spec.kind in ("web", "verifiable") and spec.reads in READS
    assert isinstance(spec.screenshots, bool) and spec.demo_pool > 0 and spec.items is None  # generated items
    with make_task_env(task) as env:
        obs = env.reset(3)
        p = env.spec.prompt(obs, [])
        assert isinstance(p, Prompt) and p.messages[-1]["role"] == "user" and p.plain
        assert p == spec.prompt(obs, [])


def test_a_web_turns_prompt_is_the_page_its_history_and_the_system_message():
    with make_task_env("click-tab") as env:
        obs = env.reset(5)
        p = env.spec.prompt(obs, ["click(3)", "click(4)"])
    text = format_prompt(render_text(obs), ["click(3)", "click(4)"])
    assert text.endswith("previous: click(3) ; click(4)\naction:")
    assert p == Prompt(({"role": "system", "content": SYSTEM}, {"role": "user", "content": text}), text, "auto")
    assert (env.spec.kind, env.spec.reads, env.spec.screenshots) == ("web", "action", True)


def test_a_problems_prompt_is_its_conversation_in_its_template():
    with make_task_env("arithmetic") as env:
        obs = env.reset(2)
        p = env.spec.prompt(obs, [])
    assert p.messages[-1] == {"role": "user", "content": obs.problem.prompt}
    assert p.plain == plain_problem(p.messages) and p.plain.endswith("\nanswer:")
    assert (env.spec.kind, env.spec.reads, env.spec.screenshots) == ("verifiable", "completion", False)


def test_a_policy_reads_an_output_as_its_task_reads_it():
    from graftkit.agent import tiny_policy
    from graftkit.agent.tasks import tiny_words

    pol = tiny_policy(tiny_words(["click-tab", "arithmetic"]), size="nano")
    ids = pol.tokenizer("click ( 3 )", add_special_tokens=False)["input_ids"]
    action, completion = pol.output_text(ids, "action"), pol.output_text(ids, "completion")
    assert action == "click(3)" != completion and completion.replace(" ", "") == action  # as decoded, not canonical


def test_screenshots_of_a_task_without_them_are_one_error_naming_it():
    from graftkit.agent import tiny_vlm_policy
    from graftkit.agent.rollout import Decode, rollout

    pol = tiny_vlm_policy(("click",))
    with pytest.raises(GraftkitError, match="arithmetic has none") as e:
        rollout(pol, [("arithmetic", 0, 0)], Decode(), obs="som")
    assert "--obs text" in e.value.fix


def test_a_users_file_is_a_fixed_set_of_its_items(tmp_path):
    import json

    from graftkit.agent.tasks import resolve_tasks
    from graftkit.verifiable import registry

    path = tmp_path / "five.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(5)))
    try:
        (name,) = resolve_tasks(str(path))
        spec = task_spec(name)
        assert (spec.kind, spec.items) == ("verifiable", 5)
    finally:
        registry._REGISTERED.clear()
