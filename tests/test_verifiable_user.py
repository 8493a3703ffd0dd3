"""A user's verifiable tasks: JSONL files (exact, numeric, regex and function verifiers) and entry points."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap

import pytest

from graftkit.core.errors import GraftkitError
from graftkit.verifiable import ProblemEnv, registry
from graftkit.verifiable.base import VerifiableTask
from graftkit.verifiable.user import JsonlTask, item_index, load_entry_point, load_jsonl

ITEMS = [
    {"id": "add", "prompt": "What is 2 + 2?", "answer": "4"},
    {"prompt": "What is pi to two places?", "answer": 3.14, "verifier": "numeric", "tolerance": 0.005},
    {"prompt": "Name a vowel.", "answer": "[aeiou]", "verifier": "regex", "solution": "<answer>e</answer>"},
    {"prompt": "Spell it out.", "answer": "two  words", "note": "kept"},
]


def write(folder, name: str, lines: list) -> str:
    path = folder / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return str(path)


def by_prompt(task: JsonlTask, n: int) -> dict:
    return {task.problem(s).prompt: task.problem(s) for s in range(n)}


@pytest.fixture(autouse=True)
def clean_registry():
    registry._REGISTERED.clear()
    yield
    registry._REGISTERED.clear()


@pytest.fixture
def module(tmp_path, monkeypatch, request):
    """Writes a module (named after the test, so none is cached from another) on sys.path; returns its name."""
    name = "user_mod_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    monkeypatch.syspath_prepend(str(tmp_path))
    request.addfinalizer(lambda: sys.modules.pop(name, None))

    def make(source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        return name

    return make


TASKS_MODULE = """
    from graftkit.verifiable.base import Problem, VerifiableTask

    class Echo(VerifiableTask):
        def __init__(self, name, source="builtin"):
            self.name, self.source = name, source
        def problem(self, seed):
            return Problem(self.name, f"say {seed}", str(seed))
        def reward(self, problem, completion):
            return float(completion == problem.answer)
