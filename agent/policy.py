"""The policy: an HF causal LM and its tokenizer, the prompt it reads and the action it writes.

A turn's prompt is written by its task (``env.spec.prompt(obs, history)``, a :class:`~graftkit.core.env.Prompt`:
a web page's in :mod:`graftkit.webenv.render`, a problem's in :mod:`graftkit.verifiable.format`) and rendered here
into token ids (:meth:`Policy.turn_ids`): through the tokenizer's chat template, or in the plain format for a
tokenizer without one. A web turn's plain prompt::

    <observation text>
    previous: click(3) ; type(5, "Agustina")      (or "previous: none")
    action:

and the model continues with one action string and its end-of-sequence token. With a chat template the
same text is the user message of a one-turn conversation, after a short system message. The action text
is read back with :func:`canonical_action`, which removes the spaces a word-level tokenizer puts around
punctuation (``click ( 8 )`` → ``click(8)``) and nothing else, then parsed by the web tasks' strict
grammar; an output that does not parse is a counted no-op turn.

:func:`tiny_tokenizer` builds the embedded default's tokenizer: word-level over the task vocabulary
(every word the web tasks' generators use), with WordPiece continuation pieces for single characters so
that any typed string still has an exact encoding.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import torch

from ..core.env import Prompt
from ..core.errors import GraftkitError
from ..verifiable.format import format_problem, plain_problem, problem_prompt  # noqa: F401  (re-exported)
from ..webenv.render import SYSTEM, format_prompt, web_prompt  # noqa: F401  (re-exported: the web prompt)

#: End-of-turn tokens of common chat formats (ChatML, Llama 3, Gemma): decoding stops at any of them.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def canonical_action(text: str) -> str:
    """Undo a word-level decoder's spacing: no spaces around ``( ) ,`` outside quotes, none just inside
    the quotes. ``type ( 5 , " John Smith " )`` → ``type(5,"John Smith")``."""
    text = text.strip().split("\n")[0].strip()
    out, last = [], 0
    for m in _QUOTED.finditer(text):
        out.append(re.sub(r"\s*([(),])\s*", r"\1", text[last : m.start()]))
        out.append('"' + m.group(0)[1:-1].strip() + '"')
        last = m.end()
    out.append(re.sub(r"\s*([(),])\s*", r"\1", text[last:]))
    return "".join(out)


@dataclass
class Policy:
    """A causal LM, its tokenizer, and how prompts are built and actions read for it."""

    model: torch.nn.Module
    tokenizer: object
    path: Path | None = None
    engine: object | None = None
    """What decodes its actions: None for graftkit's batched decoder over ``model``, else a
    :class:`~graftkit.agent.engine.VLLMEngine` over the same weights (:func:`graftkit.agent.load.with_engine`)."""

    @property
    def placement(self) -> dict:
        """Where the model runs and in what dtype (what a result records: device, dtype, torch, gpu; with a vLLM
        engine also ``engine`` and ``vllm``, its version; else ``engine: hf``)."""
        from ..core.devices import describe

        if self.engine is not None:
            return dict(self.engine.placement)
        p = next(self.model.parameters())
        return {**describe(p.device, p.dtype), "engine": "hf"}

    def close(self) -> None:
        """Free the policy's engine, if it has one (the model stays)."""
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()

    def __post_init__(self) -> None:
        vocab = self.tokenizer.get_vocab()
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.system_role = True
        self.turn_end_id = self._turn_end() if self.chat else None
        ids = {self.tokenizer.eos_token_id, self.turn_end_id}
        ids.update(vocab[t] for t in END_OF_TURN if t in vocab)
        ids.discard(None)
        if not ids:
            raise GraftkitError("the tokenizer has no end-of-sequence token", "set tokenizer.eos_token")
        self.eos_ids: frozenset[int] = frozenset(ids)

    def _messages(self, text: str, system: str = SYSTEM) -> list[dict]:
        if self.system_role:
            return [{"role": "system", "content": system}, {"role": "user", "content": text}]
        return [{"role": "user", "content": f"{system}\n\n{text}"}]  # a template without a system role

    def _render(self, msgs: list[dict], **kw):
        try:
            return self.tokenizer.apply_chat_template(msgs, **kw)
        except Exception as exc:  # jinja's TemplateError, or the template's own raise_exception
            if not self.system_role or msgs[0]["role"] != "system":
                raise GraftkitError(f"the tokenizer's chat template fails on a two-turn conversation ({exc})"
                                    .splitlines()[0], "fix chat_template in tokenizer_config.json") from None
            self.system_role = False  # e.g. Gemma's template refuses the system role
            return self.tokenizer.apply_chat_template(self._messages(msgs[1]["content"], msgs[0]["content"]) + msgs[2:], **kw)

    def _turn_end(self) -> int | None:
        """The token the chat template writes right after an assistant message (``<|im_end|>``,
        ``<|eot_id|>``, ``<end_of_turn>``...): where an action ends, in training targets and in decoding."""
        mark = "Zq9"
        msgs = [*self._messages("x"), {"role": "assistant", "content": mark}]
        text = self._render(msgs, tokenize=False)
        after = text.split(mark, 1)[1] if mark in text else ""
        specials = sorted({*self.tokenizer.all_special_tokens, *self.tokenizer.get_added_vocab()}, key=len, reverse=True)
        for t in specials:
            if t and after.startswith(t):
                return self.tokenizer.convert_tokens_to_ids(t)
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        pid = self.tokenizer.pad_token_id
        return pid if pid is not None else next(iter(self.eos_ids))

    def prompt_ids(self, observation_text: str, history: Sequence[str]) -> list[int]:
        """A web turn's prompt from its rendered page (:func:`~graftkit.webenv.render.format_prompt`)."""
        return self.turn_ids(web_prompt(observation_text, history))

    def problem_ids(self, prompt: str | Sequence[Mapping[str, str]], system: str | None = None,
                    template: str = "auto") -> list[int]:
        """The prompt of a verifiable problem (:func:`~graftkit.verifiable.format.problem_prompt`): a conversation of
        messages, or the problem's text after ``system`` (none when empty), written in ``template``."""
        return self.turn_ids(problem_prompt(prompt, system, template))

    def turn_ids(self, prompt: Prompt) -> list[int]:
        """The token ids of a turn's prompt, as its task wrote it (``env.spec.prompt(obs, history)``), in its
        template (:data:`graftkit.verifiable.format.TEMPLATES`): through the chat template (``chat``; ``auto`` when
        the tokenizer has one), in the plain format (``plain``; ``auto`` without a chat template), or its text
        exactly as written (``raw``: the messages' contents joined by newlines, no BOS token — TRL's standard
        format)."""
        if prompt.template == "chat" and not self.chat:
            raise GraftkitError(f"--template chat: the tokenizer of {self.path or 'the policy'} has no chat template",
                                "use --template plain or raw (or auto, which picks plain for it)")
        if prompt.template == "raw":
            text = "\n".join(m["content"] for m in prompt.messages)
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.chat and prompt.template in ("auto", "chat"):
            return self._chat_ids([dict(m) for m in prompt.messages])
        return self._plain_ids(prompt.plain)

    def _chat_ids(self, msgs: list[dict]) -> list[int]:
        if not self.system_role and msgs and msgs[0]["role"] == "system":  # a template without a system role
            msgs = self._messages(msgs[1]["content"], msgs[0]["content"]) + msgs[2:]
        ids = self._render(msgs, add_generation_prompt=True, tokenize=True)
        # transformers 5 returns a BatchEncoding (a mapping, not a dict) where 4.x returned a list
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _plain_ids(self, text: str) -> list[int]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        bos = self.tokenizer.bos_token_id
        return ([bos] if bos is not None else []) + list(ids)

    def output_text(self, ids: Sequence[int], reads: str) -> str:
        """The text of an output, read as its task reads it (``env.spec.reads``, :data:`graftkit.core.env.READS`):
        a web action (:meth:`decode_action`), or a problem's whole completion (:meth:`decode_completion`)."""
        return self.decode_completion(ids) if reads == "completion" else self.decode_action(ids)

    def decode_completion(self, ids: Sequence[int]) -> str:
        """A verifiable problem's completion, every line of it, without its end token."""
        return self.tokenizer.decode([i for i in ids if i not in self.eos_ids], skip_special_tokens=True).strip()

    def action_ids(self, action: str) -> list[int]:
        """The target tokens for ``action`` (for supervised training): its tokens and the end token (with a chat
        template, the token the template ends an assistant turn with)."""
        ids = self.tokenizer(action if self.chat else " " + action, add_special_tokens=False)["input_ids"]
        end = self.turn_end_id if self.turn_end_id is not None else self.tokenizer.eos_token_id
        return list(ids) + [min(self.eos_ids) if end is None else end]

    def decode_action(self, ids: Sequence[int]) -> str:
        ids = [i for i in ids if i not in self.eos_ids]
        return canonical_action(self.tokenizer.decode(ids, skip_special_tokens=True))


