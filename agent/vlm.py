"""The vision-language policy: the Set-of-Marks track of the agent.

A :class:`VisionPolicy` is an HF image-text-to-text model (Qwen2-VL and Qwen2.5-VL first) with its
processor. Its Set-of-Marks prompt is the text prompt without the element list — the instruction and
the history — beside one image: the page with a numbered box on every element it can act on, each
number being the element's ref (``webenv.render.render_som``: the browser's screenshot on the real
backend, a deterministic drawing of the layout on the mirror). The action grammar is the text track's
(``click(8)``, ``type(5, "Agustina")``), so both tracks share one action space and one parser.

Prompt (plain format, for tokenizers without a chat template)::

    [BOS]<|vision_start|><|image_pad|>×N<|vision_end|>
    Instruction: Select HF2 and click Submit.
    previous: click(3)                         (or "previous: none")
    action:

With a chat template: a system message (:data:`SOM_SYSTEM`), then one user turn whose content is the
image followed by the same text. ``N``, the number of image tokens, is what the image processor makes
of the screenshot: for Qwen2-VL one token per 28×28 pixels after resizing within
``[min_pixels, max_pixels]``.

:func:`tiny_vlm_policy` builds the embedded default: a tiny random Qwen2-VL over the task tokenizer of
``policy.py``, extended with the vision tokens, and a Qwen2-VL image processor whose pixel budget turns
a MiniWoB++ screenshot (drawn at 320×420) into a few dozen image tokens. Nothing is downloaded.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from ..core.errors import GraftkitError
from ..weights import ImageTextProcessor
from .policy import SIZES, Policy, format_prompt, tiny_tokenizer

SOM_SYSTEM = ("You operate the web page in the screenshot; every element you can act on has a numbered box. "
              "Answer with one action: click(REF) or type(REF, \"TEXT\"), REF being a box's number.")
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IMAGE_TOKEN = "<|image_pad|>"
# Keys of a processor's output that run along the token axis: rebuilt for each batch from the padded ids.
_PER_TOKEN = frozenset({"input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids"})
TINY_MIN_PIXELS = 28 * 28 * 4
TINY_MAX_PIXELS = 28 * 28 * 48  # a 320×420 Set-of-Marks image → 168×224 px → 42 image tokens


def som_text(utterance: str, history: Sequence[str]) -> str:
    """The text half of the Set-of-Marks prompt: the instruction and the history, no element list."""
    return format_prompt(f"Instruction: {utterance}", history)


@dataclass
class VisionPolicy(Policy):
    """An image-text-to-text model and its processor; reads text prompts too (``--obs text``)."""

    processor: object = None
    som_scale: int = 2
    """``render_som`` draws the page at this multiple of its 160×210 size before the processor resizes it."""

    def __post_init__(self) -> None:
        if self.processor is None or getattr(self.processor, "image_processor", None) is None:
            raise GraftkitError("a vision-language policy needs a processor with an image processor",
                                "load it with graftkit.weights.load_vlm")
        super().__post_init__()
        self.chat = bool(getattr(self.processor, "chat_template", None)
                         or getattr(self.tokenizer, "chat_template", None))
        self.image_token = getattr(self.processor, "image_token", None) or IMAGE_TOKEN
        vocab = self.tokenizer.get_vocab()
        if self.image_token not in vocab:
            raise GraftkitError(f"the tokenizer has no image token {self.image_token!r}",
                                "use the model's own processor folder")
        self.image_token_id = vocab[self.image_token]
        config_id = getattr(self.model.config, "image_token_id", None)
        if config_id is not None and config_id != self.image_token_id:
            raise GraftkitError(f"config.json's image_token_id {config_id} is not the tokenizer's "
                                f"{self.image_token!r} ({self.image_token_id})", "use the model's own processor")
        # Qwen2-VL style: the image placeholder sits between vision start/end tokens in plain prompts.
        wrap = [t in vocab for t in VISION_TOKENS[:2]]
        self._plain_image = (f"{VISION_TOKENS[0]}{self.image_token}{VISION_TOKENS[1]}" if all(wrap)
                             else self.image_token)
        params = inspect.signature(self.model.forward).parameters
        self._type_ids_kw = [k for k in ("mm_token_type_ids", "token_type_ids") if k in params]

    @property
    def _hf_processor(self) -> bool:
        """True for a transformers processor (it expands image tokens itself), False for the
        assembled :class:`~graftkit.weights.ImageTextProcessor` (expanded here, Qwen2-VL's rule)."""
        return not isinstance(self.processor, ImageTextProcessor)

    def _template(self, messages: list[dict]) -> str:
        owner = self.processor if getattr(self.processor, "chat_template", None) else self.tokenizer
        return owner.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _chat_ids(self, msgs: list[dict]) -> list[int]:
        """A text-only prompt through the chat template (``--obs text``, or a verifiable problem): no image; each
        message's content as one text part, as the processor's template reads it."""
        s = self._template([{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in msgs])
        return list(self.tokenizer(s, add_special_tokens=False)["input_ids"])

    def som_prompt(self, obs, history: Sequence[str]) -> tuple[list[int], dict[str, torch.Tensor]]:
        """The Set-of-Marks prompt of observation ``obs``: token ids (image tokens expanded) and the
        image inputs the model reads beside them (``pixel_values``, ``image_grid_thw``, ...)."""
        from ..webenv.render import render_som

        image, _ = render_som(obs, scale=self.som_scale)
        return self.image_prompt(image, som_text(obs.utterance, history))

    def image_prompt(self, image, text: str) -> tuple[list[int], dict[str, torch.Tensor]]:
        """Token ids and image inputs for one image followed by ``text`` (see the module docstring)."""
        if self.chat:
            s = self._template([{"role": "system", "content": [{"type": "text", "text": SOM_SYSTEM}]},
                                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}])
        else:
            s = f"{self._plain_image}\n{text}"
        if self._hf_processor:
            enc = self.processor(text=[s], images=[image], return_tensors="pt", add_special_tokens=False)
            ids = enc["input_ids"][0].tolist()
        else:
            enc = self.processor.image_processor(images=[image], return_tensors="pt")
            merge = getattr(self.processor.image_processor, "merge_size", None)
            if merge is None or "image_grid_thw" not in enc:
                raise GraftkitError(f"{type(self.processor.image_processor).__name__}: cannot count image tokens",
                                    "install torchvision so transformers can build the model's own processor")
            n = int(enc["image_grid_thw"][0].prod()) // merge**2
            ids = list(self.tokenizer(s.replace(self.image_token, self.image_token * n),
                                      add_special_tokens=False)["input_ids"])
        bos = self.tokenizer.bos_token_id
        if not self.chat and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        vision = {k: v for k, v in enc.items() if k not in _PER_TOKEN and isinstance(v, torch.Tensor)}
        return ids, vision

    def vision_inputs(self, ids: torch.Tensor, vision: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The image keyword arguments of a forward pass over the padded batch ``ids [B, L]`` whose
        row ``i`` carries ``vision[i]``: image tensors concatenated in row order, token type ids (1 on
        image tokens) under the name the model takes."""
        device = ids.device
        out = {k: torch.cat([v[k] for v in vision]).to(device) for k in vision[0]}
        if "pixel_values" in out:
            out["pixel_values"] = out["pixel_values"].to(next(self.model.parameters()).dtype)
        types = (ids == self.image_token_id).to(torch.int32)
        out.update({k: types for k in self._type_ids_kw})
        return out

    @property
    def mrope(self) -> bool:
        """True for models whose rotary positions are multimodal (Qwen2-VL's M-RoPE): the prefill
        lets the model place image tokens on its (t, h, w) grid and keeps per-row ``rope_deltas``."""
        return hasattr(self.model.base_model, "rope_deltas")


def require_vision(policy: Policy, obs: str) -> None:
    """Refuse ``obs="som"`` for a text-only policy, naming the model; refuse unknown observations."""
    if obs not in ("text", "som"):
        raise GraftkitError(f"unknown observation {obs!r}", "use text or som")
    if obs == "som" and not isinstance(policy, VisionPolicy):
        name = policy.path.name if policy.path is not None else type(policy.model).__name__
        raise GraftkitError(
            f"--obs som needs a vision-language policy, but {name} is a text-only causal LM "
            f"({type(policy.model).__name__})",
            "pass an image-text-to-text model folder with its processor (e.g. Qwen2-VL), or use --obs text",
        )


# ------------------------------------------------------------------------------ the tiny default


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary half-dimension over (t, h, w), [16, 24, 24] of 64, scaled."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def tiny_vlm_tokenizer(words: Sequence[str]):
    """:func:`~graftkit.agent.policy.tiny_tokenizer` plus Qwen2-VL's vision tokens (special, unsplit)."""
    tok = tiny_tokenizer(words)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return tok


def tiny_image_processor(min_pixels: int = TINY_MIN_PIXELS, max_pixels: int = TINY_MAX_PIXELS):
    """Qwen2-VL's image processor (its PIL backend: no torchvision needed) with a small pixel budget."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14, merge_size=2,
                                    temporal_patch_size=2)


def tiny_vlm_policy(words: Sequence[str], size: str = "nano", seed: int = 0, max_positions: int = 1024,
                    max_pixels: int = TINY_MAX_PIXELS) -> VisionPolicy:
    """A randomly initialised tiny Qwen2-VL (``size``'s text stack, a 2-block vision tower of width 32,
    patch 14, spatial merge 2) with the task tokenizer and a small-budget image processor."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    if size not in SIZES:
        raise GraftkitError(f"unknown model size {size!r}", f"choose one of {', '.join(SIZES)}")
    tok = tiny_vlm_tokenizer(words)
    s = SIZES[size]
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    head_dim = s["hidden_size"] // s["num_attention_heads"]
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), max_position_embeddings=max_positions, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_section(head_dim)},
            **s,
        ),
        vision_config=dict(depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=s["hidden_size"],
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return VisionPolicy(model, tok, processor=ImageTextProcessor(tok, tiny_image_processor(max_pixels=max_pixels)))
