"""``graftkit kl``: how far two policies' behaviour differs, token by token, on each one's own rollouts.

For a policy π_RL (``--model``) and its base π_SFT (``--base``, default the parent recorded in graftkit.json),
each plays its own rollouts once (sampled at temperature 1 on the episodes evaluation plays:
:func:`graftkit.agent.kl.play_fixed`), and both policies score both sets by teacher forcing
(:func:`graftkit.agent.kl.score_pair`):

- KL(π_RL‖π_SFT) on RL's rollouts: how unlikely SFT finds what RL now does (forward KL on the new behaviour,
  the quantity "RL's Razor" ties to forgetting);
- KL(π_SFT‖π_RL) on SFT's rollouts: how much of what SFT did RL has moved away from;

each per task and pooled over tasks, as a mean per action token (Σ KL / Σ tokens) and per episode (Σ KL over
the episode's action tokens), with a clustered bootstrap interval over items (:func:`graftkit.stats.ratio_interval`,
:func:`graftkit.stats.mean_interval`; an item seen twice is one cluster, as ``eval`` pairs by item). And what
moved: log π_RL − log π_SFT of every played action token on both sets, aggregated per token string and per
action string (an action's value is the sum over its tokens, log π_RL(action) − log π_SFT(action)), the
top N each way. Conventions (direction, token selection, temperature, dtype, log base) are
:data:`graftkit.agent.kl.CONVENTIONS`, stored in the result beside the values (:class:`KLResult`, kind ``kl``).

With ``--all-checkpoints`` a trainer's output_dir is its training trajectory: every checkpoint in step order against
the same base. SFT's rollouts are played once and scored by each checkpoint (forward passes), each checkpoint plays
its own with the same decode seed, so each step's result is the one ``kl --model OUTPUT_DIR/checkpoint-N`` writes,
bit for bit, and records its ``step`` and ``trainer_run``; :class:`KLTrajectory` is one row per step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..core.config import OnProgress, no_progress, opt
from ..core.errors import GraftkitError
from ..results.layout import KL, RESULTS, glob_pattern, kl_path_of, result_labels, run_layout
from ..results.store import Result, View, write_result
from ..stats import mean_interval, ratio_interval, wilson_interval
from .commands import EpisodeOptions, check_obs

SIDES = ("rl", "sft")  # graftkit.agent.kl.SIDES, spelled here so that reading a result loads no torch
#: Whose rollouts each side's KL is on, and its direction.
SIDE_KL = {"rl": "KL(π_RL‖π_SFT) on RL's rollouts", "sft": "KL(π_SFT‖π_RL) on SFT's rollouts"}
PER = ("token", "episode")
WHAT = ("token", "action")
DIRECTIONS = ("gained", "lost")
TOP_RULE = ("log π_RL − log π_SFT of each played action token on both sides' rollouts (an action: the sum over its "
            "tokens), averaged per token string (the token decoded alone) or action string (the turn's output as the "
            "task read it) over its occurrences; gained: the largest positive "
            "means, lost: the most negative, ties by occurrences; strings seen fewer than min_count times left out")
BOUNDS = ("estimate", "low", "high")


@dataclass(frozen=True, kw_only=True)
class KLConfig(EpisodeOptions):
    """``graftkit kl``: per-token KL between a policy and its base on each one's own rollouts."""

    command = "kl"
    model: Path = opt(flags=("--model", "--from"))
    """The RL policy (--from as graft and delta name it): an HF causal LM folder with its tokenizer, a PEFT LoRA adapter
    (merged into --base in memory), or a trainer's output_dir (its last checkpoint)."""
    base: Path | None = opt(None, flags=("--base",))
    """The SFT policy it is compared with (default: the parent recorded in --model's graftkit.json, or a LoRA
    adapter's base)."""
    all_checkpoints: bool = False
    """A trainer's output_dir given to --model stands for every one of its checkpoints, in step order (the training
    trajectory), each compared with the same --base, whose rollouts are played once: one result per checkpoint and a
    row per step."""
    top: int = 10
    """Token and action strings listed each way (gained, lost probability)."""
    min_count: int = 1
    """Leave out of the top lists strings played fewer times than this."""
    forward_batch: int = 16
    """Turns per teacher-forced forward pass."""
    seed: int = 0
    """Seed of the rollouts' sampling generators (each row seeded from it, the task, env seed and sample)."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/kl-<model>-vs-<base>.h5)."""
    level: float = 0.95
    """Level of the intervals."""
    n_boot: int = 10_000
    """Bootstrap resamples of each interval."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_obs(self.obs, self.backend)
        if self.obs != "text":
            raise GraftkitError("graftkit kl scores text observations only (--obs som turns carry images that the "
                                "teacher-forced batches do not)", "drop --obs som")
        for name, low in (("top", 1), ("min_count", 1), ("forward_batch", 1), ("n_boot", 1), ("seed", 0)):
            if getattr(self, name) < low:
                raise GraftkitError(f"--{name.replace('_', '-')} {getattr(self, name)} must be ≥ {low}",
                                    f"pass e.g. --{name.replace('_', '-')} {max(low, 10)}")
        if not 0 < self.level < 1:
            raise GraftkitError(f"--level {self.level} must be in (0, 1)", "pass e.g. --level 0.95")
        if self.temperature != 1.0 or self.top_p != 1.0:
            raise GraftkitError("graftkit kl compares the policies' own distributions at temperature 1 and top-p 1",
                                "drop --temperature and --top-p")
        self.check_episodes()
        self.check_models(self.base)
        if self.all_checkpoints and self.save is not None:
            raise GraftkitError("--save names one result file, but --all-checkpoints writes one per checkpoint",
                                f"drop --save: each checkpoint's result goes to RUN/{RESULTS}/"
                                f"{glob_pattern(KL, a='RUN-checkpoint-N', b='BASE')}")


# ------------------------------------------------------------------------------------------- view


@dataclass(frozen=True)
class KLResult(View):
    """A ``kl`` result (:func:`kl_result`) read by name. Per side (whose rollouts: rl, sft) and episode
    ``kl_episode[side, task, seed, episode]`` (Σ KL over its action tokens, nats) and ``tokens``; per action token
    ``token_kl``, ``token_log_ratio`` (log π_RL − log π_SFT of the played token), ``token_id``, ``token_side``,
    ``token_episode``; the summaries ``kl_mean[side, scope, per, bound]`` (scope: each task, then ``all``; per:
    token, episode) and the top lists ``top_text``, ``top_log_ratio``, ``top_count`` ``[what, direction, rank]``."""

    KINDS = (KL,)
    PRODUCER = "graftkit kl"

    @property
    def sides(self) -> list[str]:
        return self.labels("side")

    @property
    def tasks(self) -> list[str]:
        return self.labels("task")

    @property
    def scopes(self) -> list[str]:
        """Each task, then ``all`` (pooled over tasks)."""
        return self.labels("scope")

    def summary(self, side: str, scope: str = "all", per: str = "token") -> tuple[float, float, float]:
        """(estimate, low, high) of the mean KL on ``side``'s rollouts per action token or per episode, over one
        task or all (``scope``)."""
        v = np.asarray(self.result["kl_mean"])[self.sides.index(side), self.scopes.index(scope), PER.index(per)]
        return float(v[0]), float(v[1]), float(v[2])

    def episode_kl(self, side: str) -> np.ndarray:
        """Σ KL over each episode's action tokens ``[task, seed, episode]`` (nats)."""
        return np.asarray(self.result["kl_episode"][self.sides.index(side)])

    def tokens(self, side: str) -> np.ndarray:
        """Action tokens per episode ``[task, seed, episode]``."""
        return np.asarray(self.result["tokens"][self.sides.index(side)])

    def parsed(self, side: str, scope: str = "all") -> float:
        """The share of ``side``'s rollout turns whose output parsed, over one task or all (NaN in a result that
        did not record it)."""
        if "invalid" not in self.result.data:
            return float("nan")
        pick = slice(None) if scope == "all" else self.tasks.index(scope)
        i = self.sides.index(side)
        turns = int(np.asarray(self.result["turns"][i])[pick].sum())
        return 1.0 - int(np.asarray(self.result["invalid"][i])[pick].sum()) / turns if turns else float("nan")

    def success(self, side: str, scope: str = "all"):
        """The success rate of ``side``'s rollouts (sampled at temperature 1) over one task or all, with its Wilson
        interval (:class:`~graftkit.stats.RateInterval`)."""
        pick = slice(None) if scope == "all" else self.tasks.index(scope)
        won = np.asarray(self.result["success"][self.sides.index(side)])[pick]
        return wilson_interval(int(won.sum()), int(won.size), float(self.attrs.get("config", {}).get("level", 0.95)))

    @property
    def step(self) -> int | None:
        """N of the checkpoint-N this result measured, where ``kl --all-checkpoints`` wrote it (else None)."""
        step = self.attrs.get("step")
        return None if step is None else int(step)

    @property
    def trainer_run(self) -> str | None:
        """The trainer's output_dir whose checkpoint this result measured, where ``kl --all-checkpoints`` wrote it."""
        run = self.attrs.get("trainer_run")
        return None if run is None else str(run)

    def token_values(self, side: str, name: str = "token_kl") -> np.ndarray:
        """A per-token array (``token_kl``, ``token_log_ratio``, ``token_id``, ``token_episode``) of ``side``'s
        rollouts, in flat token order."""
        pick = np.asarray(self.result["token_side"]) == side
        return np.asarray(self.result[name])[pick]

    def top(self, what: str = "token", direction: str = "gained") -> list[dict]:
        """The strings (token or action) that gained or lost the most probability under RL: ``text``,
        ``log_ratio`` (mean log π_RL − log π_SFT), ``count`` (occurrences), best first."""
        i, j = WHAT.index(what), DIRECTIONS.index(direction)
        text, ratio, count = (np.asarray(self.result[n])[i, j] for n in ("top_text", "top_log_ratio", "top_count"))
        return [{"text": str(t), "log_ratio": float(r), "count": int(c)} for t, r, c in zip(text, ratio, count) if c > 0]

    @property
    def conventions(self) -> Mapping:
        return self.attrs.get("conventions", {})

    @property
    def file_items(self) -> dict[str, int]:
        """Per user's file (``FILE.jsonl``) among the tasks, its number of items."""
        return {str(t): int(n) for t, n in (self.attrs.get("file_items") or {}).items()}

    def notes(self) -> list[str]:
        """How the rollouts covered each user's file, and a line for each side and task where most outputs did not
        parse (the flags that read another format)."""
        from ..verifiable.format import FORMAT_FIX, MOSTLY_UNPARSED

        out = []
        items = np.asarray(self.result["item"], dtype=object)
        if self.attrs.get("whole_files"):
            from ..verifiable.user import coverage, coverage_note

            for t, n in self.file_items.items():
                out.append(coverage_note(t, coverage(items[self.tasks.index(t)], n), len(self.attrs["seeds"]),
                                         int(self.attrs["episodes"])))
        problems = set(self.attrs.get("task_sources") or {})
        for t in self.tasks:
            for s in self.sides:
                share = 1.0 - self.parsed(s, t)
                if share > MOSTLY_UNPARSED:
                    fmt = ((self.attrs.get("prompt_formats") or {}).get(t) or {}).get("answer_format", "tags")
                    what = f"completions stated no answer in the answer format {fmt}" if t in problems else \
                        "turns did not parse as an action"
                    out.append(f"{t}: {100 * share:.0f}% of {s.upper()}'s {what}" + (f"; {FORMAT_FIX}" if t in problems
                                                                                     else ""))
        return out

    @property
    def model_path(self) -> str:
        return str(self.attrs.get("model", {}).get("path", ""))

    @property
    def base_path(self) -> str:
        return str(self.attrs.get("base", {}).get("path", ""))

    def rows(self) -> list[dict]:
        """Per task and pooled (``all``): items, and per side tokens, episodes, KL per token and per episode
        with their intervals (what ``graftkit kl --json`` prints under ``tasks``)."""
        items = np.asarray(self.result["item"], dtype=object)  # [task, seed, episode]
        distinct = [len({str(x) for x in items[a].ravel()}) for a in range(len(self.tasks))]
        sizes = self.file_items
        out = []
        for scope in self.scopes:
            pick = slice(None) if scope == "all" else self.tasks.index(scope)
            row = {"task": scope, "items": sum(distinct) if scope == "all" else distinct[pick],
                   **({"file_items": sizes[scope]} if scope in sizes else {})}
            for s in self.sides:
                n = self.tokens(s)[pick]
                row[s] = {"tokens": int(n.sum()), "episodes": int(np.size(n)), "parsed": self.parsed(s, scope),
                          "kl_per_token": list(self.summary(s, scope, "token")),
                          "kl_per_episode": list(self.summary(s, scope, "episode"))}
            out.append(row)
        return out


