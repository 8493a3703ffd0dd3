"""Tiny random chat models as users bring them: a byte-level BPE tokenizer (trained here, on web-task text,
with the ``tokenizers`` library) carrying a real chat template, and a tiny random Llama over it, saved as an
HF folder. Nothing is downloaded.

Styles (the Jinja templates are those the model families ship, shortened only where they branch on tools):

- ``chatml``: Qwen2's ChatML (``<|im_start|>role ... <|im_end|>``, a default system message);
- ``smollm2``: SmolLM2-Instruct's ChatML (its own default system message; bos ``<|im_start|>``, eos and pad
  ``<|im_end|>``);
- ``llama3``: Llama 3's headers (``<|start_header_id|>role<|end_header_id|>``, ``<|eot_id|>``, bos
  ``<|begin_of_text|>``, eos ``<|end_of_text|>`` as a base model's config has it: the turn ends with a token
  that is not the eos token);
- ``gemma``: Gemma's turns (``<start_of_turn>user``, ``<end_of_turn>``), which refuse a system role.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{- bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else "
    "message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

STYLES = {
    "chatml": dict(template=CHATML, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                   bos=None, eos="<|im_end|>", pad="<|endoftext|>", end_of_turn="<|im_end|>"),
    "smollm2": dict(template=SMOLLM2, specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                    bos="<|im_start|>", eos="<|im_end|>", pad="<|im_end|>", end_of_turn="<|im_end|>"),
    "llama3": dict(template=LLAMA3, specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                              "<|end_header_id|>", "<|eot_id|>"],
                   bos="<|begin_of_text|>", eos="<|end_of_text|>", pad=None, end_of_turn="<|eot_id|>"),
    "gemma": dict(template=GEMMA, specials=["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
                  bos="<bos>", eos="<eos>", pad="<pad>", end_of_turn="<end_of_turn>"),
}


@lru_cache(maxsize=1)
def corpus() -> tuple[str, ...]:
    """Text the tokenizer is trained on: prompts and oracle actions of every web task, seeds 0..29."""
    from graftkit.agent.policy import SYSTEM, format_prompt
    from graftkit.webenv import make_env
    from graftkit.webenv.render import render_text
    from graftkit.webenv.tasks import TASKS

    lines = [SYSTEM]
    for task, spec in TASKS.items():
        env = make_env(task)
        for seed in range(30):
            obs = env.reset(seed)
            lines.append(format_prompt(render_text(obs), ["click(1)", "invalid"]))
            lines.extend(spec.oracle(obs))
    return tuple(lines)


def chat_tokenizer(style: str, vocab_size: int = 700):
    """A byte-level BPE tokenizer with ``style``'s special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    s = STYLES[style]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=s["specials"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    kw = {k: s[k] for k in ("bos", "eos", "pad") if s[k] is not None}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": v for k, v in kw.items()},
                                   additional_special_tokens=[t for t in s["specials"] if t not in kw.values()])
    fast.chat_template = s["template"]
    return fast


def chat_model_folder(dest: Path, style: str, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A tiny random Llama with :func:`chat_tokenizer` (``style``), saved with ``save_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = chat_tokenizer(style)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    dest = Path(dest)
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return dest