def next_token_logits(model, ids: torch.Tensor, mask: torch.Tensor, select: torch.Tensor, **vision) -> torch.Tensor:
    """Logits predicting token t+1 at the positions t where ``select [B, L-1]`` is true: ``[N, V]``.

    The decoder runs over every position, but the output head (the largest matrix of a small model)
    only over the selected ones: training on action tokens needs a few logits per sequence, not L.
    ``vision``: the image inputs of a vision-language policy's batch (``VisionPolicy.vision_inputs``);
    then the whole multimodal base model runs (vision tower, merger, decoder with its own positions).
    """
    if vision:
        hidden = model.base_model(input_ids=ids, attention_mask=mask, **vision).last_hidden_state
    else:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, H]
    return model.get_output_embeddings()(hidden[:, :-1][select]).float()


# ------------------------------------------------------------------------------ the tiny default

SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
_CHARS = string.ascii_letters + string.digits + string.punctuation


def tiny_tokenizer(words: Sequence[str]):
    """A word-level tokenizer over ``words`` plus single characters and their continuation pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in (*SPECIALS, *_CHARS, *(f"##{c}" for c in _CHARS), *sorted(set(words))):
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=200))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]"
    )


SIZES = {
    "nano": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "micro": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4),
}


def tiny_policy(words: Sequence[str], size: str = "micro", seed: int = 0, max_positions: int = 1024) -> Policy:
    """A randomly initialised tiny Qwen3 policy with :func:`tiny_tokenizer` (nothing downloaded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if size not in SIZES:
        raise GraftkitError(f"unknown model size {size!r}", f"choose one of {', '.join(SIZES)}")
    tok = tiny_tokenizer(words)
    s = SIZES[size]
    cfg = Qwen3Config(
        vocab_size=len(tok), head_dim=s["hidden_size"] // s["num_attention_heads"],
        max_position_embeddings=max_positions, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **s,
    )
    torch.manual_seed(seed)
    return Policy(Qwen3ForCausalLM(cfg).eval(), tok)


@lru_cache(maxsize=1)
def task_words(seeds: int = 40) -> tuple[str, ...]:
    """The tiny vocabulary: the prompt template's words, the numbers 0–999 (refs), every word of the
    web tasks' word lists, and every word of the rendered observations and oracle actions of seeds
    0..``seeds``-1 of every task (button labels, tab names, instructions)."""
    from tokenizers import pre_tokenizers

    from ..webenv import make_env
    from ..webenv.render import render_text
    from ..webenv.tasks import TASKS
    from ..webenv.words import ui_utils

    split = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    words: set[str] = {str(i) for i in range(1000)}

    def add(text: str) -> None:
        words.update(w for w, _ in split.pre_tokenize_str(text))

    for values in ui_utils().values():
        for v in values if isinstance(values, (list, tuple)) else [values]:
            add(str(v))
    add(format_prompt("", ["click(1)", "invalid"]) + " " + SYSTEM)
    for task, spec in TASKS.items():
        env = make_env(task)
        for seed in range(seeds):
            obs = env.reset(seed)
            add(render_text(obs))
            add(" ".join(spec.oracle(obs)))
    return tuple(sorted(words))
