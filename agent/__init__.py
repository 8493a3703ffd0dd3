"""The agent: a causal-LM or vision-language policy, batched KV-cached multi-turn rollouts, and evaluation."""

from .evaluate import EvalOutcome, episode_seed, evaluate, resolve_tasks, seed_list
from .policy import (
    Policy,
    canonical_action,
    format_prompt,
    load_policy,
    next_token_logits,
    task_words,
    tiny_policy,
    tiny_tokenizer,
)
from .rollout import Decode, Episode, Turn, generate, rollout
from .vlm import VisionPolicy, som_text, tiny_vlm_policy

__all__ = [
    "EvalOutcome", "episode_seed", "evaluate", "resolve_tasks", "seed_list", "Policy", "canonical_action",
    "format_prompt", "next_token_logits", "task_words", "tiny_policy", "tiny_tokenizer", "Decode", "Episode", "Turn",
    "generate", "rollout", "load_policy", "VisionPolicy", "som_text", "tiny_vlm_policy",
]
