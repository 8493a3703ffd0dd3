"""The Set-of-Marks track: a vision-language policy (tiny random Qwen2-VL), its image prompt, batched
KV-cached decoding with images against ``model.generate``, evaluation and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from graftkit.agent import (
    Decode,
    Policy,
    VisionPolicy,
    evaluate,
    load_policy,
    next_token_logits,
    rollout,
    task_words,
    tiny_policy,
    tiny_vlm_policy,
)
from graftkit.agent.rollout import generate
from graftkit.cli import app
from graftkit.core.errors import GraftkitError
from graftkit.results.store import read_result
from graftkit.webenv import make_env, parse_action
from graftkit.webenv.render import render_elements, render_som, som_marks
from graftkit.weights import is_vision_folder, load_vlm, save_model

runner = CliRunner()


@pytest.fixture(scope="module")
def vlm():
    return tiny_vlm_policy(task_words(), "nano", seed=0)


@pytest.fixture(scope="module")
def saved(vlm, tmp_path_factory):
    root = tmp_path_factory.mktemp("som")
    text = tiny_policy(task_words(), "nano", seed=0)
    return {
        "vlm": save_model(root / "vlm", vlm.model, processor=vlm.processor, provenance={"producer": "test"}),
        "text": save_model(root / "text", text.model, text.tokenizer, provenance={"producer": "test"}),
    }


def _prompts(policy, tasks=("click-button", "enter-text", "click-checkboxes"), seeds=2):
    prompts, vision = [], []
    for task in tasks:
        env = make_env(task)
        for seed in range(seeds):
            ids, v = policy.som_prompt(env.reset(seed), ["click(3)"] * seed)
            prompts.append(ids)
            vision.append(v)
    return prompts, vision


def test_tiny_vlm_saves_with_its_processor_and_loads_back_identically(vlm, saved):
    folder = saved["vlm"]
    assert (folder / "preprocessor_config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert is_vision_folder(folder) and not is_vision_folder(saved["text"])
    model, processor = load_vlm(folder)
    back = VisionPolicy(model, processor.tokenizer, folder, processor=processor)
    assert back.image_token_id == vlm.image_token_id == model.config.image_token_id
    obs = make_env("click-checkboxes").reset(4)
    (ids_a, vis_a), (ids_b, vis_b) = vlm.som_prompt(obs, ["click(2)"]), back.som_prompt(obs, ["click(2)"])
    assert ids_a == ids_b and torch.equal(vis_a["pixel_values"], vis_b["pixel_values"])
    for name, t in vlm.model.state_dict().items():
        assert torch.equal(t, model.state_dict()[name]), name
    action = 'type(7, "Zq9 Agustina")'
    assert parse_action(back.decode_action(back.action_ids(action))) == parse_action(action)
    assert isinstance(load_policy(folder, obs="som"), VisionPolicy)
    assert type(load_policy(saved["text"])) is Policy


def test_som_prompt_has_the_image_tokens_and_no_element_list(vlm):
    obs = make_env("click-checkboxes").reset(3)
    ids, vision = vlm.som_prompt(obs, ["click(6)"])
    grid = vision["image_grid_thw"]
    n_image = int(grid.prod()) // 4  # spatial merge 2 × 2
    assert ids.count(vlm.image_token_id) == n_image and 20 <= n_image <= 80  # a few dozen per screenshot
    assert vision["pixel_values"].shape[0] == int(grid.prod())
    assert ids[0] == vlm.tokenizer.bos_token_id
    text = vlm.tokenizer.decode(ids, skip_special_tokens=True)
    assert "Instruction" in text and "previous" in text and "click ( 6 )" in text
    for line in render_elements(obs):  # the element list is in the picture, never in the text
        assert line.split("]")[0] + "]" not in vlm.tokenizer.decode(ids)
    assert "input_checkbox" not in text and "unchecked" not in text
    image, marks = render_som(obs)
    assert [m.ref for m in marks] == [m.ref for m in som_marks(obs)] and image.size == (320, 420)


def test_batched_greedy_with_images_equals_hf_generate_one_prompt_at_a_time(vlm):
    prompts, vision = _prompts(vlm)
    assert len({len(p) for p in prompts}) > 1  # left padding is exercised
    decode = Decode(greedy=True, max_new_tokens=6)
    toks, logps = generate(vlm, prompts, decode, [torch.Generator() for _ in prompts], vision=vision)
    for p, v, t, lp in zip(prompts, vision, toks, logps):
        ids = torch.tensor([p])
        ref = vlm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **vlm.vision_inputs(ids, [v]),
                                 max_new_tokens=6, do_sample=False, pad_token_id=vlm.pad_id,
                                 eos_token_id=sorted(vlm.eos_ids))
        want = ref[0, len(p):].tolist()
        assert t == want[: len(t)] and len(t) == min(len(want), 6)
        # log-probs equal the full-sequence forward's (positions wrong by the M-RoPE offset miss by ≥ 5e-4)
        full = torch.tensor([p + t])
        with torch.no_grad():
            logits = vlm.model(input_ids=full, attention_mask=torch.ones_like(full),
                               **vlm.vision_inputs(full, [v])).logits[0, len(p) - 1 : -1].float()
        ref_lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(t)[:, None])[:, 0]
        assert np.allclose(lp, ref_lp.numpy(), atol=2e-5)
    # the training path re-scores kept turns the same way: a right-padded batch through next_token_logits
    rows = [p + t for p, t in zip(prompts[:3], toks[:3])]
    width = max(map(len, rows))
    ids = torch.tensor([r + [vlm.pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    select = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for i, (p, t) in enumerate(zip(prompts, toks[:3])):
        select[i, len(p) - 1 : len(p) - 1 + len(t)] = True
    with torch.no_grad():
        logits = next_token_logits(vlm.model, ids, mask, select, **vlm.vision_inputs(ids, vision[:3]))
    targets = torch.tensor([x for t in toks[:3] for x in t])
    rescored = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    assert np.allclose(rescored.numpy(), [x for lp in logps[:3] for x in lp], atol=2e-5)


def test_som_rollout_keeps_turns_and_sampling_is_independent_of_batching(vlm):
    jobs = [("click-button", 0, 0), ("click-button", 0, 1), ("click-button", 1, 0)]
    decode = Decode(greedy=False, temperature=1.0, top_p=0.9, max_new_tokens=4, seed=3)
    a = rollout(vlm, jobs, decode, batch_size=3, obs="som")
    b = rollout(vlm, jobs[::-1], decode, batch_size=2, obs="som")[::-1]
    assert [[t.action_ids for t in e.turns] for e in a] == [[t.action_ids for t in e.turns] for e in b]
    for e in a:
        for t in e.turns:
            assert len(t.action_ids) == len(t.logprobs) <= 4
            assert t.prompt_ids.count(vlm.image_token_id) > 0 and t.vision["pixel_values"].ndim == 2
    (e,) = rollout(vlm, [("focus-text", 0, 0)], Decode(greedy=True, max_new_tokens=2), obs="som", keep_vision=False)
    assert all(t.vision is None for t in e.turns)


def test_evaluate_som_shapes_and_text_obs_with_a_vlm(vlm):
    decode = Decode(greedy=True, max_new_tokens=4)
    out = evaluate(vlm, ["click-button", "focus-text"], [0, 1], 1, decode, obs="som", batch_size=3)
    assert out.obs == "som" and out.success.shape == (2, 2, 1, 1) and out.turns.min() >= 1
    again = evaluate(vlm, ["focus-text", "click-button"], [0, 1], 1, decode, obs="som")
    assert np.array_equal(out.success[0], again.success[1]) and np.array_equal(out.turns[1], again.turns[0])
    text = evaluate(vlm, ["click-button"], [0], 2, decode, obs="text")  # a VLM reads the element list too
    assert text.obs == "text" and text.success.shape == (1, 1, 2, 1)
    with pytest.raises(GraftkitError, match="vision-language policy, but .*text-only causal LM"):
        evaluate(tiny_policy(task_words(), "nano"), ["click-button"], [0], 1, decode, obs="som")


def _run(args, tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    return runner.invoke(app, args)


def test_cli_eval_som_json_on_a_saved_tiny_vlm(saved, tmp_path, monkeypatch):
    res = _run(["eval", "--model", str(saved["vlm"]), "--obs", "som", "--tasks", "click-button,focus-text",
                "--seeds", "1", "--episodes", "1", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout)
    assert payload["obs"] == "som" and [r["task"] for r in payload["tasks"]] == ["click-button", "focus-text", "all"]
    stored = read_result(payload["files"]["model"])
    assert stored["success"].shape == (2, 1, 1, 1) and stored.attrs["obs"] == "som"
    res = _run(["eval", "--model", str(saved["vlm"]), "--obs", "text", "--tasks", "click-button", "--seeds", "1",
                "--episodes", "1", "--json"], tmp_path, monkeypatch)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["obs"] == "text"


def test_cli_som_with_a_text_policy_is_one_clear_line(saved, tmp_path, monkeypatch):
    for cmd in (["eval"], ["headroom", "--k", "2"]):
        res = _run([*cmd, "--model", str(saved["text"]), "--obs", "som", "--tasks", "click-button", "--seeds", "1",
                    "--episodes", "1"], tmp_path, monkeypatch)
        assert res.exit_code == 2
        msg = res.output.strip()
        assert len(msg.splitlines()) == 1 and "Traceback" not in msg
        assert str(saved["text"]) in msg and "vision-language policy" in msg and "qwen3" in msg.lower()
    res = _run(["eval", "--model", str(saved["vlm"]), "--obs", "pixels"], tmp_path, monkeypatch)
    assert res.exit_code == 2 and "unknown --obs 'pixels'" in res.output


def test_a_processor_of_another_family_and_plain_positions_work_too(tmp_path):
    """LLaVA: transformers' own processor expands the image token, positions are 1-D (no M-RoPE)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from graftkit.agent import tiny_tokenizer

    tok = tiny_tokenizer(task_words())
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}),
        tokenizer=tok, patch_size=14, vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1)
    cfg = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       image_size=56, patch_size=14),
        text_config=LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
                                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id),
        image_token_id=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1)
    torch.manual_seed(0)
    folder = save_model(tmp_path / "llava", LlavaForConditionalGeneration(cfg).eval(), processor=processor,
                        provenance={"producer": "test"})
    policy = load_policy(folder, obs="som")
    assert isinstance(policy, VisionPolicy) and not policy.mrope
    prompts, vision = _prompts(policy, tasks=("click-button", "enter-text"), seeds=2)
    assert all(p.count(policy.image_token_id) == 16 for p in prompts)  # (56 / 14)² patches
    toks, _ = generate(policy, prompts, Decode(max_new_tokens=5), [torch.Generator() for _ in prompts], vision=vision)
    for p, v, t in zip(prompts, vision, toks):
        ids = torch.tensor([p])
        ref = policy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **policy.vision_inputs(ids, [v]),
                                    max_new_tokens=5, do_sample=False, pad_token_id=policy.pad_id,
                                    eos_token_id=sorted(policy.eos_ids))
        assert t == ref[0, len(p):].tolist()[: len(t)]