# --------------------------------------------------------------------------------------- building


def _clusters(tasks, items: np.ndarray) -> np.ndarray:
    """``task/item`` of every episode ``[task, seed, episode]``: an item played twice is one cluster."""
    return np.array([f"{t}/" for t in tasks], dtype=object)[:, None, None] + items.astype(object)


def _summaries(kl_ep: np.ndarray, tokens: np.ndarray, clusters: np.ndarray, scopes, level: float, n_boot: int
               ) -> np.ndarray:
    """``[side, scope, per, bound]``: KL per token (a ratio of sums) and per episode, with intervals over items."""
    out = np.full((len(SIDES), len(scopes), len(PER), 3), np.nan)
    for i in range(len(SIDES)):
        for j, scope in enumerate(scopes):
            pick = slice(None) if scope == "all" else j
            k, n, c = kl_ep[i][pick].ravel(), tokens[i][pick].ravel(), clusters[pick].ravel()
            out[i, j, 0] = ratio_interval(k, n, level, n_boot, clusters=c).bounds
            out[i, j, 1] = mean_interval(k, level, n_boot, clusters=c).bounds
    return out


def top_strings(texts, values: np.ndarray, n: int, min_count: int = 1) -> dict[str, list[tuple[str, float, int]]]:
    """Per direction (gained, lost), up to ``n`` ``(text, mean value, count)`` of the strings ``texts`` with the
    largest positive and the most negative mean of ``values`` over their occurrences (:data:`TOP_RULE`)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for t, v in zip(texts, np.asarray(values, np.float64)):
        sums[t] += float(v)
        counts[t] += 1
    means = [(t, sums[t] / counts[t], counts[t]) for t in sums if counts[t] >= min_count]
    gained = sorted((m for m in means if m[1] > 0), key=lambda m: (-m[1], -m[2], m[0]))[:n]
    lost = sorted((m for m in means if m[1] < 0), key=lambda m: (m[1], -m[2], m[0]))[:n]
    return {"gained": gained, "lost": lost}


def _top_arrays(tops: Mapping[str, Mapping[str, list]], n: int) -> dict[str, tuple]:
    text = np.full((len(WHAT), len(DIRECTIONS), n), "", dtype=object)
    ratio = np.full((len(WHAT), len(DIRECTIONS), n), np.nan)
    count = np.zeros((len(WHAT), len(DIRECTIONS), n), np.int64)
    for i, what in enumerate(WHAT):
        for j, d in enumerate(DIRECTIONS):
            for r, (t, m, c) in enumerate(tops[what][d]):
                text[i, j, r], ratio[i, j, r], count[i, j, r] = t, m, c
    dims = ("what", "direction", "rank")
    return {"top_text": (dims, text), "top_log_ratio": (dims, ratio), "top_count": (dims, count)}


def kl_result(fixed: Mapping, scores: Mapping, token_text: Mapping, action_text: Mapping, cfg: KLConfig,
              attrs: Mapping) -> Result:
    """The labelled ``kl`` result from each side's fixed episodes (:class:`~graftkit.agent.kl.FixedEpisodes`), its
    :class:`~graftkit.agent.kl.PairScores` (P = the side that played), and the text of every played token and
    turn action per side (for the top lists)."""
    from ..agent.kl import CONVENTIONS
    from ..agent.tasks import prompt_formats, task_sources, task_spec

    f0 = fixed["rl"]
    sizes = {t: n for t in f0.tasks if (n := task_spec(t).items) is not None}
    if fixed["sft"].shape != f0.shape or fixed["sft"].tasks != f0.tasks:
        raise GraftkitError("RL's and SFT's rollouts cover different episodes", "play both on one grid")
    scopes = [*f0.tasks, "all"]
    kl_ep = np.stack([fixed[s].per_episode(scores[s].kl) for s in SIDES])
    tokens = np.stack([fixed[s].tokens() for s in SIDES])
    items = f0.items()
    summ = _summaries(kl_ep, tokens, _clusters(f0.tasks, items), scopes, cfg.level, cfg.n_boot)
    # log π_RL − log π_SFT of the played token: on RL's rollouts P = RL, on SFT's P = SFT
    ratio = {"rl": scores["rl"].logp_p - scores["rl"].logp_q, "sft": scores["sft"].logp_q - scores["sft"].logp_p}
    tok_texts = [t for s in SIDES for t in token_text[s]]
    tok_ratio = np.concatenate([ratio[s] for s in SIDES]).astype(np.float64)
    act_texts, act_ratio = [], []
    for s in SIDES:
        turn_of = np.repeat(np.arange(len(action_text[s])), [len(t.action_ids) for _, t in fixed[s].turns()])
        act_ratio.append(np.bincount(turn_of, weights=ratio[s].astype(np.float64), minlength=len(action_text[s])))
        act_texts += list(action_text[s])
    tops = {"token": top_strings(tok_texts, tok_ratio, cfg.top, cfg.min_count),
            "action": top_strings(act_texts, np.concatenate(act_ratio), cfg.top, cfg.min_count)}
    n_tok = {s: fixed[s].n_tokens for s in SIDES}
    coords = {"side": np.array(SIDES, dtype=object), "task": np.array(f0.tasks, dtype=object),
              "seed": np.array(f0.seeds), "episode": np.arange(f0.episodes), "scope": np.array(scopes, dtype=object),
              "per": np.array(PER, dtype=object), "bound": np.array(BOUNDS, dtype=object),
              "token": np.arange(sum(n_tok.values())), "what": np.array(WHAT, dtype=object),
              "direction": np.array(DIRECTIONS, dtype=object), "rank": np.arange(cfg.top)}
    side_dims = ("side", "task", "seed", "episode")
    data = {
        "kl_episode": (side_dims, kl_ep), "tokens": (side_dims, tokens),
        "success": (side_dims, np.stack([fixed[s].success() for s in SIDES])),
        "invalid": (side_dims, np.stack([fixed[s].invalid() for s in SIDES])),
        "turns": (side_dims, np.stack([fixed[s].n_turns() for s in SIDES])),
        "item": (("task", "seed", "episode"), items),
        "kl_mean": (("side", "scope", "per", "bound"), summ),
        "token_side": (("token",), np.array([s for s in SIDES for _ in range(n_tok[s])], dtype=object)),
        "token_episode": (("token",), np.concatenate([fixed[s].token_episode() for s in SIDES])),
        "token_id": (("token",), np.concatenate([fixed[s].token_ids() for s in SIDES])),
        "token_kl": (("token",), np.concatenate([scores[s].kl for s in SIDES]).astype(np.float32)),
        "token_log_ratio": (("token",), tok_ratio.astype(np.float32)),
        **_top_arrays(tops, cfg.top),
    }
    var_attrs = {
        "kl_episode": {"what": "Σ over the episode's action tokens of KL(π_side‖π_other): " + "; ".join(
            SIDE_KL.values()), "unit": "nats"},
        "tokens": {"what": "action tokens per episode (turn-end tokens included)"},
        "success": {"what": "outcome of each side's rollout (sampled at temperature 1)"},
        "invalid": {"what": "turns of each side's rollout whose output did not parse (a web action, or an answer in "
                            "the task's answer format)"},
        "turns": {"what": "turns of each side's rollout"},
        "item": {"what": "each episode's item id (both sides play the same items)"},
        "kl_mean": {"what": "per token: Σ KL / Σ tokens; per episode: mean over episodes of Σ KL; scope: each task, "
                            "then all tasks pooled", "interval": "clustered by task/item: per token "
                            "graftkit.stats.ratio_interval, per episode graftkit.stats.mean_interval",
                    "level": cfg.level, "n_boot": cfg.n_boot, "unit": "nats"},
        "token_episode": {"what": "flat index of the token's episode in [task, seed, episode]"},
        "token_kl": {"what": "KL(π_side‖π_other) at the token", "unit": "nats"},
        "token_log_ratio": {"what": "log π_RL(a_t) − log π_SFT(a_t) of the played token", "unit": "nats"},
        "top_log_ratio": {"rule": TOP_RULE, "unit": "nats"},
    }
    return Result(KL, coords, data, {
        **attrs, "sides": dict(SIDE_KL), "tasks": list(f0.tasks), "seeds": list(f0.seeds), "episodes": f0.episodes,
        "tasks_without_items": list(f0.no_items), "conventions": {**CONVENTIONS, "top": TOP_RULE},
        **({"file_items": sizes, "whole_files": sorted(set(sizes) if cfg.items == "all" else
                                                      set(sizes) & set(cfg.whole_tasks))} if sizes else {}),
        "task_sources": task_sources(f0.tasks), "prompt_formats": prompt_formats(f0.tasks),
        "config": cfg.as_dict(),
    }, var_attrs)


# ---------------------------------------------------------------------------------------------- run


@dataclass(frozen=True)
class KLRun:
    """What :func:`run_kl` wrote: the result's view, its file, and the seconds of each stage."""

    result: KLResult
    file: Path
    seconds: Mapping[str, float]

    def as_json(self) -> dict:
        """What ``graftkit kl --json`` prints."""
        v = self.result
        return {"model": v.model_path, "base": v.base_path, "sides": dict(SIDE_KL), "tasks": v.rows(), "notes": v.notes(),
                "top": {what: {d: v.top(what, d) for d in DIRECTIONS} for what in WHAT},
                "seeds": len(v.attrs["seeds"]), "episodes": v.attrs["episodes"], "conventions": dict(v.conventions),
                "file": str(self.file), "seconds": dict(self.seconds)}

    def tables(self) -> list:
        """What ``graftkit kl`` prints (:class:`~graftkit.core.tables.Table` s and lines, from :meth:`as_json`): per
        task and pooled, each side's tokens and KL per token and per episode with intervals; the tokens and the
        actions that gained and lost the most probability under RL; where the result went."""
        from ..core.tables import Table, bounds_text

        from ..core.tables import items_text, percent

        j = self.as_json()
        columns = {"task": lambda r: r["task"], "items": items_text}
        for s, (p, q) in (("rl", ("RL", "SFT")), ("sft", ("SFT", "RL"))):
            columns |= {f"{p} tokens": lambda r, s=s: str(r[s]["tokens"]),
                        f"{p} parsed": lambda r, s=s: percent(r[s]["parsed"]),
                        f"KL({p}‖{q})/token [95%]": lambda r, s=s: bounds_text(r[s]["kl_per_token"]),
                        f"KL({p}‖{q})/episode [95%]": lambda r, s=s: bounds_text(r[s]["kl_per_episode"])}
        out: list = [Table(f"{j['model']} (RL) vs {j['base']} (SFT): KL in nats on each policy's own rollouts "
                           f"({j['seeds']} seeds × {j['episodes']} episodes per task, T=1; intervals over items)",
                           columns, j["tasks"], left=("task",))]
        for what in WHAT:
            rows = [{"direction": d, **r} for d in DIRECTIONS for r in j["top"][what][d]]
            out.append(Table(
                f"{what}s that gained and lost the most probability under RL (mean over occurrences on both rollouts)",
                {"direction": lambda r: r["direction"], what: lambda r: repr(r["text"]),
                 "log π_RL − log π_SFT": lambda r: f"{r['log_ratio']:+.4g}", "count": lambda r: str(r["count"])},
                rows, left=("direction", what), fold=(what,)))
        return out + [f"note: {n}" for n in j["notes"]] + [f"saved {j['file']} ({j['seconds']['total']:.1f} s)"]


