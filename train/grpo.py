"""GRPO on the web tasks, with every knob of the study's control grid and the seeded variants.

Recipe (DeepSeekMath's GRPO, as TRL 1.16 runs it), per optimisation step:

1. Sample ``prompts_per_step`` task instances (task, environment seed); play each ``group_size`` = G
   times with the sampling policy (multi-turn episodes, batched, KV-cached; ``agent.rollout``).
2. Reward R = 1 if the episode succeeds else 0 (``reward="raw"``: MiniWoB++'s raw reward). Advantages
   Â = (R − mean_group) / (std_group + 1e-4) (``scale_rewards="none"``: mean only); the trajectory's Â
   sits on every action token of every turn. Groups with equal rewards give Â = 0 (logged).
3. Token log-probs under the current policy (teacher-forced over each turn's prompt + action, logits /
   temperature), the sampling policy's log-probs (old), and the frozen SFT reference's when β > 0.
4. ``num_iterations`` optimiser updates on the loss ``LOSSES[loss]`` (grpo, dr_grpo, dapo, cispo, gspo)
   with clipping (ε_low, ε_high) and β·KL_k3; gradient-norm clipping; AdamW; warmup then constant LR.

Variants, each a switch of this recipe:

- **Mu-GRPO** (``stages = K > 0``): the run is split into K large generation→optimisation stages; all
  rollouts of a stage are sampled at its start by one policy version and consumed over the stage's
  steps, so the j-th step of a stage is j policy versions stale (logged as ``staleness``). Pair with
  relaxed clipping (a larger ``epsilon_high``) and the negative-advantage veto (``veto_epsilon`` = ε_v):
  in a trajectory with Â < 0, every action token after the first token whose ratio leaves
  [1 − ε_v, 1 + ε_v] is dropped from the update (the trigger itself is kept; later turns of that
  trajectory are dropped whole).
- **Focal difficulty scaling** (``focal_gamma = γ > 0``): each group's policy term is weighted by
  (1 − p̂)^γ, p̂ the group's sampled success rate.
- **VeriGate** (``verigate``): outcome advantages when a group's rewards differ; otherwise the web
  task's step-progress scores (``Turn.progress``, differenced into per-step rewards) become
  reward-to-go returns normalised over the group, token-level advantages per turn. How often each path
  is taken is logged.

Checkpoints (``checkpoint_every``) are HF folders under ``<out>.checkpoints/step-NNNNNN`` holding the
model, ``training_state.safetensors`` (optimizer moments, RNG states: never pickled) and the log so far;
``resume`` continues from the newest one, bit-identically to a run that was never interrupted (every
random choice is a function of the seed and the step). With ``stages`` > 0, checkpoints fall on stage
boundaries.
"""

from __future__ import annotations

import copy
import datetime as _dt
import inspect
import json
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import torch

from .._version import __version__
from ..agent import Decode, Episode, Policy, next_token_logits, rollout
from ..core.errors import GraftkitError
from ..agent.tasks import make_task_env
from ..webenv.items import SPLIT_RULE, NoItems, draw
from ..core.devices import TRAINING_CONVENTION, autocast, dtype_name, resolve_device, training_dtype
from ..weights.runs import rl_checkpoints
from ..weights import load_model, read_tensors, save_model
from ..weights.hf import save_adapter, save_dtype
from ..weights.writer import check_output_room
from .lora import adapter_state, add_lora, check_lora_base, load_adapter_state, lora_spec
from .advantages import focal_weight, group_advantages, verigate_advantages, veto_mask
from .configs import NOT_TRAINING, GRPOConfig, recorded_grpo
from .losses import LOSSES

GRPO_SEED_BASE = 2 * 10 ** 7  # environment seeds of GRPO prompts: disjoint from SFT demos and evaluation
STATE = "training_state.safetensors"
LOG = "train_log.jsonl"
ITEMS = "train_items.tsv"


# ------------------------------------------------------------------------------------------ batches


