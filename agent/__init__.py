"""The agent: a causal-LM or vision-language policy, batched KV-cached multi-turn rollouts, and evaluation,
over web tasks and single-turn verifiable tasks alike (:mod:`graftkit.agent.tasks`)."""

from .evaluate import EvalOutcome, episode_seed, evaluate, seed_list
from .load import load_policy
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
from .tasks import make_task_env, resolve_tasks, task_spec, tiny_words
from .vlm import VisionPolicy, som_text, tiny_vlm_policy

__all__ = [
    "EvalOutcome", "episode_seed", "evaluate", "resolve_tasks", "seed_list", "Policy", "canonical_action",
    "format_prompt", "next_token_logits", "task_words", "tiny_policy", "tiny_tokenizer", "Decode", "Episode", "Turn",
    "generate", "rollout", "load_policy", "VisionPolicy", "som_text", "tiny_vlm_policy", "make_task_env",
    "task_spec", "tiny_words",
]