@dataclass(frozen=True)
class KLTrajectory:
    """What :func:`run_kl` wrote with ``all_checkpoints``: each checkpoint's :class:`KLRun` in step order, all
    against one base whose rollouts were played once and scored by every checkpoint."""

    run: Path
    """The trainer's output_dir."""
    steps: tuple[int, ...]
    """N of each checkpoint-N, in step order."""
    runs: tuple[KLRun, ...]
    """Each step's run: its result's view and file."""
    seconds: Mapping[str, float]

    def rows(self) -> list[dict]:
        """One per step (what ``graftkit kl --all-checkpoints --json`` prints under ``trajectory``): the step, its
        checkpoint, and per side (whose rollouts: rl, sft) KL per action token with its interval, the share of
        outputs that parsed and the rollouts' success with its Wilson interval (SFT's: the same rollouts at every
        step), pooled over tasks; and the step's result file."""
        out = []
        for step, r in zip(self.steps, self.runs):
            v = r.result
            row = {"step": step, "checkpoint": v.attrs["labels"]["rl"], "model": v.model_path, "file": str(r.file)}
            for s in SIDES:
                won = v.success(s)
                row[s] = {"kl_per_token": list(v.summary(s, "all", "token")), "parsed": v.parsed(s),
                          "success": {"rate": won.rate, "low": won.low, "high": won.high}}
            out.append(row)
        return out

    def notes(self) -> list[str]:
        """Each step's notes once: a note every step gives as it is, another prefixed by the checkpoints it is of."""
        said: dict[str, list[str]] = {}
        for r in self.runs:
            for n in r.result.notes():
                said.setdefault(n, []).append(r.result.attrs["labels"]["rl"])
        return [n if len(who) == len(self.runs) else f"{', '.join(who)}: {n}" for n, who in said.items()]

    def as_json(self) -> dict:
        """What ``graftkit kl --all-checkpoints --json`` prints: the rows, and each step's own JSON."""
        first = self.runs[0].result
        return {"run": str(self.run), "base": first.base_path, "sides": dict(SIDE_KL), "trajectory": self.rows(),
                "notes": self.notes(), "seeds": len(first.attrs["seeds"]), "episodes": first.attrs["episodes"],
                "steps": [r.as_json() for r in self.runs], "files": [str(r.file) for r in self.runs],
                "seconds": dict(self.seconds)}

    def tables(self) -> list:
        """What ``graftkit kl --all-checkpoints`` prints (from :meth:`as_json`): one row per step with KL per token
        each way, the share of outputs that parsed on each side and RL's success; SFT's success; where the results
        went."""
        from ..core.tables import Table, bounds_text, percent

        j = self.as_json()

        def rate(r: dict) -> str:
            return f"{100 * r['rate']:.1f}% [{100 * r['low']:.1f}, {100 * r['high']:.1f}]"

        columns = {"step": lambda r: str(r["step"]), "checkpoint": lambda r: r["checkpoint"],
                   "KL(RL‖SFT)/token [95%]": lambda r: bounds_text(r["rl"]["kl_per_token"]),
                   "KL(SFT‖RL)/token [95%]": lambda r: bounds_text(r["sft"]["kl_per_token"]),
                   "RL parsed": lambda r: percent(r["rl"]["parsed"]), "SFT parsed": lambda r: percent(r["sft"]["parsed"]),
                   "RL success (95% Wilson)": lambda r: rate(r["rl"]["success"])}
        rows = j["trajectory"]
        out: list = [Table(f"{j['run']} (RL, {len(rows)} checkpoints) vs {j['base']} (SFT): KL in nats per action "
                           f"token on each policy's own rollouts, by step ({j['seeds']} seeds × {j['episodes']} "
                           "episodes per task, T=1; intervals over items)", columns, rows, left=("checkpoint",))]
        out.append(f"SFT's rollouts, played once and scored by every checkpoint: success {rate(rows[0]['sft']['success'])}"
                   f" (95% Wilson), {percent(rows[0]['sft']['parsed'])} parsed")
        return out + [f"note: {n}" for n in j["notes"]] + [f"saved {f}" for f in j["files"]] + [
            f"{len(rows)} checkpoints in {j['seconds']['total']:.1f} s"]


