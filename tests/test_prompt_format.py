"""The trainer's prompt format: system message, template and answer format, set by a task file's items or a
command's flags, read the same way by every command that plays verifiable tasks — and a file of items played whole,
with the share of outputs that parsed stated beside every score."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.results.store import read_result
from graftkit.verifiable import registry
from graftkit.verifiable.format import PromptFormat, answer_format

runner = CliRunner()


@pytest.fixture
def clean_registry():
    registry._REGISTERED.clear()
    registry._FORMATTED.clear()
    yield
    registry._REGISTERED.clear()
    registry._FORMATTED.clear()


def _run(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return runner.invoke(app, [str(a) for a in args])


def _file(tmp_path, name: str, rows: list[dict]):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------------ answer formats


@pytest.mark.parametrize("spec, text, want", [
    ("tags", "so <answer>1</answer> no, <answer> 42 </answer>", "42"),
    ("tags", "42", None),
    ("last-number", "3 apples and 4 pears make 7.", "7"),
    ("last-number", "The total is 1,234,567 dollars", "1234567"),
    ("last-number", "it drops to -3.5 then", "-3.5"),
    ("last-number", "no digits here", None),
    ("boxed", r"first \boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    ("boxed", r"\boxed{unclosed", None),
    ("whole", "  tac \n", "tac"),
    ("whole", "   ", None),
    ("regex:#### (.+)", "reasoning\n#### 18", "18"),
    ("regex:[0-9]+", "a 1 b 22", "22"),
    ("regex:#### (.+)", "no marker", None),
])
def test_each_answer_format_reads_what_it_names(spec, text, want):
    assert answer_format(spec).read(text) == want


@pytest.mark.parametrize("spec", ["tags", "last-number", "boxed", "whole"])
def test_a_format_reads_back_the_answer_it_writes(spec):
    fmt = answer_format(spec)
    for answer in ("42", "-7", "1234"):
        assert fmt.read(fmt.state(answer)) == answer


def test_a_function_format_runs_only_the_module_it_names(tmp_path, monkeypatch):
    (tmp_path / "my_reader.py").write_text("def read(text):\n    return text.split('=')[-1] if '=' in text else None\n"
                                           "def bad(text):\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert answer_format("my_reader:read").read("x = 12") == "12"
    with pytest.raises(GraftkitError, match="returned int 3, not a string or None"):
        answer_format("my_reader:bad").read("x")
    assert answer_format("my_reader:read").state("12") is None  # a function reads answers but writes none


@pytest.mark.parametrize("spec, message", [("digits", "is not an answer format"), ("regex:(", "not a regular"),
                                           ("regex:", "the pattern is empty"),
                                           ("no_such_module_q:f", "cannot be imported")])
def test_a_bad_answer_format_is_one_error_naming_the_flag(spec, message):
    with pytest.raises(GraftkitError, match=message) as info:
        answer_format(spec)
    assert "--answer-format" in info.value.what


# ------------------------------------------------------------------------------------------ prompts


@pytest.fixture(scope="module")
def chat_policy():
    from chat_models import chat_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from graftkit.agent import Policy

    tok = chat_tokenizer("smollm2")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    return Policy(LlamaForCausalLM(cfg).eval(), tok)


def _text(policy, ids) -> str:
    return policy.tokenizer.decode(ids)


def test_each_template_writes_the_prompt_the_trainer_wrote(chat_policy):
    p = chat_policy
    chat = _text(p, p.problem_ids("What is 1 + 2?", "Answer briefly."))
    assert chat == ("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # no system message: the template's own default, as TRL renders a conversation without one
    assert "SmolLM" in _text(p, p.problem_ids("What is 1 + 2?", ""))
    assert _text(p, p.problem_ids("What is 1 + 2?", "Answer briefly.", "plain")) == \
        "<|im_start|>Answer briefly.\nWhat is 1 + 2?\nanswer:"  # plain: graftkit's format after the BOS token
    raw = p.problem_ids("Q: What is 1 + 2?\nA:", None, "raw")
    assert _text(p, raw) == "Q: What is 1 + 2?\nA:" and raw == p.tokenizer("Q: What is 1 + 2?\nA:",
                                                                            add_special_tokens=False)["input_ids"]
    conv = [{"role": "system", "content": "S."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
            {"role": "user", "content": "What is 2?"}]
    assert _text(p, p.problem_ids(conv, "ignored")) == p.tokenizer.apply_chat_template(conv, add_generation_prompt=True,
                                                                                       tokenize=False)


def test_the_chat_template_is_refused_for_a_tokenizer_without_one():
    from graftkit.agent import tiny_policy, tiny_words

    p = tiny_policy(tiny_words(("arithmetic",)), "nano")
    with pytest.raises(GraftkitError, match="--template chat: the tokenizer of .* has no chat template"):
        p.problem_ids("What is 1 + 2?", "S", "chat")
    assert p.tokenizer.decode(p.problem_ids("What is 1 + 2?", "S", "auto")) == \
        p.tokenizer.decode(p.problem_ids("What is 1 + 2?", "S", "plain"))


def test_a_file_carries_each_items_system_message_conversation_and_answer_format(tmp_path, clean_registry):
    from graftkit.agent import resolve_tasks
    from graftkit.verifiable import lookup

    path = _file(tmp_path, "trl.jsonl", [
        {"prompt": "What is 2 + 2?", "answer": 4, "verifier": "numeric", "system": "Think, then give a number."},
        {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 3 + 3?"}],
         "answer": 6, "verifier": "numeric", "answer_format": "last-number"},
        {"prompt": "What is 4 + 4?", "answer": 8, "system": None},
    ])
    (name,) = resolve_tasks(str(path))
    task = lookup(name)
    p = [task.problem(i) for i in range(3)]
    assert task.conversation(p[0]) == [{"role": "system", "content": "Think, then give a number."},
                                       {"role": "user", "content": "What is 2 + 2?"}]
    assert task.conversation(p[1]) == [{"role": "system", "content": "Be terse."},
                                       {"role": "user", "content": "What is 3 + 3?"}]
    assert task.conversation(p[2]) == [{"role": "user", "content": "What is 4 + 4?"}]
    assert task.reward(p[1], "three and three is 6") == 1.0 and task.reward(p[0], "it is 4") == 0.0
    assert task.reward(p[0], "<answer>4</answer>") == 1.0  # the file's default: tags
    assert task.solution(p[1]) == "6" and task.solution(p[0]) == "<answer>4</answer>"


def test_a_commands_format_reaches_every_lookup_and_the_default_restores_the_tasks_own(clean_registry):
    from graftkit.agent import resolve_tasks
    from graftkit.verifiable import lookup

    resolve_tasks("arithmetic-2", PromptFormat(system="", template="raw", answer="last-number"))
    task = lookup("arithmetic-2")
    prob = task.problem(0)
    assert task.template == "raw" and task.conversation(prob) == [{"role": "user", "content": prob.prompt}]
    assert task.reward(prob, f"The sum is {prob.answer}.") == 1.0
    assert task.parseable("no number", prob) is False and task.parseable("=5", prob) is True
    resolve_tasks("arithmetic-2", PromptFormat())
    task = lookup("arithmetic-2")
    assert task.template == "auto" and task.reward(prob, f"The sum is {prob.answer}.") == 0.0
    assert task.reward(prob, f"<answer>{prob.answer}</answer>") == 1.0


# ------------------------------------------------------------------------------------------ a file played whole


def _sums(tmp_path, n: int):
    return _file(tmp_path, f"sums{n}.jsonl", [{"prompt": f"What is {i} + 1?", "answer": i + 1, "verifier": "numeric"}
                                               for i in range(n)])


@pytest.mark.parametrize("seeds, episodes, distinct", [(16, 4, 64), (64, 1, 64), (8, 4, 32), (20, 4, 64)])
def test_a_users_file_is_played_whole_when_seeds_times_episodes_cover_it(tmp_path, clean_registry, seeds, episodes,
                                                                         distinct):
    from graftkit.agent import resolve_tasks
    from graftkit.agent.evaluate import plan_episodes
    from graftkit.verifiable.user import coverage, coverage_note

    (name,) = resolve_tasks(str(_sums(tmp_path, 64)))
    _, _, items, _ = plan_episodes([name], list(range(seeds)), episodes, "heldout", whole=(name,))
    cov = coverage(items[0], 64)
    assert cov["distinct"] == distinct and cov["episodes"] == seeds * episodes
    note = coverage_note(name, cov, seeds, episodes)
    if distinct < 64:
        assert note == f"{name}: 32 of the file's 64 items played (8 seeds × 4 episodes); pass --seeds 16 " \
                       "(seeds × episodes ≥ 64) to play every item"
    elif seeds * episodes == 64:
        assert note == f"{name}: the whole file played, 64 items, each once"
    else:
        assert note == f"{name}: the whole file played, 64 items, each 1 or 2 times (80 episodes over 64 items)"


def test_eval_states_the_file_coverage_and_the_parse_rate_and_warns_when_nothing_parsed(tmp_path, monkeypatch,
                                                                                       clean_registry):
    from graftkit.agent import resolve_tasks, tiny_policy, tiny_words
    from graftkit.weights import save_model

    path = _sums(tmp_path, 12)
    (name,) = resolve_tasks(str(path))
    p = tiny_policy(tiny_words((name,)), "nano", seed=1)
    folder = save_model(tmp_path / "raw", p.model, p.tokenizer, provenance={"producer": "test"})
    base = ["eval", "--model", folder, "--tasks", path, "--seeds", "3", "--episodes", "4", "--max-new-tokens", "3"]
    res = _run([*base, "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    row = out["tasks"][0]
    assert row["items"] == 12 and row["file_items"] == 12 and row["parsed"] == 0.0  # an untrained policy: no tags
    assert any("--answer-format" in n for n in out["notes"])
    assert f"{name}: the whole file played, 12 items, each once" in out["notes"]
    stored = read_result(out["files"]["model"])
    assert stored.attrs["prompt_formats"][name]["answer_format"] == "tags" and stored.attrs["file_items"] == {name: 12}
    # the same episodes read as whole completions: every output parses, and nothing warns
    res = _run([*base, "--answer-format", "whole", "--json"], tmp_path, monkeypatch)
    out = json.loads(res.stdout)
    assert out["tasks"][0]["parsed"] == 1.0 and not any("--answer-format" in n for n in out["notes"])
    assert read_result(out["files"]["model"]).attrs["prompt_formats"][name]["answer_format"] == "whole"
    # the table shows what --json holds
    res = _run(base, tmp_path, monkeypatch)
    table = " ".join(res.output.split())
    assert "12/12" in table and "parsed" in table and " 0% " in table


def test_a_mostly_unparsed_evaluation_is_said_in_one_line_and_a_mostly_parsed_one_is_not():
    from graftkit.evaluation.commands import EvalResult

    def planted(share: float, problem: bool = True):
        shape = (1, 4, 1, 1)
        invalid = np.zeros(shape, np.int32)
        invalid.ravel()[: round(4 * share)] = 1
        attrs = {"invalid_outputs": {"sums": [["I think it is five", 3]]},
                 **({"task_sources": {"sums": "f.jsonl"}, "prompt_formats": {"sums": {"answer_format": "tags"}}}
                    if problem else {})}
        return EvalResult(("sums",), np.arange(4), np.zeros(shape, np.int8), np.zeros(shape), np.ones(shape, np.int32),
                          invalid, attrs, None)

    said = planted(0.75).action_notes()
    assert said == ["sums: 75% of completions stated no answer in the answer format tags (most common: "
                    "'I think it is five'); pass --answer-format (tags, last-number, boxed, whole, regex:PATTERN or "
                    "module:function) and, for the trainer's prompt, --template and --system"]
    assert planted(0.25).action_notes() == [] and planted(0.5).action_notes() == []
    assert planted(1.0).action_notes()[0].startswith("0% on every task because no completion stated")
    assert "did not parse as an action" in planted(0.75, problem=False).action_notes()[0]
