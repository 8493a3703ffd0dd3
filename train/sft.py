"""Supervised fine-tuning on oracle demonstrations: the SFT baseline every RL run starts from.

Demonstrations are the demonstrator's episodes on training items (``webenv.demonstrate``: the oracle's,
except where a task hides its answer from the observation and the demonstrator reads the page — in
click-tab-2 it opens the tab that holds the link): the first training item from seed
``TRAIN_SEED_BASE + i`` on (items held out for evaluation are never demonstrated, see ``webenv.items``);
each turn is one example (that turn's prompt → the demonstrator's action). Per-task budgets are pool sizes
(:class:`DemoStream`): the default draws fresh episodes throughout for the rich-item tasks and reuses a
small pool for the long form tasks. The loss is the mean cross-entropy over action
tokens only (prompt tokens are masked out), AdamW with linear warmup and cosine decay, gradient-norm
clipping.

Trained ``until`` a target (``--until TASKS=RATE``), the run checks every ``check_every`` steps (and at the last
step) the greedy success of the policy on *training* items of those tasks (``evaluate(..., items="train")``: the
same ``check_episodes`` items per task at every check, never an evaluation item) and stops after the first check
whose pooled rate p̂ = successes / n reaches the target; ``steps`` is the most it takes. The cosine schedule is
defined by ``steps`` and a stop leaves it where it was, so a run stopped at step k is bit for bit the first k
steps of the run without a stopping rule (a check runs in eval mode, under no_grad, and restores every global
generator it might draw from); the policy's graftkit.json records each check and the rate at the stop with its
Wilson interval.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import random
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .._version import __version__
from ..agent import Policy, next_token_logits, tiny_policy
from ..agent.evaluate import MAX_EPISODES_PER_SEED, EvalOutcome, evaluate, plan_episodes
from ..agent.rollout import Decode
from ..core.errors import GraftkitError
from ..agent.tasks import make_task_env, tiny_words
from ..core.env import demonstrate
from ..webenv.items import NoItems, SPLIT_RULE, draw
from ..stats.rates import wilson_interval
from ..core.devices import TRAINING_CONVENTION, autocast, dtype_name, resolve_device, training_dtype
from ..weights import load_model, save_model
from ..weights.hf import save_adapter, save_dtype
from ..weights.writer import check_output_room
from .configs import DEFAULT_BUDGETS, DEFAULT_DECOYS, SFTConfig  # noqa: F401  (the recipe, re-exported)
from .lora import adapter_state, add_lora, check_lora_base, lora_spec

TRAIN_SEED_BASE = 10 * MAX_EPISODES_PER_SEED * MAX_EPISODES_PER_SEED  # far above every evaluation seed


@dataclass(frozen=True)
class Example:
    task: str
    prompt_ids: tuple[int, ...]
    action_ids: tuple[int, ...]


_CLICK = re.compile(r"click\((\d+)\)")


def decoy_action(obs, action: str) -> str | None:
    """The demonstrator's slip for a click — position bias: the first element with the clicked element's tag
    and classes (the first button, link, tab or text box); None when ``action`` is no click, or when that
    first element is the target or a twin with the same label (then there is no slip to make)."""
    m = _CLICK.fullmatch(action)
    if not m:
        return None
    target = next((e for e in obs.elements if e.ref == int(m[1])), None)
    if target is None:
        return None
    first = next(e for e in obs.elements if e.tag == target.tag and e.classes == target.classes and e.ref > 0)
    twin = bool(target.text) and first.text == target.text  # a button with the same label answers too
    return None if first.ref == target.ref or twin else f"click({first.ref})"


def episode_examples(policy: Policy, env, task: str, seed: int, decoy_rate: float = 0.0) -> list[Example]:
    """The demonstrator's episode drawn from environment seed ``seed``, one example per turn: the oracle's,
    or — in a ``decoy_rate`` fraction of episodes, fixed by the seed — its first click sent to a decoy,
    after which the episode has ended (none for an episode the task declares ambiguous: its observation
    does not determine the answer). The episode is the first training item from ``seed`` on
    (:func:`~graftkit.webenv.items.draw`): evaluation items are never demonstrated."""
    seed, _, obs = draw(env, seed, heldout=False)
    if env.spec.ambiguous(obs):
        return []
    if decoy_rate and random.Random(seed).random() < decoy_rate:
        first = env.spec.oracle(obs)[0]
        slip = decoy_action(obs, first)
        if slip is not None:
            return [Example(task, tuple(policy.turn_ids(env.spec.prompt(obs, []))), tuple(policy.action_ids(slip)))]
    history: list[str] = []
    out = []
    for obs, action, _ in demonstrate(env, obs):
        prompt = policy.turn_ids(env.spec.prompt(obs, history))
        out.append(Example(task, tuple(prompt), tuple(policy.action_ids(action))))
        history.append(action)
    if not env.success:
        raise GraftkitError(f"the {task} demonstration failed on seed {seed}: its solution does not reach reward 1",
                            "a user's task: make each item's solution one its verifier scores 1; a built-in task: "
                            "this is a bug in its oracle, report it")
    return out


def demonstrations(policy: Policy, budgets: Mapping[str, int]) -> list[Example]:
    """Every turn of the first ``budgets[task]`` oracle episodes of each task."""
    examples = []
    for task, n in budgets.items():
        env = make_task_env(task)
        for i in range(n):
            try:
                examples.extend(episode_examples(policy, env, task, TRAIN_SEED_BASE + i))
            except NoItems:  # every item of the task is held out for evaluation
                break
    return examples


#: A task is drawn in proportion to its budget capped here, so a huge budget means fresh episodes
#: all the way through training without drowning the tasks with small pools.
POOL_WEIGHT_CAP = 2000
#: Episodes of pools up to this size are kept once generated; larger pools are regenerated on demand.
CACHE_LIMIT = 2000
#: Batches per window sorted by length.
WINDOW = 50


class DemoStream:
    """Batches of demonstration turns drawn from per-task pools of ``budgets[task]`` episodes.

    Each draw picks a task (probability ∝ min(budget, POOL_WEIGHT_CAP)) and one of its pool's episodes
    uniformly, and contributes every turn of that episode. A small pool is revisited many times (the
    headroom suite: few demonstrations, learned partly); a pool far larger than the number of draws gives
    fresh episodes throughout (the mastered suite: a tiny policy memorises a reused pool of a few hundred
    episodes — 92% on its training seeds, 30% on fresh ones — instead of learning to ground the
    instruction in the element list). Episodes are generated on demand (a web page's generation and layout is
    about half of a tiny policy's SFT step). Batches come from windows of :data:`WINDOW` batches sorted by length
    (little padding); a window never holds more batches than the run has steps left, so no page is generated
    for a batch that is never trained on."""

    def __init__(self, policy: Policy, budgets: Mapping[str, int], batch_size: int, rng: random.Random,
                 decoys: Mapping[str, float] | None = None):
        self.policy, self.batch_size, self.rng = policy, batch_size, rng
        self.decoys = dict(decoys or {})
        self.pools = {t: n for t, n in budgets.items() if n > 0}
        self.tasks = list(self.pools)
        self.weights = [min(self.pools[t], POOL_WEIGHT_CAP) for t in self.tasks]
        self.envs = {t: make_task_env(t) for t in self.tasks}
        self.cache: dict[tuple[str, int], list[Example]] = {}
        self.no_items: set[str] = set()
        self.batches: list[list[Example]] = []

    def episode(self, task: str, i: int) -> list[Example]:
        key = (task, i)
        if key in self.cache:
            return self.cache[key]
        try:
            ex = episode_examples(self.policy, self.envs[task], task, TRAIN_SEED_BASE + i, self.decoys.get(task, 0.0))
        except NoItems:  # every item of the task is held out for evaluation: it gets no demonstrations
            self.no_items.add(task)
            k = self.tasks.index(task)
            del self.tasks[k], self.weights[k]
            if not self.tasks:
                raise GraftkitError("no demonstrations: every item of the budgeted tasks is held out for evaluation",
                                    "give a budget to tasks with more than a few distinct items") from None
            return []
        if self.pools[task] <= CACHE_LIMIT:
            self.cache[key] = ex
        return ex

    def next_batch(self, steps_left: int) -> list[Example]:
        """The next batch of a run with ``steps_left`` optimizer steps to go (this one included)."""
        if not self.batches:
            window: list[Example] = []
            while len(window) < min(WINDOW, steps_left) * self.batch_size:
                task = self.rng.choices(self.tasks, self.weights)[0]
                window.extend(self.episode(task, self.rng.randrange(self.pools[task])))
            window.sort(key=lambda e: len(e.prompt_ids) + len(e.action_ids))
            self.batches = [window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size)]
            self.rng.shuffle(self.batches)
        return self.batches.pop()


def batch_tensors(batch: list[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (−100 except on action tokens)."""
    width = max(len(e.prompt_ids) + len(e.action_ids) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, e in enumerate(batch):
        seq = e.prompt_ids + e.action_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(e.prompt_ids) : len(seq)] = torch.tensor(e.action_ids)
    return ids, mask, labels


def lr_at(step: int, cfg_lr: float, warmup: int, total: int) -> float:
    """Linear warmup to ``cfg_lr`` over ``warmup`` steps, then cosine decay to 10% at ``total``."""
    if step < warmup:
        return cfg_lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return cfg_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def action_loss(model, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over action tokens. ``ids, mask, labels [B, L]``."""
    target = labels[:, 1:]  # [B, L-1]
    select = target != -100
    logits = next_token_logits(model, ids, mask, select)  # [N, V]
    return torch.nn.functional.cross_entropy(logits, target[select])


# ------------------------------------------------------------------------------------ stopping at a target

#: The evaluation seed of every check: its episodes 0..E−1 play the same training items at each check.
CHECK_SEED = 0
#: The confidence level of the Wilson interval recorded for each check.
CHECK_LEVEL = 0.95
#: The name of the checked quantity in train_log.jsonl and the training curves (``_low``/``_high``: its interval).
CHECK_METRIC = "greedy_success_train_items"
LR_AFTER_STOP = ("cosine over --steps (the maximum); a stop leaves it where it was, so the run stopped at step k "
                 "is the first k steps of the run without a stopping rule")


@dataclass(frozen=True)
class Check:
    """One check: after ``step`` optimizer steps, ``successes`` of ``n`` greedy episodes on training items
    (pooled over the tasks) succeeded; ``[low, high]`` its Wilson interval at ``CHECK_LEVEL``."""

    step: int
    successes: int
    n: int
    low: float
    high: float
    seconds: float
    """Wall-clock cost of the check."""
    per_task: Mapping[str, float]
    """Each task's success rate."""

    @property
    def rate(self) -> float:
        return self.successes / self.n

    def as_json(self) -> dict:
        return {"step": self.step, "successes": self.successes, "n": self.n, "rate": self.rate, "low": self.low,
                "high": self.high, "seconds": self.seconds, "per_task": dict(self.per_task)}


def training_item_check(policy: Policy, tasks: Sequence[str], episodes: int, step: int) -> Check:
    """Greedy success of ``policy`` on training items (``items="train"``) of ``tasks``: episodes 0..episodes−1
    of evaluation seed ``CHECK_SEED``, the same items at every call. The model plays in eval mode under
    no_grad and returns to the mode it was in; torch's (CPU and CUDA), Python's and NumPy's global generators
    are restored, so a check never moves the training trajectory."""
    model = policy.model
    was_training = model.training
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    py_state, np_state = random.getstate(), np.random.get_state()
    t0 = time.perf_counter()
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            out: EvalOutcome = evaluate(policy, tasks, [CHECK_SEED], episodes, Decode(greedy=True), items="train")
    finally:
        model.train(was_training)
        random.setstate(py_state)
        np.random.set_state(np_state)
    successes, n = int(out.success.sum()), int(out.success.size)
    ci = wilson_interval(successes, n, CHECK_LEVEL)
    return Check(step, successes, n, ci.low, ci.high, time.perf_counter() - t0,
                 {t: out.rate(t) for t in out.tasks})


@dataclass(frozen=True)
class Stopping:
    """An SFT run trained until a target: its rule (``until``: the pooled greedy success on training items of
    ``tasks`` reaches ``target``, checked every ``check_every`` steps, at most ``max_steps``) and its checks.
    The last check is where training stopped; graftkit.json's ``stopping`` is :meth:`as_json`."""

    until: str
    tasks: tuple[str, ...]
    target: float
    check_every: int
    check_episodes: int
    max_steps: int
    checks: tuple[Check, ...] = ()

    @property
    def last(self) -> Check:
        return self.checks[-1]

    @property
    def reached(self) -> bool:
        """Whether a check reached the target (else training ran all ``max_steps``)."""
        return bool(self.checks) and self.last.rate >= self.target

    @property
    def steps_run(self) -> int:
        return self.last.step if self.checks else 0

    def due(self, step: int) -> bool:
        """Whether the rule checks after ``step`` optimizer steps."""
        return step % self.check_every == 0 or step == self.max_steps

    def summary(self) -> str:
        """One line: the stop (step, rate with its interval, target), or that the target was not reached."""
        c = self.last
        rate = f"{100 * c.rate:.1f}% [{100 * c.low:.1f}, {100 * c.high:.1f}] ({c.successes}/{c.n})"
        what = f"greedy success on training items of {','.join(self.tasks)}"
        cost = f"{len(self.checks)} checks took {sum(k.seconds for k in self.checks):.1f} s"
        if self.reached:
            return (f"stopped at step {c.step} of at most {self.max_steps}: {what} {rate} ≥ target "
                    f"{100 * self.target:g}%; {cost}")
        return (f"TARGET NOT REACHED: after all {self.max_steps} steps {what} {rate} < target {100 * self.target:g}% "
                f"(the policy is written all the same); {cost}")

    def outcome(self) -> dict:
        """The stop as a command reports it: reached or not, the step, the rate with its interval, the target."""
        c = self.last
        return {"reached": self.reached, "step": c.step, "max_steps": self.max_steps, "target": self.target,
                "tasks": list(self.tasks), "items": "train", "rate": c.rate, "low": c.low, "high": c.high,
                "successes": c.successes, "n": c.n, "checks": len(self.checks),
                "check_seconds": sum(k.seconds for k in self.checks)}

    def as_json(self) -> dict:
        c = self.last
        return {
            "until": self.until, "tasks": list(self.tasks), "target": self.target,
            "rule": "stop after the first check whose pooled greedy success on training items ≥ target",
            "items": "train", "decode": "greedy", "check_every": self.check_every,
            "check_episodes": self.check_episodes, "max_steps": self.max_steps,
            "episodes": f"evaluation seed {CHECK_SEED}, episodes 0..{self.check_episodes - 1} of each task: the "
                        "first training item from its environment seed on (agent.evaluate.plan_episodes), the same "
                        "items at every check",
            "reached": self.reached, "stopped_at": c.step if self.reached else None, "steps_run": c.step,
            "rate": {"successes": c.successes, "n": c.n, "rate": c.rate, "low": c.low, "high": c.high,
                     "level": CHECK_LEVEL, "method": "Wilson score interval, no continuity correction"},
            "checks": [k.as_json() for k in self.checks], "check_seconds": sum(k.seconds for k in self.checks),
            "lr_schedule": LR_AFTER_STOP, "metric": CHECK_METRIC,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "Stopping":
        checks = tuple(Check(k["step"], k["successes"], k["n"], k["low"], k["high"], k["seconds"], k["per_task"])
                       for k in d["checks"])
        return cls(d["until"], tuple(d["tasks"]), d["target"], d["check_every"], d["check_episodes"],
                   d["max_steps"], checks)


def _stopping(cfg: SFTConfig) -> Stopping | None:
    """The stopping rule of ``cfg`` (None without ``until``), refused before training when a task has no
    training item to check."""
    target = cfg.until_target()
    if target is None:
        return None
    tasks, rate = target
    dropped = plan_episodes(tasks, [CHECK_SEED], cfg.check_episodes, "train")[3]
    if dropped:
        raise GraftkitError(f"--until {cfg.until!r}: {', '.join(dropped)} has no training item to check",
                            "drop it from --until (all of its items are held out for evaluation)")
    return Stopping(cfg.until, tasks, rate, cfg.check_every, cfg.check_episodes, cfg.steps)


def _start_policy(cfg: SFTConfig) -> Policy:
    """The policy SFT starts from (``cfg.init``, or the tiny default over the tasks' vocabulary), refused when
    its tokenizer cannot encode the oracle's actions."""
    if cfg.init:
        model, tok = load_model(Path(cfg.init))
        policy = Policy(model, tok, Path(cfg.init))
    else:
        policy = tiny_policy(tiny_words(tuple(cfg.pools)), cfg.size, seed=cfg.seed)
    unk = policy.tokenizer.unk_token_id
    probe = demonstrations(policy, {t: min(n, 5) for t, n in cfg.pools.items()})
    if unk is not None and any(unk in e.action_ids for e in probe):
        raise GraftkitError("the tokenizer cannot encode some oracle actions (unknown tokens)",
                            "use a tokenizer that covers the task vocabulary, or the tiny default")
    return policy


def _provenance(cfg: SFTConfig, stream: "DemoStream", spec, compute: torch.dtype, saved: torch.dtype,
                dev: torch.device, stopping: Stopping | None = None) -> dict:
    """What the SFT policy's graftkit.json records: its config, demonstrations, parents and precision."""
    return {
        "producer": "graftkit train sft",
        "graftkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.recorded(),
        "demonstrations": {"pools": dict(cfg.pools), "decoys": dict(cfg.decoys),
                           "decoy": "first click sent to the first element of the target's tag and classes when that is not the target; the episode ends", "seeds": f"{TRAIN_SEED_BASE} + i, i < pool",
                           "items": SPLIT_RULE, "tasks_without_training_items": sorted(stream.no_items),
                           "drawn_episodes": len(stream.cache) if all(n <= CACHE_LIMIT for n in cfg.pools.values())
                           else "on demand", "task_weight": f"min(pool, {POOL_WEIGHT_CAP})"},
        "parents": [{"role": "init", "path": str(Path(cfg.init).resolve())}] if cfg.init else [],
        "precision": {"compute_dtype": dtype_name(compute), "saved_dtype": dtype_name(saved), "device": str(dev),
                      "convention": TRAINING_CONVENTION},
        **({"lora": {"r": spec.r, "alpha": spec.alpha, "targets": list(spec.targets), "base": str(Path(cfg.init).resolve())}}
           if spec else {}),
        **({"stopping": stopping.as_json()} if stopping else {}),
    }


def run_sft(cfg: SFTConfig, on_step: Callable[[dict], None] = lambda m: None, force: bool = False) -> Path:
    """Train the SFT policy of ``cfg`` and write it to ``cfg.out``; returns the folder. With ``cfg.until``,
    training stops after the first check that reaches the target (see the module docstring)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    dev = resolve_device(cfg.device)
    compute = training_dtype(cfg.dtype, dev)
    policy = _start_policy(cfg)
    stopping = _stopping(cfg)
    model = policy.model.to(dev).train()  # float32 master weights
    spec = lora_spec(cfg.lora_r, cfg.lora_alpha, cfg.lora_targets)
    check_lora_base(spec, cfg.init)
    peft_model = add_lora(model, spec) if spec else None  # the adapters live inside ``model``'s modules
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # before training: the output folder can be written and its disk holds the policy (float32 at most)
    check_output_room(Path(cfg.out), 4 * sum(p.numel() for _, p in (trained if spec else model.named_parameters())),
                      "--out", f"the policy {cfg.out}")
    decay = [p for n, p in trained if p.dim() >= 2]
    other = [p for n, p in trained if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    stream = DemoStream(policy, cfg.pools, cfg.batch_size, random.Random(cfg.seed), cfg.decoys)
    log = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        batch = stream.next_batch(cfg.steps - step)
        ids, mask, labels = (t.to(dev) for t in batch_tensors(batch, policy.pad_id))
        lr = lr_at(step, cfg.lr, cfg.warmup, cfg.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast(dev, compute):
            loss = action_loss(model, ids, mask, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_([p for _, p in trained], cfg.grad_clip)
        opt.step()
        m = {"step": step + 1, "loss": loss.item(), "grad_norm": gnorm.item(), "lr": lr,
             "tokens": int((labels != -100).sum()), "seconds": time.perf_counter() - t0}
        if stopping is not None and stopping.due(step + 1):
            c = training_item_check(policy, stopping.tasks, stopping.check_episodes, step + 1)
            stopping = replace(stopping, checks=(*stopping.checks, c))
            m |= {CHECK_METRIC: c.rate, f"{CHECK_METRIC}_low": c.low, f"{CHECK_METRIC}_high": c.high,
                  "check_seconds": c.seconds}
        log.append(m)
        on_step(m)
        if stopping is not None and stopping.reached:
            break
    model.eval()
    saved = save_dtype(cfg.save_dtype, Path(cfg.init) if cfg.init else None)
    provenance = _provenance(cfg, stream, spec, compute, saved, dev, stopping)
    log_bytes = "".join(json.dumps(m) + "\n" for m in log).encode()
    if peft_model is not None:
        return save_adapter(Path(cfg.out), adapter_state(peft_model), peft_model.peft_config["default"].to_dict(),
                            policy.tokenizer, base=Path(cfg.init), provenance=provenance, force=force,
                            inputs=[Path(cfg.init)], extra_files={"train_log.jsonl": log_bytes}, dtype=saved)
    return save_model(Path(cfg.out), model, policy.tokenizer, provenance=provenance, force=force,
                      inputs=[Path(cfg.init)] if cfg.init else [], extra_files={"train_log.jsonl": log_bytes},
                      dtype=saved)
