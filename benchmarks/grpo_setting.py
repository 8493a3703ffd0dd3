"""The setting bench_grpo.py runs both GRPO trainers on: one tiny policy folder, the prompts, the reward.

Imported by both sides — graftkit's venv (bench_grpo.py) and the TRL venv (trl_grpo.py, where graftkit
is installed editable without dependencies) — so the model, tokenizer, prompts and reward come from
the same source code, not from two copies that could drift.

- Policy: ``graftkit.agent.tiny_policy(task_words(), size, seed=0)`` (a randomly initialised tiny Qwen3
  with graftkit's word-level task tokenizer), saved once as an HF folder that both trainers load.
- Prompts: the plain-format prompt of the first observation of a web task, for the environment seeds
  graftkit's GRPO trainer draws at each step (``train.grpo._prompts``: seed ``GRPO_SEED_BASE +
  100000·seed + k`` for the k-th prompt of the run, tasks cycled in order). TRL takes prompts as text
  and tokenizes them itself, so the prompt ids are decoded back to text with the special tokens kept
  (the BOS graftkit puts first); :func:`prompt_rows` checks that the tokenizer encodes that text back to
  exactly graftkit's ids.
- Reward: the completion's tokens are read as an action the way graftkit's rollout reads them
  (``Policy.decode_action``) and played on the prompt's episode; 1.0 if that ends the episode with
  success, else 0.0 (an output that does not parse scores 0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

# graftkit.train.grpo: environment seeds of GRPO prompts (disjoint from SFT demos and evaluation).
# Read from there when importable, so a change in the trainer follows here; this is its value today.
try:
    from graftkit.train.grpo import GRPO_SEED_BASE
except ImportError:  # the trainer module is missing or mid-edit
    GRPO_SEED_BASE = 2 * 10 ** 7


@dataclass(frozen=True)
class Setting:
    """What both trainers share besides the code under test (the CLI flags of the graftkit side)."""

    task: str = "click-button"
    size: str = "micro"
    model_seed: int = 0
    prompts_per_step: int = 2
    group_size: int = 8
    max_new_tokens: int = 16
    steps: int = 20
    temperature: float = 1.0
    lr: float = 1e-5
    beta: float = 0.0
    loss: str = "dapo"
    epsilon: float = 0.2
    seed: int = 0
    threads: int = 1

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Setting":
        return cls(**d)

    def env_seeds(self) -> list[int]:
        """Environment seed of every prompt of the run, in order (step s takes the s-th slice)."""
        n = self.steps * self.prompts_per_step
        bases = [GRPO_SEED_BASE + 100_000 * self.seed + k for k in range(n)]
        try:  # the trainer takes the first training item from each base on (graftkit.webenv.items.draw)
            from graftkit.webenv import make_env
            from graftkit.webenv.items import draw
        except ImportError:
            return bases
        env = make_env(self.task)
        return [draw(env, b, heldout=False)[0] for b in bases]


def policy_dir(work: Path, s: Setting) -> Path:
    return work / f"grpo-policy-{s.size}-seed{s.model_seed}"


def make_policy_dir(work: Path, s: Setting) -> Path:
    """The tiny policy as an HF folder (written once; reused when it is already there)."""
    import torch

    from graftkit.agent import task_words, tiny_policy
    from graftkit.weights import save_model

    dest = policy_dir(work, s)
    if (dest / "config.json").is_file() and (dest / "model.safetensors").is_file():
        return dest
    torch.set_num_threads(s.threads)
    p = tiny_policy(task_words(), s.size, seed=s.model_seed)
    save_model(dest, p.model, p.tokenizer, provenance={}, force=True)
    return dest


def load_policy(folder: Path):
    """graftkit's Policy (model in fp32 and tokenizer) from the shared folder."""
    from graftkit.agent import Policy
    from graftkit.weights import load_model

    model, tok = load_model(folder)
    return Policy(model, tok, folder)


def prompt_rows(policy, s: Setting) -> list[dict]:
    """One row per prompt of the run: ``prompt`` (text), ``prompt_ids`` (graftkit's ids), ``task``,
    ``env_seed``. Raises when the text does not encode back to the ids (then TRL would see another
    prompt than graftkit)."""
    from graftkit.webenv import make_env
    from graftkit.webenv.render import render_text

    env = make_env(s.task)
    tok = policy.tokenizer
    rows = []
    for seed in s.env_seeds():
        ids = policy.prompt_ids(render_text(env.reset(seed)), [])
        text = tok.decode(ids, skip_special_tokens=False)
        # TRL tokenizes plain-text prompts with the tokenizer's defaults (add_special_tokens=True).
        back = list(tok(text)["input_ids"])
        if back != ids:
            raise ValueError(f"prompt of {s.task} seed {seed} does not round-trip through text:\n"
                             f"  ids  {ids}\n  back {back}\n  text {text!r}")
        rows.append({"prompt": text, "prompt_ids": ids, "task": s.task, "env_seed": seed})
    return rows


class Reward:
    """1.0 when the completion, read as an action, solves the prompt's episode in one step; else 0.0."""

    def __init__(self, policy):
        from graftkit.webenv import make_env

        self.policy = policy
        self._envs: dict[str, object] = {}
        self._make_env = make_env
        self.calls = 0

    def score(self, task: str, env_seed: int, completion_ids: Sequence[int]) -> float:
        from graftkit.webenv import ParseError

        env = self._envs.get(task) or self._envs.setdefault(task, self._make_env(task))
        env.reset(int(env_seed))
        self.calls += 1
        action = self.policy.decode_action(list(completion_ids))
        try:
            env.step(action)
        except ParseError:
            return 0.0
        return 1.0 if env.success else 0.0

    # TRL's reward-function signature: keyword arguments, extra dataset columns as lists.
    def __call__(self, prompts=None, completions=None, completion_ids=None, task=None, env_seed=None, **_):
        return [self.score(t, e, c) for t, e, c in zip(task, env_seed, completion_ids, strict=True)]

    __name__ = "web_task_success"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