def _same_vocabulary(rl, sft, paths: Mapping[str, Path]) -> None:
    """Both policies read and write one tokenizer, and give one logit per token of it."""
    sizes = {k: int(p.model.get_output_embeddings().weight.shape[0]) for k, p in (("rl", rl), ("sft", sft))}
    if rl.tokenizer.get_vocab() != sft.tokenizer.get_vocab() or sizes["rl"] != sizes["sft"]:
        raise GraftkitError(f"{paths['rl']} and {paths['sft']} do not share one tokenizer and vocabulary "
                            f"({sizes['rl']} and {sizes['sft']} output rows): KL compares distributions over one "
                            "vocabulary", "compare a fine-tune with its own base (the same tokenizer files)")


def run_kl(cfg: KLConfig, on_progress: OnProgress = no_progress) -> KLRun | KLTrajectory:
    """Play each policy's own rollouts, score both sets with both policies, write one ``kl`` result (``cfg.save``,
    else ``RUN/results/kl-<model>-vs-<base>.h5``) and return its view.

    With ``cfg.all_checkpoints``, every checkpoint of the trainer run ``cfg.model`` in step order against one base:
    the SFT policy stays loaded and its rollouts are played once (at the first step) and scored by each checkpoint;
    each checkpoint is loaded in turn, plays its own rollouts with the same decode seed, and gets its own result
    (recording its ``step`` and ``trainer_run``). Returns the :class:`KLTrajectory`."""
    from ..agent.engine import resolve_engine
    from ..weights import base_of, checkpoint_of, checkpoints_of
    from ..weights.runs import recorded_step

    t0 = time.perf_counter()
    # a trainer's output_dir: its last checkpoint, or with --all-checkpoints every one in step order
    models = checkpoints_of(cfg.model, all_checkpoints=cfg.all_checkpoints, flag="--model")
    base = checkpoint_of(base_of(models[-1], cfg.base), "--base")
    engine = resolve_engine(cfg.engine)
    if not cfg.all_checkpoints:
        return _kl_step(cfg.replace(model=models[0], base=base), engine, {}, on_progress, t0)
    labels = result_labels(models)
    shared: dict = {}  # the SFT policy, its rollouts and description: one for every step
    runs = []
    for path, label in zip(models, labels):
        step = {"step": recorded_step(path), "trainer_run": str(Path(cfg.model))}
        runs.append(_kl_step(cfg.replace(model=path, base=base), engine, shared, _labelled(on_progress, label),
                             time.perf_counter(), step))
    return KLTrajectory(Path(cfg.model), tuple(recorded_step(p) for p in models), tuple(runs),
                        {"total": time.perf_counter() - t0})


