"""Single-turn verifiable tasks: the built-in generators and verifiers, their process scores, the one-turn
environment, and every command that evaluates or trains taking them beside the web tasks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from graftkit.agent import Decode, Policy, evaluate, resolve_tasks, rollout, task_words, tiny_policy, tiny_words
from graftkit.agent.evaluate import plan_episodes
from graftkit.agent.tasks import is_problem, make_task_env, task_spec
from graftkit.core.errors import GraftkitError
from graftkit.verifiable import (
    Arithmetic,
    Countdown,
    Multiples,
    ProblemEnv,
    Problem,
    VerifiableTask,
    evaluate_expression,
    extract_answer,
    lookup,
    parse_number,
)
from graftkit.verifiable.builtin import solutions_are_right
from graftkit.webenv.items import is_heldout


# ------------------------------------------------------------------------------------------ answers


@pytest.mark.parametrize("text, want", [
    ("<answer>42</answer>", "42"),
    ("< answer > 42 < / answer >", "42"),  # a word-level tokenizer's spacing
    ("thinking... <answer>1</answer> then <ANSWER> 7 </ANSWER>", "7"),  # the last one counts
    ("<answer>\n3 + 4\n</answer>", "3 + 4"),
    ("42", None),
    ("<answer>42", None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


@pytest.mark.parametrize("text, want", [("1,234", 1234.0), (" +12 ", 12.0), ("-3.5", -3.5), ("12a", None),
                                        ("nan", None), ("inf", None), (None, None), ("", None)])
def test_parse_number(text, want):
    assert parse_number(text) == want


# -------------------------------------------------------------------------------------- the built-ins


@pytest.mark.parametrize("name", ["arithmetic", "arithmetic-5", "multiply", "multiply-3", "countdown", "countdown-4",
                                  "multiples", "multiples-10"])
def test_every_demonstrated_solution_scores_one_and_problems_are_seeded(name):
    task = lookup(name)
    assert solutions_are_right(task, 300)
    assert task.problem(7) == task.problem(7)  # a pure function of the seed
    prompts = {task.problem(s).prompt for s in range(300)}
    assert len(prompts) > 250  # a large item space
    p = task.problem(3)
    assert task.reward(p, "no answer here") == 0.0 and task.process(p, "no answer here") == 0.0


def test_arithmetic_verifier_and_column_process_score():
    task = Arithmetic(name="arithmetic", digits=3)
    p = task.problem(11)
    a, b = p.data["a"], p.data["b"]
    assert p.prompt == f"What is {a} + {b}?" and p.answer == str(a + b)
    assert task.reward(p, f"<answer>{a + b}</answer>") == 1.0
    assert task.reward(p, f"<answer>{a + b + 1}</answer>") == 0.0
    # columns right to left: 996 vs 906 has the units and hundreds right, the tens wrong
    q = Problem("arithmetic", "What is 837 + 159?", "996", {"value": 996})
    assert task.process(q, "<answer>906</answer>") == pytest.approx(2 / 3)
    assert task.process(q, "<answer>96</answer>") == pytest.approx(2 / 3)  # a dropped column counts wrong
    assert task.process(q, "<answer>1996</answer>") == pytest.approx(3 / 4)
    assert task.process(q, "<answer>-996</answer>") == 0.0
    mul = lookup("multiply-2").problem(0)
    assert mul.data["value"] == mul.data["a"] * mul.data["b"]


def test_countdown_uses_every_number_once_and_executes_nothing():
    task = Countdown(name="countdown", count=3)
    p = Problem("countdown", "", "(3 + 4) * 5", {"numbers": [3, 4, 5], "target": 35})
    assert task.reward(p, "<answer>(3 + 4) * 5</answer>") == 1.0
    assert task.reward(p, "<answer>( 4 + 3 ) × 5 = 35</answer>") == 1.0  # × and a stated result are read
    assert task.reward(p, "<answer>(3 + 4) * 5 * 1</answer>") == 0.0  # 1 is not a given number
    assert task.reward(p, "<answer>7 * 5</answer>") == 0.0  # numbers must be the given ones
    assert task.reward(p, "<answer>3 * 4 + 5</answer>") == 0.0 and task.process(p, "<answer>3 * 4 + 5</answer>") == \
        pytest.approx(1 - 18 / 35)
    assert task.reward(p, "<answer>__import__('os').system('true')</answer>") == 0.0
    assert evaluate_expression("__import__('os')") is None
    assert evaluate_expression("2 ** 100") is None  # no power: an expression is bounded
    assert evaluate_expression("(8 - 2) / 4") == (Fraction(3, 2), [8, 2, 4])
    assert evaluate_expression("1 / 0") is None
    for s in range(50):  # generated targets are positive integers reachable as stated
        q = task.problem(s)
        assert 1 <= q.data["target"] <= 999 and sorted(q.data["numbers"]) == sorted(
            evaluate_expression(q.answer)[1])


def test_multiples_has_several_answers_and_an_unequal_demonstrator():
    task = Multiples(name="multiples", count=6)
    for s in range(100):
        p = task.problem(s)
        answers = task.answers(p)
        d, lo, hi = p.data["d"], p.data["lo"], p.data["hi"]
        assert answers == tuple(str(x) for x in range(lo, hi + 1) if x % d == 0) and len(answers) == 6
        assert all(task.reward(p, f"<answer>{x}</answer>") == 1.0 for x in answers)
        assert task.reward(p, f"<answer>{int(answers[0]) + d * 6}</answer>") == 0.0
        assert task.process(p, f"<answer>{int(answers[-1]) + d}</answer>") == 0.5  # a multiple above the range
        assert task.process(p, f"<answer>{lo + 1 if (lo + 1) % d else lo + 2}</answer>") == 0.5  # in it, no multiple
        assert task.process(p, f"<answer>{hi + 1 if (hi + 1) % d else hi + 2}</answer>") == 0.0
    picks = [extract_answer(task.solution(task.problem(s))) == task.answers(task.problem(s))[0] for s in range(400)]
    assert 0.4 < np.mean(picks) < 0.65  # the smallest answer about half the time (weights 2^-i)


def test_difficulty_knob_is_bounded_and_names_are_checked():
    assert lookup("arithmetic-4").digits == 4 and lookup("countdown-5").count == 5
    with pytest.raises(GraftkitError, match="outside 2..5"):
        lookup("countdown-9")
    with pytest.raises(GraftkitError, match="unknown verifiable task"):
        lookup("calculus")


# ------------------------------------------------------------------------------ the one-turn episode


def test_problem_env_plays_one_turn_and_reports_process_as_progress():
    env = make_task_env("arithmetic")
    obs = env.reset(5)
    p = lookup("arithmetic").problem(5)
    assert obs.utterance == p.prompt and not obs.empty and not env.done
    wrong = str(int(p.answer) + 10)
    step = env.step(f"<answer>{wrong}</answer>")
    assert step.done and step.reward == 0.0 and step.observation.empty and not env.success
    spec = task_spec("arithmetic")
    assert spec.max_steps == 1
    assert spec.progress(obs, step.observation, 0.0, True) == pytest.approx(lookup("arithmetic").process(
        p, f"<answer>{wrong}</answer>"))
    with pytest.raises(GraftkitError, match="after the episode ended"):
        env.step("<answer>1</answer>")
    env.reset(5)
    assert env.step(f"<answer>{p.answer}</answer>").reward == 1.0 and env.success


class _Broken(VerifiableTask):
    name = "broken"

    def problem(self, seed):
        return Problem("broken", f"q{seed}", "a")

    def reward(self, problem, completion):
        return 2.0


def test_a_verifier_outside_zero_one_is_one_clear_error():
    env = ProblemEnv(_Broken())
    env.reset(0)
    with pytest.raises(GraftkitError, match=r"verifier returned 2.0, not a score in \[0, 1\]"):
        env.step("x")


def test_heldout_items_of_a_problem_task_never_meet_training_items():
    tasks, env_seed, item, dropped = plan_episodes(["arithmetic"], [0, 1, 2], 20)
    assert tasks == ["arithmetic"] and not dropped
    assert all(is_heldout(i) for i in item.ravel())
    _, _, train_items, _ = plan_episodes(["arithmetic"], [0, 1, 2], 20, items="train")
    assert not set(item.ravel()) & set(train_items.ravel())
    assert len(set(item.ravel())) == 60  # 60 distinct problems


def test_resolve_tasks_mixes_both_kinds_and_names_every_choice_on_a_typo():
    assert resolve_tasks("click-tab,arithmetic,countdown-4") == ["click-tab", "arithmetic", "countdown-4"]
    assert is_problem("countdown-4") and not is_problem("click-tab")
    with pytest.raises(GraftkitError) as e:
        resolve_tasks("arithmatic")
    assert "arithmetic, multiply, countdown, multiples" in e.value.fix and "click-tab" in e.value.fix


def test_web_vocabulary_is_unchanged_by_the_problem_tasks():
    assert tiny_words(("click-tab",)) == task_words()
    words = tiny_words(("arithmetic",))
    assert {"What", "is", "+", "answer", "<", "/"} <= set(words) and "Instruction" not in words
    assert not any(c.isdigit() for w in words for c in w)  # numbers are written digit by digit
    policy = tiny_policy(words, "nano")
    assert policy.tokenizer.tokenize("What is 507 + 66?") == ["What", "is", "5", "##0", "##7", "+", "6", "##6", "?"]
    assert "999" in tiny_words(("arithmetic", "click-tab"))  # beside a web task, the web vocabulary's numbers


# ---------------------------------------------------------------------------------------- rollouts


@pytest.fixture(scope="module")
def problem_policy():
    return tiny_policy(tiny_words(("arithmetic", "countdown", "multiples")), "nano", seed=0)


def test_rollout_scores_each_completion_with_the_verifier(problem_policy):
    jobs = [("arithmetic", s, k) for s in range(4) for k in range(2)] + [("countdown", 9, 0)]
    episodes = rollout(problem_policy, jobs, Decode(greedy=False, seed=3, max_new_tokens=12))
    for ep in episodes:
        assert len(ep.turns) == 1 and ep.done
        task = lookup(ep.task)
        text = problem_policy.decode_completion(ep.turns[0].action_ids)
        assert ep.turns[0].action == text
        assert ep.reward == task.reward(task.problem(ep.seed), text)
        assert ep.turns[0].valid == (extract_answer(text) is not None)
        assert ep.turns[0].prompt_ids == problem_policy.problem_ids(task.problem(ep.seed).prompt, task.system)


def test_a_solution_decodes_back_through_the_tiny_tokenizer(problem_policy):
    for name in ("arithmetic", "countdown", "multiples"):
        task = lookup(name)
        p = task.problem(2)
        text = problem_policy.decode_completion(problem_policy.action_ids(task.solution(p)))
        assert task.reward(p, text) == 1.0, text


def test_chat_policy_reads_the_task_system_message(tmp_path):
    from chat_models import chat_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = chat_tokenizer("chatml")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)).eval()
    policy = Policy(model, tok)
    task = lookup("arithmetic")
    text = tok.decode(policy.problem_ids("What is 1 + 2?", task.system))
    assert text == (f"<|im_start|>system\n{task.system}<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    gemma = Policy(model, chat_tokenizer("gemma"))  # no system role: the instruction leads the user turn
    assert f"<start_of_turn>user\n{task.system}\n\nWhat is 1 + 2?<end_of_turn>" in gemma.tokenizer.decode(
        gemma.problem_ids("What is 1 + 2?", task.system))


def test_evaluate_on_problems_pairs_and_counts_unparseable(problem_policy):
    decode = Decode(max_new_tokens=8)
    out = evaluate(problem_policy, ["arithmetic", "multiples"], [0, 1], 5, decode)
    assert out.success.shape == (2, 2, 5, 1) and out.turns.max() == 1
    again = evaluate(problem_policy, ["arithmetic", "multiples"], [0, 1], 5, decode)
    assert (out.item == again.item).all() and (out.success == again.success).all()
    jobs = [(t, int(out.env_seed[a, b, e]), 0) for a, t in enumerate(out.tasks) for b in range(2) for e in range(5)]
    played = rollout(problem_policy, jobs, decode)
    invalid = np.array([not extract_answer(ep.turns[0].action) for ep in played]).reshape(2, 2, 5)
    assert (out.invalid[..., 0] == invalid).all()
    assert (out.success[..., 0] == np.array([ep.success for ep in played]).reshape(2, 2, 5)).all()
