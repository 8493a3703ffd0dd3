"""Chat models as policies: real chat templates on a byte-level BPE, through every agent-side command."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from chat_models import STYLES, chat_model_folder
from graftkit.agent import Decode, generate, load_policy
from graftkit.agent.evaluate import evaluate, shown_output
from graftkit.agent.policy import SYSTEM
from graftkit.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    return {s: chat_model_folder(root / s, s) for s in STYLES}


@pytest.mark.parametrize("style", list(STYLES))
def test_prompt_is_the_templates_conversation_and_actions_end_the_turn(folders, style):
    p = load_policy(folders[style])
    tok, end = p.tokenizer, STYLES[style]["end_of_turn"]
    text = tok.decode(p.prompt_ids("button ONE", ["click(1)"]))
    assert "button ONE\nprevious: click(1)\naction:" in text and SYSTEM in text
    assert text.endswith({"chatml": "<|im_start|>assistant\n", "smollm2": "<|im_start|>assistant\n",
                          "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                          "gemma": "<start_of_turn>model\n"}[style])
    # Gemma refuses a system role: the instruction goes into the user turn instead
    assert p.system_role is (style != "gemma")
    assert ("<start_of_turn>system" not in text) if style == "gemma" else True
    # the training target ends with the token the template closes an assistant turn with, which is not
    # the eos token for a Llama-3 base config; decoding stops there
    assert tok.convert_ids_to_tokens(p.turn_end_id) == end and p.turn_end_id in p.eos_ids
    for action in ("click(12)", 'type(3, "Agustina Zq")'):
        ids = p.action_ids(action)
        assert ids[-1] == p.turn_end_id and p.decode_action(ids) == action.replace(", ", ",")


def test_batched_left_padded_decoding_equals_one_prompt_at_a_time(folders):
    p = load_policy(folders["llama3"])
    prompts = [p.prompt_ids("button ONE", []), p.prompt_ids("a much longer page: link two, button three, tab four", ["click(2)"])]
    decode = Decode(greedy=False, temperature=1.0, max_new_tokens=6, seed=3)

    def gens():
        return [torch.Generator().manual_seed(i) for i in range(2)]

    together = generate(p, prompts, decode, gens())
    alone = [generate(p, [q], decode, [g]) for q, g in zip(prompts, gens())]
    assert together[0] == [alone[0][0][0], alone[1][0][0]]
    for got, want in zip(together[1], (alone[0][1][0], alone[1][1][0])):
        assert got == pytest.approx(want, abs=1e-4)


def test_evaluation_keeps_what_an_untrained_model_wrote(folders):
    p = load_policy(folders["chatml"])
    out = evaluate(p, ["click-button"], [0, 1], 1, Decode(max_new_tokens=8))
    assert out.invalid.sum() == out.turns.sum() > 0  # a random model writes no action
    (text, count), *_ = out.invalid_outputs["click-button"]
    assert count >= 1 and text == shown_output(text) and len(text) <= 80
    assert shown_output("") == "(empty)" and shown_output("a  b\nc") == "a b c"
    assert shown_output("x" * 200).endswith("…") and len(shown_output("x" * 200)) == 80


def _cli(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("style", list(STYLES))
def test_every_agent_command_runs_on_a_chat_model(folders, style, tmp_path, monkeypatch):
    model, ep = str(folders[style]), ["--tasks", "click-button,click-link", "--seeds", "2", "--episodes", "1"]
    ev = _cli(["eval", "--model", model, *ep], tmp_path, monkeypatch)
    assert [r["task"] for r in ev["tasks"]] == ["click-button", "click-link", "all"]
    # an untrained model writes no action: every turn unparseable, said in one line with what it wrote
    assert all(r["unparseable"] == 1.0 for r in ev["tasks"]) and ev["tasks"][0]["top_invalid"]
    said = [n for n in ev["notes"] if "no turn parsed as an action" in n]
    assert len(said) == 1 and said[0].startswith("0% on every task") and "train sft --init" in said[0]
    hr = _cli(["headroom", "--model", model, "--k", "2", *ep], tmp_path, monkeypatch)
    assert {r["task"] for r in hr["tasks"]} >= {"click-button", "click-link"}
    assert all(r["unparseable"] == 1.0 and r["top_invalid"] for r in hr["tasks"])
    assert any("no turn parsed as an action" in n for n in hr["notes"])
    sft = tmp_path / "sft"
    _cli(["train", "sft", "--init", model, "--out", str(sft), "--steps", "3", "--batch-size", "4",
          "--tasks", "click-button", "--threads", "1"], tmp_path, monkeypatch)
    assert load_policy(sft).turn_end_id == load_policy(folders[style]).turn_end_id  # the template travels
    rl = tmp_path / "rl"
    _cli(["train", "grpo", "--init", str(sft), "--out", str(rl), "--steps", "2", "--prompts-per-step", "1",
          "--group-size", "2", "--tasks", "click-button", "--max-new-tokens", "8"], tmp_path, monkeypatch)
    g = _cli(["graft", "--from", str(rl), "--base", str(sft), "--groups", "attn", "--eval", "--seeds", "2",
              "--tasks", "click-button", "--episodes", "1"], tmp_path, monkeypatch)
    assert g["runs"]["A"]["configs"]


def _planted(invalid_share: dict[str, float]):
    import numpy as np

    from graftkit.evaluation.commands import EvalResult

    tasks = tuple(invalid_share)
    shape = (len(tasks), 2, 1, 1)
    turns = np.full(shape, 4, np.int32)
    invalid = np.stack([np.full(shape[1:], round(4 * invalid_share[t]), np.int32) for t in tasks])
    success = np.zeros(shape, np.int8)
    attrs = {"invalid_outputs": {t: [["The instruction is invalid.", 5]] for t in tasks if invalid_share[t]}}
    return EvalResult(tasks, np.arange(2), success, np.zeros(shape), turns, invalid, attrs, None)


def test_a_model_that_never_writes_an_action_is_named_in_one_line():
    every = _planted({"click-button": 1.0, "click-link": 1.0}).action_notes()
    assert len(every) == 1 and every[0].startswith("0% on every task") and "'The instruction is invalid.'" in every[0]
    some = _planted({"click-button": 1.0, "click-link": 0.5})
    assert some.action_notes() == ["click-button: 0% because no turn parsed as an action (most common output: "
                                   "'The instruction is invalid.')"]
    assert some.unparseable("click-link") == 0.5 and some.unparseable() == 0.75
    assert _planted({"click-button": 0.25}).action_notes() == []