def _labelled(on_progress: OnProgress, label: str) -> OnProgress:
    """``on_progress`` with each bar named after the checkpoint."""
    return lambda what, advance, total, unit: on_progress(f"{label}: {what}", advance, total, unit)


def _kl_step(cfg: KLConfig, engine: str, shared: dict, on_progress: OnProgress, t0: float,
             step: Mapping | None = None) -> KLRun:
    """One ``kl`` result of the checkpoint ``cfg.model`` against ``cfg.base`` (both resolved): what :func:`run_kl`
    does for one checkpoint. ``shared`` keeps the SFT side across the steps of a trajectory (its policy, rollouts,
    placement and description), filled at the first; ``step`` (``step``, ``trainer_run``) goes into the result's
    attrs."""
    from ..agent import load_policy
    from ..agent.kl import play_fixed, score_pair
    from ..agent.load import with_engine
    from ..weights import describe, open_model

    paths = {"rl": Path(cfg.model), "sft": Path(cfg.base)}
    policies = {"rl": load_policy(paths["rl"], no_pickle=cfg.no_pickle, config=cfg.config, base=paths["sft"],
                                  device=cfg.device, dtype=cfg.dtype)}
    if "policy" not in shared:
        shared["policy"] = load_policy(paths["sft"], no_pickle=cfg.no_pickle, config=cfg.config,
                                       device=cfg.device, dtype=cfg.dtype)
    policies["sft"] = shared["policy"]
    _same_vocabulary(policies["rl"], policies["sft"], paths)
    t1 = time.perf_counter()
    items = "heldout" if cfg.items == "auto" else cfg.items
    total = len(cfg.task_list) * cfg.seeds * cfg.episodes
    fixed = {}
    placement = {}
    for s in SIDES:
        if s == "sft" and "fixed" in shared:  # SFT's rollouts: played once for every step of a trajectory
            fixed[s], placement[s] = shared["fixed"], shared["placement"]
            continue
        what = f"{s.upper()} rollouts (T=1)"
        # with --engine vllm each side's rollouts come from an engine of its own, one at a time; scoring is
        # forward passes of the transformers models
        policy = with_engine(policies[s], engine)
        try:
            fixed[s] = play_fixed(policy, s, cfg.task_list, cfg.seed_list, cfg.episodes,
                                  max_new_tokens=cfg.max_new_tokens, decode_seed=cfg.seed, items=items,
                                  whole=cfg.whole_tasks, backend=cfg.backend, batch_size=cfg.batch_size,
                                  on_episode=lambda ep, what=what: on_progress(what, 1, total, "episodes"))
            placement[s] = policy.placement
        finally:
            policy.close()
    shared.update(fixed=fixed["sft"], placement=placement["sft"])
    t2 = time.perf_counter()
    n_tokens = sum(f.n_tokens for f in fixed.values())
    other = {"rl": "sft", "sft": "rl"}
    scores = {s: score_pair(policies[s].model, policies[other[s]].model, fixed[s], policies[s].pad_id,
                            batch_size=cfg.forward_batch,
                            on_tokens=lambda n: on_progress("KL forward passes", n, n_tokens, "tokens"))
              for s in SIDES}
    t3 = time.perf_counter()
    tok = policies["rl"].tokenizer
    ids = {s: fixed[s].token_ids() for s in SIDES}
    shown = {i: tok.decode([i]) for i in set(np.concatenate(list(ids.values())).tolist())}  # each token's own text
    token_text = {s: [shown[i] for i in ids[s].tolist()] for s in SIDES}
    action_text = {s: [t.action for _, t in fixed[s].turns()] for s in SIDES}
    labels = dict(zip(SIDES, result_labels([paths["rl"], paths["sft"]])))
    if "base" not in shared:
        shared["base"] = describe(open_model(paths["sft"], None, no_pickle=cfg.no_pickle, config=cfg.config))
    desc = {"model": describe(open_model(paths["rl"], paths["sft"], no_pickle=cfg.no_pickle, config=cfg.config)),
            "base": shared["base"], "placement": placement["rl"], "labels": labels}
    seconds = {"load": t1 - t0, "rollouts": t2 - t1, "scoring": t3 - t2}
    res = kl_result(fixed, scores, token_text, action_text, cfg, {**desc, "seconds": seconds, **(step or {})})
    dest = cfg.save or kl_path_of(run_layout(cfg.run).results, paths["rl"], paths["sft"])
    written = write_result(dest, res, flag="--save" if cfg.save else None)
    return KLRun(KLResult.from_result(res, written), written, {**seconds, "total": time.perf_counter() - t0})


__all__ = ["DIRECTIONS", "KLConfig", "KLResult", "KLRun", "KLTrajectory", "SIDE_KL", "TOP_RULE", "kl_result", "run_kl",
           "top_strings"]