@dataclass
class Rows:
    """The turns of a batch of episodes as training rows (one row per turn)."""

    ids: torch.Tensor  # [R, L] prompt + action, right-padded
    attn: torch.Tensor  # [R, L]
    select: torch.Tensor  # [R, L-1] positions that predict an action token
    mask: torch.Tensor  # [R, T] action-token mask, T = longest action
    targets: torch.Tensor  # [R, T] action token ids
    episode: list[int]  # row → episode index
    turn: list[int]  # row → turn index within its episode
    prompts: list[tuple[int, ...]] = field(default_factory=list)  # row → prompt ids
    old_logp: torch.Tensor | None = None  # [R, T] the sampling policy's log-probs
    ref_logp: torch.Tensor | None = None  # [R, T]


def episode_rows(episodes: Sequence[Episode], pad: int) -> Rows:
    seqs, acts, ep_of, turn_of = [], [], [], []
    for e_i, ep in enumerate(episodes):
        for t_i, turn in enumerate(ep.turns):
            seqs.append(list(turn.prompt_ids) + list(turn.action_ids))
            acts.append((len(turn.prompt_ids), list(turn.action_ids)))
            ep_of.append(e_i)
            turn_of.append(t_i)
    R, L = len(seqs), max(len(s) for s in seqs)
    T = max(len(a) for _, a in acts)
    ids = torch.full((R, L), pad, dtype=torch.long)
    attn = torch.zeros((R, L), dtype=torch.long)
    select = torch.zeros((R, L - 1), dtype=torch.bool)
    mask = torch.zeros((R, T))
    targets = torch.zeros((R, T), dtype=torch.long)
    for r, (seq, (p, a)) in enumerate(zip(seqs, acts)):
        ids[r, : len(seq)] = torch.tensor(seq)
        attn[r, : len(seq)] = 1
        select[r, p - 1 : p - 1 + len(a)] = True  # position t predicts token t + 1
        mask[r, : len(a)] = 1
        targets[r, : len(a)] = torch.tensor(a)
    prompts = [tuple(seq[:p]) for seq, (p, _) in zip(seqs, acts)]
    return Rows(ids, attn, select, mask, targets, ep_of, turn_of, prompts)