"""


def test_jsonl_rewards_are_exact(tmp_path):
    task = load_jsonl(write(tmp_path, "mix.jsonl", ["# a comment", "", *ITEMS, "   "]))
    assert isinstance(task, JsonlTask) and task.name == "mix" and len(task) == 4
    p = by_prompt(task, 4)
    exact, numeric, regex, spaced = (p[i["prompt"]] for i in ITEMS)
    cases = [
        (exact, "<answer> 4 </answer>", 1.0), (exact, "<answer>5</answer>", 0.0), (exact, "4", 0.0),
        (numeric, "<answer>3.144</answer>", 1.0), (numeric, "<answer>3.1</answer>", 0.0),
        (numeric, "<answer>pi</answer>", 0.0), (numeric, "3.14", 0.0),
        (regex, "<answer>a</answer>", 1.0), (regex, "<answer>ae</answer>", 0.0), (regex, "a", 0.0),
        (spaced, "<answer>two words</answer>", 1.0), (spaced, "<answer>two\n words </answer>", 1.0),
        (spaced, "<answer>twowords</answer>", 0.0),
    ]
    assert [task.reward(q, c) for q, c, _ in cases] == [r for _, _, r in cases]
    assert [task.process(q, c) for q, c, _ in cases] == [r for _, _, r in cases]
    assert (exact.answer, numeric.answer, regex.answer) == ("4", "3.14", "[aeiou]")
    assert exact.data == {"index": exact.data["index"], **ITEMS[0]} and spaced.data["note"] == "kept"
    assert [task.solution(q) for q in (exact, numeric, regex)] == [
        "<answer>4</answer>", "<answer>3.14</answer>", "<answer>e</answer>"]
    assert all(task.reward(q, task.solution(q)) == 1.0 for q in p.values())
    assert task.words() == {task.system, *(q.prompt for q in p.values()), *(task.solution(q) for q in p.values())}


def test_name_and_source_record_the_file(tmp_path):
    path = write(tmp_path, "gsm-mini.jsonl", ITEMS[:1])
    task = load_jsonl(path)
    digest = hashlib.sha256((tmp_path / "gsm-mini.jsonl").read_bytes()).hexdigest()[:16]
    assert task.name == "gsm-mini" and task.source == f"{(tmp_path / 'gsm-mini.jsonl').resolve()} (sha256:{digest})"
    assert task.problem(0).task == "gsm-mini"


def test_seeds_visit_every_item_once(tmp_path):
    task = load_jsonl(write(tmp_path, "four.jsonl", ITEMS))
    assert sorted(task.problem(s).data["index"] for s in range(4)) == [0, 1, 2, 3]
    assert [item_index(s, 4) for s in range(4)] == [0, 1, 2, 3]
    assert task.problem(2**32).data["index"] == (0x9E3779B1 % 4) == 1 != task.problem(0).data["index"]
    assert sorted(item_index(s, 7) for s in range(7)) == list(range(7))
    assert item_index(3 * 2**32 + 2, 1000) == (3 * 2**32 + 2 + 3 * 0x9E3779B1) % 1000 == 173
    assert task.problem(5) == task.problem(5) and task.problem(5).data == task.problem(5).data


def test_regex_and_function_items_need_a_solution_for_sft(tmp_path, module):
    name = module("def score(completion, item):\n    return 1.0\n")
    task = load_jsonl(write(tmp_path, "nosol.jsonl", [
        {"prompt": "p", "answer": "a+", "verifier": "regex"},
        {"prompt": "q", "answer": "x", "verifier": f"{name}:score"}]))
    for s in range(2):
        with pytest.raises(GraftkitError, match='SFT has nothing to demonstrate.*"solution" field'):
            task.solution(task.problem(s))
    assert task.words() == {task.system, "p", "q"}


def test_function_verifier_is_called_with_the_item(tmp_path, module):
    name = module("""
        CALLS = []
        def score(completion, item):
            CALLS.append((completion, item))
            item["answer"] = "changed"
            return 0.25 if item["answer"] and "yes" in completion else 0.0
        def out_of_range(completion, item):
            return 2.0
        def boolean(completion, item):
            return completion == "x"
        NOT_CALLABLE = 3
    """)
    task = load_jsonl(write(tmp_path, "fn.jsonl", [
        {"prompt": "Say yes.", "answer": "yes", "verifier": f"{name}:score", "solution": "yes", "extra": [1]},
        {"prompt": "Any.", "answer": "x", "verifier": f"{name}:out_of_range"},
        {"prompt": "Bool.", "answer": "x", "verifier": f"{name}:boolean"}]))
    calls = sys.modules[name].CALLS
    p, bad, boolean = (by_prompt(task, 3)[q] for q in ("Say yes.", "Any.", "Bool."))
    assert (task.reward(boolean, "x"), task.reward(boolean, "y")) == (1.0, 0.0)
    assert task.reward(p, "yes please") == 0.25 and task.reward(p, "no") == 0.0
    assert calls == [("yes please", {"prompt": "Say yes.", "answer": "changed", "verifier": f"{name}:score",
                                     "solution": "yes", "extra": [1]}), ("no", calls[1][1])]
    assert task.reward(p, "yes") == 0.25 and p.answer == "yes"  # the verifier's edit of its copy stays there
    assert task.problem(p.data["index"]).data["answer"] == "yes"
    assert task.solution(p) == "yes"
    with pytest.raises(GraftkitError, match=r"fn.jsonl.*line 2 returned 2.0, not a score in \[0, 1\]"):
        task.reward(bad, "x")
    for attr, said in [("NOT_CALLABLE", "NOT_CALLABLE = 3"), ("missing", "no attribute 'missing'")]:
        path = write(tmp_path, "badfn.jsonl", [{"prompt": "p", "answer": "a", "verifier": f"{name}:{attr}"}])
        with pytest.raises(GraftkitError, match=f'badfn.jsonl:1: field "verifier" names {name}:{attr}.*{said}'):
            load_jsonl(path)


BAD_FILES = [
    (['{"prompt": "p", "answer": "a"}', '{"prompt": "p", answer}'], r"bad.jsonl:2: not a JSON object \("),
    (['{"prompt": "p", "answer": "a"}', "[1, 2]"], r"bad.jsonl:2: not a JSON object \(a JSON list\)"),
    ([{"answer": "a"}], 'bad.jsonl:1: field "prompt" is missing or empty'),
    ([{"prompt": "  ", "answer": "a"}], 'bad.jsonl:1: field "prompt" is missing or empty'),
    ([{"prompt": 3, "answer": "a"}], 'bad.jsonl:1: field "prompt" is 3, not a string'),
    (["# c", {"prompt": "p", "answer": "a"}, {"prompt": "p"}], 'bad.jsonl:3: field "answer" is missing'),
    ([{"prompt": "p", "answer": True}], 'bad.jsonl:1: field "answer" is True, not a string or a number'),
    ([{"prompt": "p", "answer": " "}], 'bad.jsonl:1: field "answer" is empty'),
    ([{"prompt": "p", "answer": "a", "verifier": "fuzzy"}], "bad.jsonl:1: field \"verifier\" is 'fuzzy', not a known"),
    ([{"prompt": "p", "answer": "1", "verifier": "numeric", "tolerance": -1}],
     'bad.jsonl:1: field "tolerance" is -1, not a number ≥ 0'),
    ([{"prompt": "p", "answer": "1", "verifier": "numeric", "tolerance": "big"}],
     "bad.jsonl:1: field \"tolerance\" is 'big', not a number ≥ 0"),
    ([{"prompt": "p", "answer": "a", "tolerance": 0.1}],
     'bad.jsonl:1: field "tolerance" applies to the numeric verifier only, not exact'),
    ([{"prompt": "p", "answer": "one", "verifier": "numeric"}],
     "bad.jsonl:1: field \"answer\" is 'one', not a number for the numeric verifier"),
    ([{"prompt": "p", "answer": "a"}, {"prompt": "p", "answer": "(a", "verifier": "regex"}],
     'bad.jsonl:2: field "answer" is not a regular expression the regex verifier can compile'),
    ([{"prompt": "p", "answer": "a", "verifier": "regex", "solution": "<answer>b</answer>"}],
     'bad.jsonl:1: field "solution" does not match'),
    ([{"prompt": "p", "answer": "a", "system": 3}], 'bad.jsonl:1: field "system" is 3, not a string or null'),
    ([{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "answer": "a", "system": "s"}],
     'bad.jsonl:1: field "system" is given beside a conversation prompt'),
    ([{"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}], "answer": "a"}],
     'bad.jsonl:1: field "prompt" does not end with a non-empty user message'),
    ([{"prompt": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
      "answer": "a"}], 'bad.jsonl:1: field "prompt" message 1 is a system message after the first'),
    ([{"prompt": [{"role": "tool", "content": "q"}], "answer": "a"}], 'bad.jsonl:1: field "prompt" message 0 is'),
    ([{"prompt": [], "answer": "a"}], 'bad.jsonl:1: field "prompt" is an empty list of messages'),
    ([{"prompt": "p", "answer": "a", "answer_format": "digits"}],
     "bad.jsonl:1: field \"answer_format\" 'digits' is not an answer format"),
    ([{"prompt": "p", "answer": "a", "answer_format": "regex:("}],
     'bad.jsonl:1: field "answer_format" .regex:\\(.: not a regular expression'),
    ([{"prompt": "p", "answer": "a", "id": 7}], 'bad.jsonl:1: field "id" is 7, not a non-empty string'),
    ([{"prompt": "p", "answer": "a", "id": "x"}, {"prompt": "q", "answer": "b", "id": "x"}],
     "bad.jsonl:2: field \"id\" 'x' repeats line 1"),
    (["# only a comment", ""], r"bad.jsonl: no items \(every line is blank or a # comment\)"),
    ([{"prompt": "p", "answer": "a", "verifier": "no_such_module_xyz:f"}],
     'bad.jsonl:1: field "verifier" names no_such_module_xyz:f, but module no_such_module_xyz cannot be imported'),
]


@pytest.mark.parametrize("lines, message", BAD_FILES)
def test_bad_file_is_one_error_naming_line_and_field(tmp_path, lines, message):
    path = write(tmp_path, "bad.jsonl", lines + [{"prompt": "fine", "answer": "ok"}] * ("no items" not in message))
    with pytest.raises(GraftkitError, match=message) as info:
        load_jsonl(path)
    assert str(info.value).startswith(path) and info.value.fix


def test_unreadable_files(tmp_path):
    with pytest.raises(GraftkitError, match="missing.jsonl: no such task file"):
        load_jsonl(str(tmp_path / "missing.jsonl"))
    (tmp_path / "latin.jsonl").write_bytes(b'{"prompt": "p", "answer": "a"}\n{"prompt": "caf\xe9", "answer": "a"}\n')
    with pytest.raises(GraftkitError, match="latin.jsonl:2: not UTF-8 text"):
        load_jsonl(str(tmp_path / "latin.jsonl"))
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "p", "answer": "a"}\n')
    assert load_jsonl(str(tmp_path / "bom.jsonl")).problem(0).prompt == "p"


def test_entry_point_forms(module):
    name = module(TASKS_MODULE + """
    ONE = Echo("echo-one")
    SUITE = [Echo("echo-a"), Echo("echo-b", source="mine")]
    def suite():
        return (t for t in [Echo("echo-c")])
    """)
    one, = load_entry_point(f"{name}:ONE")
    assert one.name == "echo-one" and one.source == f"{name}:ONE"
    tasks = load_entry_point(f"{name}:SUITE")
    assert [(t.name, t.source) for t in tasks] == [("echo-a", f"{name}:SUITE"), ("echo-b", "mine")]
    made, = load_entry_point(f"{name}:suite")
    assert (made.name, made.source) == ("echo-c", f"{name}:suite")
    assert made.reward(made.problem(7), "7") == 1.0


def test_bad_entry_points(module):
    name = module(TASKS_MODULE + """
    NUMBER = 3
    def text():
        return "arithmetic"
    EMPTY = []
    MIXED = [Echo("x"), 5]
    TWICE = [Echo("same"), Echo("same")]
    NAMELESS = Echo("")
    """)
    cases = [
        ("no_such_pkg_xyz.tasks:suite", r"entry point no_such_pkg_xyz.tasks:suite: module no_such_pkg_xyz.tasks "
                                        r"cannot be imported .*\(pip install -e .*PYTHONPATH"),
        (f"{name}:missing", f"entry point {name}:missing: module {name} has no attribute 'missing'"),
        (f"{name}:NUMBER", f"entry point {name}:NUMBER gave int 3, not tasks — make it a VerifiableTask"),
        (f"{name}:text", f"entry point {name}:text gave str 'arithmetic', not tasks"),
        (f"{name}:EMPTY", f"entry point {name}:EMPTY gave no tasks"),
        (f"{name}:MIXED", f"entry point {name}:MIXED: element 1 is int 5, not a VerifiableTask"),
        (f"{name}:TWICE", f"entry point {name}:TWICE: two tasks are named 'same'"),
        (f"{name}:NAMELESS", f"entry point {name}:NAMELESS: task .* has no name"),
        ("not an entry point", "entry point 'not an entry point' is not package.module:attribute"),
    ]
    for spec, message in cases:
        with pytest.raises(GraftkitError, match=message):
            load_entry_point(spec)


def test_registry_resolves_files_and_entry_points(tmp_path, module):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = write(tmp_path / "a", "quiz.jsonl", ITEMS[:2])
    assert registry.resolve_source(first) == ["quiz"] and registry.resolve_source(first) == ["quiz"]
    assert registry.lookup("quiz").source.startswith(str((tmp_path / "a" / "quiz.jsonl").resolve()))
    assert registry.resolve_source("quiz") == ["quiz"] and registry.is_verifiable("quiz")
    with pytest.raises(GraftkitError, match="task name 'quiz' from .*b.quiz.jsonl .* is already taken by .*a.quiz"):
        registry.resolve_source(write(tmp_path / "b", "quiz.jsonl", ITEMS[2:]))
    name = module(TASKS_MODULE + "    SUITE = [Echo('ep-one'), Echo('ep-two')]\n")
    assert registry.resolve_source(f"{name}:SUITE") == ["ep-one", "ep-two"]
    assert registry.lookup("ep-two").source == f"{name}:SUITE"
    assert set(registry.registered()) == {"quiz", "ep-one", "ep-two"}


def test_problem_env_plays_a_jsonl_item(tmp_path):
    task = load_jsonl(write(tmp_path, "env.jsonl", ITEMS))
    env = ProblemEnv(task)
    seed = next(s for s in range(4) if task.problem(s).data["index"] == 1)  # the numeric item
    obs = env.reset(seed)
    assert obs.utterance == ITEMS[1]["prompt"] and not obs.empty
    obs, reward, done = env.step("<answer>3.142</answer>")
    assert (reward, done, env.success, obs.empty, obs.process) == (1.0, True, True, True, 1.0)
    env.reset(seed)
    obs, reward, done = env.step("<answer>3</answer>")
    assert (reward, done, env.success, obs.process) == (0.0, True, False, 0.0)
    assert env.demonstration(env.reset(seed)) == ["<answer>3.14</answer>"]
    assert isinstance(task, VerifiableTask)
