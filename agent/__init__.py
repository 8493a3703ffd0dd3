"""The agent: a causal-LM policy, batched KV-cached multi-turn rollouts, and evaluation."""

from .evaluate import EvalOutcome, episode_seed, evaluate, resolve_tasks
from .policy import (
    Policy,
    canonical_action,
    format_prompt,
    next_token_logits,
    task_words,
    tiny_policy,
    tiny_tokenizer,
)
from .rollout import Decode, Episode, Turn, generate, rollout

__all__ = [
    "EvalOutcome", "episode_seed", "evaluate", "resolve_tasks", "Policy", "canonical_action",
    "format_prompt", "next_token_logits", "task_words", "tiny_policy", "tiny_tokenizer", "Decode", "Episode", "Turn",
    "generate", "rollout",
]