def shared_prefix_logits(model, rows: Rows) -> torch.Tensor:
    """The logits of :func:`next_token_logits` for every action token, ``[N, V]`` in row-major mask
    order, computing each distinct prompt once.

    A GRPO group is G responses to one prompt: the decoder runs over the U distinct prompts (left-padded)
    with a cache, the cache rows are gathered for the R responses (``index_select``: gradients flow back
    to the shared prompt computation), and only the action tokens run per response. Equal to the plain
    computation up to float rounding (tested), with R·L prompt positions cut to U·L."""
    dec, head = model.get_decoder(), model.get_output_embeddings()
    dev = next(model.parameters()).device
    first: dict[tuple, int] = {}
    inverse = torch.tensor([first.setdefault(p, len(first)) for p in rows.prompts], device=dev)
    uniq = list(first)
    width = max(len(p) for p in uniq)
    pids = torch.zeros((len(uniq), width), dtype=torch.long)  # padding ids are masked out
    pmask = torch.zeros((len(uniq), width), dtype=torch.long)
    for i, p in enumerate(uniq):
        pids[i, width - len(p):] = torch.tensor(p)
        pmask[i, width - len(p):] = 1
    pids, pmask = pids.to(dev), pmask.to(dev)
    ppos = (pmask.cumsum(-1) - 1).clamp(min=0)
    params = inspect.signature(dec.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    out = dec(input_ids=pids, attention_mask=pmask, position_ids=ppos, use_cache=True)
    first_hidden = out.last_hidden_state[:, -1][inverse]  # [R, H]: predicts each response's first token
    T = rows.mask.shape[1]
    if T == 1:
        return head(first_hidden).float()
    cache = getattr(out, "cache", None) or out.past_key_values
    cache.batch_select_indices(inverse)
    fed = rows.targets[:, :-1].to(dev)  # [R, T-1]: action token t is fed to predict token t + 1
    attn = torch.cat([pmask[inverse], rows.mask[:, :-1].long().to(dev)], 1)
    pos = pmask.sum(-1)[inverse][:, None] + torch.arange(T - 1, device=dev)[None]
    rest = dec(input_ids=fed, attention_mask=attn, position_ids=pos, use_cache=True, **{cache_kw: cache})
    hidden = torch.cat([first_hidden[:, None], rest.last_hidden_state], 1)  # [R, T, H]
    return head(hidden[rows.mask.bool().to(dev)]).float()


def action_logp(model, rows: Rows, temperature: float) -> tuple[torch.Tensor, float]:
    """log π(action token | context) at ``temperature``: ``[R, T]`` (0 off the mask), and the mean
    entropy of those next-token distributions (from the same logits, no gradient). Rows that repeat a
    prompt (a group's first turns) share its computation (:func:`shared_prefix_logits`). The model may sit
    on any device; the log-probs come back on the CPU (differentiably), where the losses are formed."""
    dev = next(model.parameters()).device
    if rows.prompts and len(set(rows.prompts)) <= 0.75 * len(rows.prompts):
        logits = shared_prefix_logits(model, rows) / temperature  # [N, V]
    else:
        logits = next_token_logits(model, rows.ids.to(dev), rows.attn.to(dev), rows.select.to(dev)) / temperature
    logits = logits.float().cpu()  # [N, V]
    logp_all = torch.log_softmax(logits, -1)
    flat_targets = rows.targets[rows.mask.bool()]  # [N], row-major like the selection
    lp = logp_all.gather(1, flat_targets[:, None])[:, 0]
    with torch.no_grad():
        entropy = float(-(logp_all.exp() * logp_all).sum(-1).mean()) if lp.numel() else 0.0
    out = torch.zeros(rows.mask.shape, dtype=lp.dtype)
    return out.masked_scatter(rows.mask.bool(), lp), entropy


# ------------------------------------------------------------------------------------------ advantages


def episode_rewards(episodes: Sequence[Episode], kind: str) -> torch.Tensor:
    return torch.tensor([float(e.success) if kind == "success" else float(e.reward) for e in episodes])


def row_advantages(cfg: GRPOConfig, episodes: Sequence[Episode], rows: Rows) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Per-row-token advantages ``[R, T]``, per-row focal weights ``[R]`` and advantage statistics."""
    G = cfg.group_size
    rewards = episode_rewards(episodes, cfg.reward).view(-1, G)  # [P, G]
    adv = group_advantages(rewards, scale=cfg.scale_rewards)
    ep_adv = adv.advantages.reshape(-1)  # [P·G]
    p_hat = torch.tensor([[float(e.success) for e in episodes[i * G:(i + 1) * G]] for i in range(rewards.shape[0])]).mean(-1)
    weight_g = focal_weight(p_hat, cfg.focal_gamma) if cfg.focal_gamma else torch.ones(rewards.shape[0])
    token_adv = rows.mask * ep_adv[rows.episode][:, None]  # [R, T]
    paths = {"outcome": 0, "process": 0, "none": 0}
    if cfg.verigate:
        for g in range(rewards.shape[0]):
            group = list(range(g * G, (g + 1) * G))
            scores = [[t.progress - (ep.turns[k - 1].progress if k else 0.0) for k, t in enumerate(ep.turns)]
                      for ep in (episodes[i] for i in group)]
            counts = [[len(t.action_ids) for t in episodes[i].turns] for i in group]
            vg = verigate_advantages(rewards[g], scores, counts, scale="none" if cfg.scale_rewards == "none" else "group")
            paths[vg.path] += 1
            for i, toks in zip(group, vg.token_advantages):
                offset = 0
                for r in (r for r in range(len(rows.episode)) if rows.episode[r] == i):
                    n = int(rows.mask[r].sum())
                    token_adv[r, :n] = toks[offset : offset + n].to(token_adv.dtype)
                    offset += n
    weight = weight_g[[e // G for e in rows.episode]]
    stats = {
        "reward": float(rewards.mean()),
        "success": float(sum(e.success for e in episodes) / len(episodes)),
        "frac_reward_zero_std": float(adv.zero_std.float().mean()),
        "focal_weight_mean": float(weight_g.mean()),
        **({f"verigate_{k}": v / rewards.shape[0] for k, v in paths.items()} if cfg.verigate else {}),
    }
    return token_adv, weight, stats


def trajectory_veto(rows: Rows, logp: torch.Tensor, old_logp: torch.Tensor, adv_row: torch.Tensor,
                    eps_v: float) -> torch.Tensor:
    """Mu-GRPO's veto over multi-turn trajectories: per turn, ``veto_mask``; after a triggered turn, the
    trajectory's later turns are dropped whole."""
    keep = veto_mask(logp.detach(), old_logp, adv_row, rows.mask, eps_v).float()  # [R, T]
    triggered = (keep.sum(-1) < rows.mask.sum(-1)).tolist()
    dropped_from: dict[int, int] = {}
    for r, (e, t) in enumerate(zip(rows.episode, rows.turn)):
        if triggered[r]:
            dropped_from[e] = min(dropped_from.get(e, t), t)
    for r, (e, t) in enumerate(zip(rows.episode, rows.turn)):
        if e in dropped_from and t > dropped_from[e]:
            keep[r] = 0
    return keep


# ----------------------------------------------------------------------------------------- the loop


@lru_cache(maxsize=None)
def _mirror(task: str):
    return make_task_env(task)


def _prompts(cfg: GRPOConfig, step: int) -> list[tuple[str, int, str]]:
    """The task instances of ``step`` as (task, environment seed, item): tasks cycled in order, each the first
    training item from seed ``GRPO_SEED_BASE + 100000·seed + k`` on (:func:`~graftkit.webenv.items.draw`:
    an item held out for evaluation is never a prompt); with ``item_pool`` N, the prompt k of a task is its
    instance k mod N."""
    out = []
    for i in range(cfg.prompts_per_step):
        k = step * cfg.prompts_per_step + i
        task = cfg.tasks[k % len(cfg.tasks)]
        if cfg.item_pool:  # instance j of this task, j < N: the same few items over and over
            k = k % len(cfg.tasks) + len(cfg.tasks) * ((k // len(cfg.tasks)) % cfg.item_pool)
        try:
            env_seed, item, _ = draw(_mirror(task), GRPO_SEED_BASE + 100_000 * cfg.seed + k, heldout=False)
        except NoItems:
            raise GraftkitError(f"task {task} has no training item: its few distinct first observations are all "
                                "held out for evaluation", "train on tasks with many distinct items") from None
        out.append((task, env_seed, item))
    return out


def prompt_items(cfg: GRPOConfig, steps: int) -> list[tuple[str, str]]:
    """(task, item) of every prompt of the first ``steps`` steps, in order (what ``train_items.tsv`` lists)."""
    return [(t, item) for s in range(steps) for t, _, item in _prompts(cfg, s)]


def check_tokenizer_fits(policy: Policy, tasks: Sequence[str], seeds: int = 5) -> None:
    """Every oracle action of a few episodes per task must encode and decode back exactly."""
    for task in tasks:
        env = make_task_env(task)
        for s in range(seeds):
            obs = env.reset(GRPO_SEED_BASE + s)
            for action in env.spec.oracle(obs):
                back = policy.output_text(policy.action_ids(action), env.spec.reads)
                unk = policy.tokenizer.unk_token_id
                if back.replace(" ", "") != action.replace(" ", "") or (unk is not None and unk in policy.action_ids(action)):
                    raise GraftkitError(
                        f"the init checkpoint's tokenizer does not fit the task {task}: {action!r} decodes as {back!r}",
                        "start from a policy whose tokenizer covers the task vocabulary (graftkit train sft)",
                    )


def _ckpt_dir(cfg: GRPOConfig) -> Path:
    return rl_checkpoints(cfg.out)


def _rng_state() -> dict[str, torch.Tensor]:
    return {"rng.torch": torch.get_rng_state()}


def _opt_state(opt: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for p, name in zip(opt.param_groups[0]["params"], names):
        st = opt.state.get(p, {})
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"opt.{name}.{k}"] = v
            else:
                scalars[f"{name}.{k}"] = v
    return tensors, scalars


def _load_opt_state(opt: torch.optim.Optimizer, names: list[str], tensors: dict, scalars: dict) -> None:
    for p, name in zip(opt.param_groups[0]["params"], names):
        st = {}
        for key, v in tensors.items():
            if key.startswith(f"opt.{name}."):
                k = key[len(f"opt.{name}."):]
                st[k] = v if k == "step" else v.to(p.device)  # AdamW keeps its step count on the CPU
        for key, v in scalars.items():
            if key.startswith(f"{name}."):
                st[key[len(name) + 1:]] = v
        if st:
            opt.state[p] = st


def latest_checkpoint(cfg: GRPOConfig) -> Path | None:
    folder = _ckpt_dir(cfg)
    done = sorted(p for p in folder.glob("step-*") if (p / STATE).is_file()) if folder.is_dir() else []
    return done[-1] if done else None


@dataclass
class TrainState:
    """What a GRPO run holds while it trains: the policy (whose model the optimiser updates), the frozen SFT
    reference, the optimiser and where the model runs."""

    cfg: GRPOConfig
    policy: Policy
    ref: torch.nn.Module | None  # the SFT reference (β > 0 only), frozen
    adapter: object | None  # with LoRA, the PEFT model; its adapters live inside ``policy.model``'s modules
    trained: list[tuple[str, torch.nn.Parameter]]  # (name, parameter) the optimiser updates, in its order
    opt: torch.optim.Optimizer
    dev: torch.device
    compute: torch.dtype  # autocast dtype; the master weights stay float32
    synced: bool = True  # whether a rollout engine (policy.engine) holds the model's current weights
    sync_seconds: float = 0.0  # the last sync's time (inside the generation time it belongs to)

    @property
    def model(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.trained]


def run_grpo(
    cfg: GRPOConfig,
    *,
    resume: bool = False,
    force: bool = False,
    on_step: Callable[[dict], None] = lambda m: None,
    on_checkpoint: Callable[[Path], None] = lambda folder: None,
) -> Path:
    """Train per ``cfg``; returns the final policy folder (an HF folder with graftkit.json). ``on_step`` gets
    each step's metrics; ``on_checkpoint`` each resumable checkpoint's folder once it is written."""
    torch.set_num_threads(cfg.threads)
    tr = setup(cfg)
    try:
        return _train(tr, resume=resume, force=force, on_step=on_step, on_checkpoint=on_checkpoint)
    finally:
        tr.policy.close()  # a vLLM rollout engine, if there is one


def _train(tr: TrainState, *, resume: bool, force: bool, on_step, on_checkpoint) -> Path:
    cfg = tr.cfg
    start, log = restore(tr, resume=resume, force=force)
    tr.synced = start == 0
    _check_room(cfg, tr.model, tr.adapter)  # before training, not when the first checkpoint is written
    tr.model.train()
    per_stage = cfg.steps // cfg.stages if cfg.stages else 1
    t_start = time.perf_counter() - (log[-1]["seconds"] if log else 0.0)
    stage: list[tuple[list[Episode], Rows]] = []
    for step in range(start, cfg.steps):
        t_gen = time.perf_counter()
        fresh = step % per_stage == 0 or not stage
        if fresh:  # rollouts: every step, or once per stage (Mu-GRPO)
            stage = generate(tr, first=step - step % per_stage, steps=per_stage)
        gen_seconds = time.perf_counter() - t_gen if fresh else 0.0
        episodes, rows = stage[step % per_stage]
        token_adv, weight, stats = row_advantages(cfg, episodes, rows)
        t_opt = time.perf_counter()
        lr = lr_at(cfg, step)
        loss, update = optimise(tr, rows, token_adv, weight, lr)
        m = {"step": step + 1, "loss": loss, **stats, **update, "lr": lr, "tokens": int(rows.mask.sum()),
             "episodes": len(episodes), "staleness": step % per_stage, "gen_seconds": gen_seconds,
             **({"sync_seconds": tr.sync_seconds if fresh else 0.0} if tr.policy.engine is not None else {}),
             "opt_seconds": time.perf_counter() - t_opt, "seconds": time.perf_counter() - t_start}
        log.append(m)
        on_step(m)
        if checkpoint_due(cfg, step + 1, per_stage):
            on_checkpoint(_save(cfg, tr.model, tr.policy, log, step + 1, tr.opt, tr.names,
                                _ckpt_dir(cfg) / f"step-{step + 1:06d}", adapter=tr.adapter))
    tr.model.eval()
    return _save(cfg, tr.model, tr.policy, log, cfg.steps, None, tr.names, Path(cfg.out), force=True,
                 dtype=save_dtype(cfg.save_dtype, Path(cfg.init)), adapter=tr.adapter)


def setup(cfg: GRPOConfig) -> TrainState:
    """The policy loaded from ``cfg.init`` onto its device (float32 master weights), its frozen reference when
    β > 0, LoRA adapters when ``lora_r`` > 0, and AdamW over what trains."""
    init = Path(cfg.init)
    dev = resolve_device(cfg.device)
    compute = training_dtype(cfg.dtype, dev)
    model, tok = load_model(init)  # float32 master weights, wherever it trains
    model.to(dev)
    policy = Policy(model, tok, init)
    check_tokenizer_fits(policy, cfg.tasks)
    ref = copy.deepcopy(model).eval() if cfg.beta > 0 else None
    spec = lora_spec(cfg.lora_r, cfg.lora_alpha, cfg.lora_targets)
    check_lora_base(spec, cfg.init)
    adapter = add_lora(model, spec) if spec else None  # the adapters live inside ``model``'s modules
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in trained], lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    if cfg.engine_name == "vllm":  # over the init weights, in the compute dtype
        from ..agent.engine import vllm_engine

        policy.engine = vllm_engine(policy, seed=cfg.seed, dtype=compute)
    return TrainState(cfg, policy, ref, adapter, trained, opt, dev, compute)


def sync_engine(tr: TrainState) -> float:
    """Send the trained weights to the rollout engine if they changed since the last sync (seconds spent); the
    frozen ones are the init's, which the engine was built over."""
    if tr.policy.engine is None or tr.synced:
        return 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        tr.policy.engine.update({n: p.detach().to(tr.compute) for n, p in tr.trained})
    tr.synced = True
    return time.perf_counter() - t0


def restore(tr: TrainState, *, resume: bool, force: bool) -> tuple[int, list[dict]]:
    """With ``resume``, the newest checkpoint's weights, optimiser and RNG state loaded into ``tr``: returns the
    step to continue from and the log so far; else ``(0, [])``, once the output folder may be written."""
    cfg = tr.cfg
    ckpt = latest_checkpoint(cfg) if resume else None
    if resume and ckpt is None and _ckpt_dir(cfg).exists():
        raise GraftkitError(f"--resume: no complete checkpoint in {_ckpt_dir(cfg)}", "run without --resume")
    if ckpt is None:
        if Path(cfg.out).exists() and not force:
            raise GraftkitError(f"output folder {cfg.out} already exists", "pass --force to replace it, or --resume")
        return 0, []
    saved = json.loads((ckpt / "graftkit.json").read_text())
    recorded = recorded_grpo(saved["config"])  # a checkpoint from before --trainer: its fields as named today
    mine = {k: v for k, v in cfg.as_dict().items() if k not in NOT_TRAINING}  # where, not how it trains
    if {k: v for k, v in recorded.items() if k not in NOT_TRAINING} != mine:
        diff = sorted(k for k in mine if recorded.get(k) != mine[k])
        raise GraftkitError(f"--resume: {ckpt} was written with a different config (differs in {', '.join(diff)})",
                            "resume with the same settings, or start a new run without --resume")
    if tr.adapter is not None:
        load_adapter_state(tr.adapter, read_tensors(ckpt / "adapter_model.safetensors"))
    else:
        ck_model, _ = load_model(ckpt)  # intermediate checkpoints hold the float32 master weights
        tr.model.load_state_dict(ck_model.state_dict())
    state = read_tensors(ckpt / STATE)
    _load_opt_state(tr.opt, tr.names, state, saved["optimizer_scalars"])
    torch.set_rng_state(state["rng.torch"])
    return saved["step"], [json.loads(line) for line in (ckpt / LOG).read_text().splitlines() if line]


def generate(tr: TrainState, *, first: int, steps: int) -> list[tuple[list[Episode], Rows]]:
    """The rollouts of steps ``first`` … ``first + steps − 1``, sampled at once by the current policy: per step,
    its ``prompts_per_step × group_size`` episodes and their rows, with the sampling policy's log-probs (when an
    update will not be on-policy) and the reference's (β > 0)."""
    cfg, model = tr.cfg, tr.model
    plan = [_prompts(cfg, s) for s in range(first, first + steps)]
    jobs = [(t, env_seed, k) for prompts in plan for (t, env_seed, _) in prompts for k in range(cfg.group_size)]
    decode = Decode(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p,
                    max_new_tokens=cfg.max_new_tokens, seed=cfg.seed * 1_000_003 + first)
    tr.sync_seconds = sync_engine(tr)
    model.eval()
    with autocast(tr.dev, tr.compute):
        episodes = rollout(tr.policy, jobs, decode, batch_size=max(64, cfg.prompts_per_step * cfg.group_size),
                           max_turns=cfg.max_turns)
    n = cfg.prompts_per_step * cfg.group_size
    batches = []
    for j in range(steps):
        eps_j = episodes[j * n:(j + 1) * n]
        rows = episode_rows(eps_j, tr.policy.pad_id)
        with torch.no_grad(), autocast(tr.dev, tr.compute):
            # On-policy with one update per batch, the sampling policy is the current one:
            # old log-probs are sg[logp] of the update's own forward pass (TRL does the same).
            if cfg.num_iterations > 1 or steps > 1:
                rows.old_logp = action_logp(model, rows, cfg.temperature)[0]
            rows.ref_logp = action_logp(tr.ref, rows, cfg.temperature)[0] if tr.ref is not None else None
        batches.append((eps_j, rows))
    model.train()
    return batches


def checkpoint_due(cfg: GRPOConfig, done: int, per_stage: int) -> bool:
    """Whether a resumable checkpoint follows step ``done`` (1-based): every ``checkpoint_every`` steps, on a
    stage boundary (a stage's rollouts are not saved, so a run resumes at a stage's start), never after the last."""
    return bool(cfg.checkpoint_every) and done % cfg.checkpoint_every == 0 and done % per_stage == 0 and done < cfg.steps


def lr_at(cfg: GRPOConfig, step: int) -> float:
    """Linear warmup over ``cfg.warmup`` steps, then constant."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else cfg.lr


def optimise(tr: TrainState, rows: Rows, token_adv: torch.Tensor, weight: torch.Tensor, lr: float) -> tuple[float, dict]:
    """``num_iterations`` AdamW updates at ``lr`` on ``LOSSES[cfg.loss]`` over one batch (``token_adv [R, T]``,
    focal ``weight [R]``; Mu-GRPO's veto when ``veto_epsilon`` is set), gradient norm clipped. Returns the last
    update's loss and its metrics, the policy's entropy and the gradient norm before clipping."""
    cfg, model = tr.cfg, tr.model
    for g in tr.opt.param_groups:
        g["lr"] = lr
    for _ in range(cfg.num_iterations):
        with autocast(tr.dev, tr.compute):
            logp, entropy = action_logp(model, rows, cfg.temperature)  # [R, T]
        old_logp = rows.old_logp if rows.old_logp is not None else logp.detach()
        veto = None
        if cfg.veto_epsilon is not None:
            adv_row = token_adv.sum(-1) / rows.mask.sum(-1).clamp(min=1)  # [R]
            veto = trajectory_veto(rows, logp, old_logp, adv_row, cfg.veto_epsilon)
        loss, metrics = LOSSES[cfg.loss](
            logp, old_logp, token_adv, rows.mask, ref_logp=rows.ref_logp, eps_low=cfg.epsilon,
            eps_high=cfg.eps_high, beta=cfg.beta, max_len=cfg.max_new_tokens, weight=weight, veto=veto)
        tr.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_([p for _, p in tr.trained], cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
        tr.opt.step()
        tr.synced = False
    return loss.item(), {**{k: float(v) for k, v in metrics.items()}, "entropy": entropy, "grad_norm": gnorm.item()}


def _check_room(cfg: GRPOConfig, model, adapter) -> None:
    """The output (and checkpoint) folders can be written and their disk holds the final policy (float32 at
    most) plus one resumable checkpoint (weights, Adam's two moments) where ``checkpoint_every`` asks."""
    params = [p for p in model.parameters() if p.requires_grad] if adapter is not None else list(model.parameters())
    numel = sum(p.numel() for p in params)
    check_output_room(Path(cfg.out), 4 * numel * (4 if cfg.checkpoint_every else 1), "--out",
                      f"the policy {cfg.out}" + (" and its checkpoints" if cfg.checkpoint_every else ""))


def _save(cfg, model, policy, log, step, opt, names, dest: Path, force: bool = True, dtype=None, adapter=None) -> Path:
    """A checkpoint of the run: resumable ones (``opt`` given) in the float32 master weights, the final policy
    in ``dtype``; with LoRA (``adapter``, the PEFT model) a PEFT adapter folder over ``cfg.init``."""
    from ..weights import describe, open_checkpoint

    parent = describe(open_checkpoint(cfg.init))
    provenance = {
        "producer": "graftkit train grpo",
        "graftkit_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.as_dict(),
        "step": step,
        "parents": [{"role": "sft", **parent}],
        "base_model": {"path": parent["path"], "fingerprint": parent["fingerprint"]},
        "items": {"split": SPLIT_RULE, "prompts": f"{ITEMS} (task and item of every prompt, in order)"},
        "precision": {"compute_dtype": dtype_name(training_dtype(cfg.dtype, resolve_device(cfg.device))),
                      "saved_dtype": dtype_name(dtype or torch.float32), "convention": TRAINING_CONVENTION,
                      "device": str(next(model.parameters()).device)},
    }
    extra_tensors = None
    if opt is not None:
        extra_tensors, scalars = _opt_state(opt, names)
        extra_tensors.update(_rng_state())
        provenance["optimizer_scalars"] = scalars
    log_bytes = "".join(json.dumps(m) + "\n" for m in log).encode()
    items = "".join(f"{t}\t{i}\n" for t, i in prompt_items(cfg, step)).encode()
    if adapter is not None:
        provenance["lora"] = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "targets": list(adapter.peft_config["default"]
                              .target_modules), "base": str(Path(cfg.init).resolve())}
        return save_adapter(dest, adapter_state(adapter), adapter.peft_config["default"].to_dict(), policy.tokenizer,
                            base=Path(cfg.init), provenance=provenance, force=force, inputs=[Path(cfg.init)],
                            extra_files={LOG: log_bytes, ITEMS: items}, extra_tensors=extra_tensors, dtype=dtype)
    return save_model(dest, model, policy.tokenizer, provenance=provenance, force=force, inputs=[Path(cfg.init)],
                      extra_files={LOG: log_bytes, ITEMS: items}, extra_tensors=extra_tensors, dtype=dtype)
