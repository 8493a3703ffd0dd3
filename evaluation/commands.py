"""``graftkit eval`` and ``graftkit headroom``: success of a policy on the web tasks, and its headroom.

:func:`run_eval` plays every (task, seed, episode) greedily (or sampled) and reports success per task and
pooled over tasks with 95% Wilson intervals; with a second policy (``compare_to``) it plays the identical
episodes and adds the paired comparison (``stats.compare``: bootstrap and Bayesian intervals, McNemar,
verdict). :func:`run_headroom` plays every episode greedily once and sampled k times and reports greedy
and sampled success, pass@k and the headroom (sampled − greedy, ``stats.headroom``, each greedy episode
paired with its k samples). Both write one result per policy, read back through the typed views
:class:`EvalResult` (kind ``eval``) and :class:`HeadroomResult` (kind ``headroom``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from ..core.config import (CommandConfig, DeviceOption, EngineOption, ExecutorOption, OnProgress, RunOption, check_choice,
                           no_progress, opt)
from ..core.errors import GraftkitError
from ..core.executor import Executor
from ..stats import compare, fold_episodes, headroom, pass_at_k, wilson_interval
from ..results.layout import EVAL, HEADROOM, RESULTS, eval_path, glob_pattern, headroom_path, result_labels, run_layout
from ..results.store import Result, write_result
from ..verifiable.format import FORMAT_FIX, MOSTLY_UNPARSED, PromptOption
from ..webenv.backends import check_backend
from ..webenv.items import SPLIT_RULE

DIMS = ("task", "seed", "episode", "sample")
EPISODE_ARRAYS = ("success", "reward", "turns", "invalid")


def check_obs(obs: str, backend: str) -> None:
    """Validate --backend and --obs before any model loads. ``som`` needs a vision-language policy
    folder (``agent.load_policy`` refuses a text-only one, naming it); ``text`` works with either kind."""
    check_backend(backend)
    if obs not in ("text", "som"):
        raise GraftkitError(f"unknown --obs {obs!r}", "use text (element list) or som (Set-of-Marks screenshot)")


# ------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True, kw_only=True)
class EpisodeOptions(RunOption, DeviceOption, EngineOption, PromptOption):
    """Which policy plays which episodes, and how (the fields ``eval`` and ``headroom`` share)."""

    model: Path = opt(flags=("--model",))
    """Policy: an HF causal LM folder with its tokenizer, an image-text-to-text folder with its processor
    (for --obs som), a PEFT LoRA adapter (merged into --base in memory), or a trainer's output_dir (its last
    checkpoint)."""
    base: Path | None = opt(None, flags=("--base",))
    """Base model folder of a LoRA adapter policy (default: the parent its graftkit.json records, else the adapter's
    base_model_name_or_path when local)."""
    tasks: str = "mastered"
    """Suite (mastered, headroom, all) or comma list of tasks."""
    seeds: int = 25
    """Evaluation seeds 0..N-1."""
    episodes: int = 4
    """Episodes per seed and task."""
    backend: str = "py"
    """py (the pure-Python mirror) or miniwob (real MiniWoB++ in Chromium)."""
    max_new_tokens: int = 32
    """Longest output in tokens: a web action, or a verifiable problem's completion (raise it for reasoning)."""
    obs: str = "text"
    """Observation: text (element list) or som (Set-of-Marks screenshot)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    batch_size: int = 64
    """Episodes advanced together."""
    items: str = "auto"
    """auto (a generated task's held-out items, every item of a user's FILE.jsonl), heldout (only items training
    never draws, of a user's file too: for a file that the run being evaluated trained on, as the study
    does), train (only items training draws: to choose hyperparameters on) or all (every seed's own item)."""
    allow_pickle: bool = False
    """Accepted and changes nothing: pickled weights (.bin/.pt, DCP, DeepSpeed, verl) are read by default, through
    graftkit's restricted unpickler (weights_only, allowlisted classes)."""
    no_pickle: bool = False
    """Read safetensors only: refuse pickled weights (.bin/.pt, DCP, DeepSpeed, verl), naming the file."""
    config: Path | None = None
    """HF folder whose config.json (and tokenizer) a single-file checkpoint uses (default: the other side's
    folder; a policy run from one file needs it)."""

    def check_episodes(self) -> None:
        """Raise on an unknown task or suite, on no seeds, or on an engine that cannot play them (before any model
        loads)."""
        from ..agent import resolve_tasks, seed_list
        from ..agent.engine import resolve_engine

        resolve_tasks(self.tasks, self.prompt_format)
        seed_list(self.seeds)
        check_choice(self.items, ("auto", "heldout", "train", "all"), "--items")
        resolve_engine(self.engine, self.obs)

    def check_models(self, *paths: Path | None) -> None:
        """Raise, before any model loads, on a single checkpoint file without ``--config`` to build it over."""
        from ..weights.hf import single_file_config

        for p in (self.model, *paths):
            if p is not None and Path(p).is_file():
                single_file_config(Path(p), self.config, self.no_pickle)

    @property
    def task_list(self) -> list[str]:
        from ..agent import resolve_tasks

        return resolve_tasks(self.tasks, self.prompt_format)

    @property
    def seed_list(self) -> list[int]:
        from ..agent import seed_list

        return seed_list(self.seeds)

    @property
    def whole_tasks(self) -> tuple[str, ...]:
        """Tasks played on every item: under ``auto``, a user's files. A file is split only where the same run
        trains on it (the study, ``train sft``/``grpo``); an evaluation of its own trains on nothing."""
        from ..agent.tasks import task_spec

        return tuple(t for t in self.task_list if task_spec(t).items is not None) if self.items == "auto" else ()


@dataclass(frozen=True, kw_only=True)
class EvalConfig(EpisodeOptions, ExecutorOption):
    """``graftkit eval``: success per task, and the paired comparison with a second policy."""

    command = "eval"
    model: tuple[Path, ...] = opt(flags=("--model",))
    """Policy (repeat --model for several; each plays the identical episodes and gets its own result): an HF
    causal LM folder with its tokenizer, an image-text-to-text folder with its processor (for --obs som), a
    PEFT LoRA adapter (merged into --base in memory), or a trainer's output_dir (its last checkpoint, or
    every checkpoint with --all-checkpoints)."""
    all_checkpoints: bool = False
    """A trainer's output_dir given to --model stands for all of its checkpoints, in step order (the training
    trajectory), not only its last."""
    compare_to: Path | None = opt(None, flags=("--compare",))
    """A policy to compare each --model with on identical episodes."""
    sample: bool = False
    """Sample actions instead of greedy decoding."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file of a single --model (default: RUN/results/eval-*.h5)."""

    def __post_init__(self) -> None:
        if isinstance(self.model, (str, os.PathLike)):  # one policy, as callers that predate --model repeated pass it
            object.__setattr__(self, "model", (Path(self.model),))
        super().__post_init__()
        if not self.model:
            raise GraftkitError("eval needs a policy", "pass --model PATH (repeat it for several)")
        check_obs(self.obs, self.backend)
        self.check_episodes()
        self.check_models(self.compare_to)

    def check_models(self, *paths: Path | None) -> None:
        from ..weights.hf import single_file_config

        for p in (*self.model, *paths):
            if p is not None and Path(p).is_file():
                single_file_config(Path(p), self.config, self.no_pickle)


@dataclass(frozen=True, kw_only=True)
class HeadroomConfig(EpisodeOptions):
    """``graftkit headroom``: greedy vs sampled success per task, pass@k, and the headroom."""

    command = "headroom"
    k: int = 8
    """Samples per episode (pass@k uses all k)."""
    tasks: str = "all"  # headroom's defaults; the help texts are EpisodeOptions'
    episodes: int = 2
    backend: str = "py"
    """py (the mirror) or miniwob (Chromium)."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/headroom-*.h5)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_obs(self.obs, self.backend)
        if self.k < 2:
            raise GraftkitError(f"--k {self.k} must be ≥ 2", "pass e.g. --k 8")
        self.check_episodes()
        self.check_models()


# ------------------------------------------------------------------------------------------- views


def _optional(res: Result, name: str) -> np.ndarray | None:
    return np.asarray(res[name]) if name in res.data else None


@dataclass(frozen=True, eq=False)
class EvalResult:
    """An evaluation: every episode's outcome over [task, seed, episode, sample] (``success`` int8 0/1;
    ``reward``, ``turns``, ``invalid`` where recorded), and its provenance in ``attrs`` (the checkpoint's
    description under ``model``, ``decode``, ``backend``, ``obs``, ``seconds``, ``config``)."""

    tasks: tuple[str, ...]
    seeds: np.ndarray
    success: np.ndarray
    reward: np.ndarray | None = None
    turns: np.ndarray | None = None
    invalid: np.ndarray | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    #: [task, seed, episode]: each episode's item id (None in results written before items were kept).
    item: np.ndarray | None = None
    kind: ClassVar[str] = EVAL

    @classmethod
    def from_outcome(cls, outcome, model_desc: dict, config: CommandConfig | None = None, **more_attrs):
        """The view of an ``agent.EvalOutcome`` of the checkpoint ``model_desc`` (``weights.describe``)."""
        from ..agent.tasks import prompt_formats, task_sources, task_spec

        sizes = {t: n for t in outcome.tasks if (n := task_spec(t).items) is not None}
        attrs = {"model": model_desc, "label": Path(model_desc.get("path", "model")).name,
                 "decode": asdict(outcome.decode), "backend": outcome.backend, "obs": outcome.obs,
                 "episode_seed": ("env seed = 1000 * seed + episode (a user's file played on every item: seed * "
                                  "episodes + episode)" if outcome.items == "all" else
                                  "env seed = the first of 1000 * seed + episode + j * 2**32 (j = 0, 1, ...) whose item "
                                  f"is {'held out' if outcome.items == 'heldout' else 'a training item'}"),
                 "items": outcome.items, "item_split": SPLIT_RULE, "tasks_without_items": list(outcome.no_items),
                 # a user's file that this evaluation plays on every item (env seed = seed * episodes + episode)
                 **({"tasks_evaluated_whole": list(outcome.whole)} if outcome.whole else {}),
                 "seconds": outcome.seconds, "success": "raw reward == 1 at the end of the episode",
                 "invalid_outputs": {t: [[text, int(n)] for text, n in rows]
                                     for t, rows in getattr(outcome, "invalid_outputs", {}).items()},
                 "task_sources": task_sources(outcome.tasks), "prompt_formats": prompt_formats(outcome.tasks),
                 **({"file_items": sizes} if sizes else {}), **more_attrs}
        if config is not None:
            attrs["config"] = config.as_dict()
        return cls(tuple(outcome.tasks), np.array(outcome.seeds), outcome.success.astype(np.int8), outcome.reward,
                   outcome.turns, outcome.invalid, attrs,
                   None if outcome.item is None else np.asarray(outcome.item, dtype=object))

    @classmethod
    def from_result(cls, res: Result):
        item = _optional(res, "item")
        return cls(tuple(str(t) for t in res.coords["task"]), np.asarray(res.coords["seed"]),
                   np.asarray(res["success"]), *(_optional(res, k) for k in EPISODE_ARRAYS[1:]), dict(res.attrs),
                   None if item is None else item.astype(object))

    def _coords(self) -> dict[str, np.ndarray]:
        return {"task": np.array(self.tasks, dtype=object), "seed": self.seeds,
                "episode": np.arange(self.success.shape[2]), "sample": np.arange(self.success.shape[3])}

    def _data(self) -> dict:
        data = {k: (DIMS, v) for k in EPISODE_ARRAYS if (v := getattr(self, k)) is not None}
        if self.item is not None:
            data["item"] = (DIMS[:3], np.asarray(self.item, dtype=object))
        return data

    def clustered(self, tasks=None) -> tuple[np.ndarray, np.ndarray]:
        """Outcomes of ``tasks`` (default: every task) as one entry per episode and sample, with the cluster
        of each for paired statistics: ``task/item`` where the result kept items (an item repeated across
        seeds is one cluster), else the evaluation seed (as :meth:`outcomes`' rows)."""
        idx = list(range(len(self.tasks))) if tasks is None else [self.tasks.index(t) for t in tasks]
        s = self.success[idx]
        if self.item is not None:
            lab = np.array([f"{self.tasks[i]}/" for i in idx], dtype=object)[:, None, None] + self.item[idx]
        else:
            lab = np.broadcast_to(np.array([str(x) for x in self.seeds], dtype=object)[None, :, None], s.shape[:3])
        return s.astype(np.int8).ravel(), np.broadcast_to(lab[..., None], s.shape).astype(object).ravel()

    def items_of(self, task: str) -> np.ndarray | None:
        """The item ids of ``task``'s episodes [seed, episode] (None when the result kept none)."""
        return None if self.item is None else self.item[self.tasks.index(task)]

    def item_counts(self) -> dict[str, dict]:
        """Per task: episodes, distinct items, how many of them training may use (``overlap``: items outside
        the held-out split; 0 for a held-out evaluation), and whether the items are too few for the
        evaluation (``too_few``). Empty when the result kept no items."""
        from ..webenv.items import is_heldout, too_few

        out = {}
        for t in self.tasks:
            it = self.items_of(t)
            if it is None:
                return {}
            distinct = set(str(x) for x in it.ravel())
            n = int(it.size)
            out[t] = {"episodes": n, "distinct": len(distinct),
                      "overlap": sum(not is_heldout(x) for x in distinct), "too_few": too_few(len(distinct), n),
                      **({"total": self.file_items[t]} if t in self.file_items else {})}
        return out

    @property
    def file_items(self) -> dict[str, int]:
        """Per user's file (``FILE.jsonl``) among the tasks, its number of items."""
        return {str(t): int(n) for t, n in (self.attrs.get("file_items") or {}).items()}

    def to_result(self) -> Result:
        return Result(self.kind, self._coords(), self._data(), dict(self.attrs))

    def outcomes(self, tasks=None) -> np.ndarray:
        """Outcomes of ``tasks`` (default: every task) as [seed, task·episode·sample] (``stats.fold_episodes``)."""
        return fold_episodes(self.success, None if tasks is None else [self.tasks.index(t) for t in tasks])

    @property
    def model_path(self) -> str | None:
        m = self.attrs.get("model")
        m = m.get("path") if isinstance(m, dict) else m
        return str(m) if isinstance(m, str) and m else None

    @property
    def label(self) -> str | None:
        lab = self.attrs.get("label")
        return lab if isinstance(lab, str) and lab else None

    @property
    def decode(self) -> dict:
        d = self.attrs.get("decode")
        return d if isinstance(d, dict) else {}

    @property
    def obs(self) -> str | None:
        return self.attrs.get("obs")

    @property
    def backend(self) -> str | None:
        return self.attrs.get("backend")

    @property
    def seconds(self) -> float:
        return float(self.attrs.get("seconds", float("nan")))

    @property
    def whole(self) -> tuple[str, ...]:
        """Tasks evaluated on every item (a user's file this evaluation does not train on), not held out."""
        return tuple(str(t) for t in self.attrs.get("tasks_evaluated_whole", ()))

    def played_whole(self, task: str) -> bool:
        """Whether ``task`` is a user's file played on its own items (``tasks_evaluated_whole``, or a file under
        ``--items all``), not on graftkit's held-out split of a generated task."""
        return task in self.whole or (task in self.file_items and self.attrs.get("items") == "all")

    def coverage_note(self, task: str) -> str:
        """How the episodes covered ``task``, a user's file played whole (:meth:`played_whole`): the whole file and
        how often each item, or which part and the ``--seeds`` that would cover it."""
        from ..verifiable.user import coverage, coverage_note

        if task not in self.file_items or self.items_of(task) is None:
            return f"{task}: a user's file, evaluated on every item"
        return coverage_note(task, coverage(self.items_of(task), self.file_items[task]), len(self.seeds),
                             int(self.success.shape[2]))

    @property
    def notes(self) -> list[str]:
        """How a single-file checkpoint was read (state dict container, prefixes stripped, config source), and
        what the items say: tasks left out for want of an evaluation item, too few items, overlap, a user's file
        evaluated whole."""
        m = self.attrs.get("model")
        out = [str(n) for n in (m.get("notes") or [])] if isinstance(m, dict) else []
        left_out = self.attrs.get("tasks_without_items")
        if isinstance(left_out, (list, tuple, np.ndarray)) and len(left_out):
            out.append(f"left out {', '.join(map(str, left_out))}: no item of the {self.attrs.get('items')} split (one or "
                       "a few distinct first observations); --items all scores them anyway")
        for t, c in self.item_counts().items():
            if c["too_few"]:
                out.append(f"{t}: {c['distinct']} distinct items over {c['episodes']} episodes — too few for this "
                           "evaluation; its intervals cluster by item")
            if self.played_whole(t):
                out.append(self.coverage_note(t))
            elif c["overlap"]:
                out.append(f"{t}: {c['overlap']} of its {c['distinct']} items are outside the held-out split "
                           "(training may have used them)")
        return out + self.action_notes()

    def unparseable(self, task: str | None = None) -> float:
        """The share of turns whose output did not parse as an action (of one task, or of all)."""
        if self.invalid is None or self.turns is None:
            return float("nan")
        i = slice(None) if task is None else self.tasks.index(task)
        turns = int(np.asarray(self.turns)[i].sum())
        return float(np.asarray(self.invalid)[i].sum() / turns) if turns else float("nan")

    def top_invalid(self, task: str) -> str | None:
        """The task's most common output that did not parse as an action."""
        rows = (self.attrs.get("invalid_outputs") or {}).get(task) or []
        return str(rows[0][0]) if len(rows) else None

    def parsed(self, task: str | None = None) -> float:
        """The share of turns whose output parsed (a web action, or an answer in the task's answer format)."""
        return 1.0 - self.unparseable(task)

    def answer_format(self, task: str) -> str:
        """The answer format a verifiable task was read in (``tags`` where the result did not record it)."""
        return str(((self.attrs.get("prompt_formats") or {}).get(task) or {}).get("answer_format", "tags"))

    def action_notes(self) -> list[str]:
        """One line for a model at 0% because it never wrote an action or an answer (else one per such task), and
        one for each task where most outputs did not parse (:data:`MOSTLY_UNPARSED`), naming what would read them."""
        problems = set(self.attrs.get("task_sources") or {})  # verifiable tasks: an answer, not an action
        never = [t for t in self.tasks if self.unparseable(t) == 1.0]
        what = {t: f"no completion stated an answer in the answer format {self.answer_format(t)}" if t in problems
                else "no turn parsed as an action" for t in never}
        out = []
        if never:
            fix = (f"it does not write the answer format: if it was trained to answer otherwise, {FORMAT_FIX}; else "
                   if all(t in problems for t in never) else
                   "it does not write the action format, click(REF) or type(REF, \"TEXT\"): ") + \
                "fine-tune it on demonstrations first (graftkit train sft --init MODEL)"
            if len(never) == len(self.tasks) and len(set(what.values())) == 1:
                seen = self.top_invalid(never[0])
                out.append(f"0% on every task because {what[never[0]]} (most common output: {seen!r}); {fix}")
            else:
                out += [f"{t}: 0% because {what[t]} (most common output: {self.top_invalid(t)!r})" for t in never]
        for t in self.tasks:
            share = self.unparseable(t)
            if t not in never and share > MOSTLY_UNPARSED:
                kind = (f"completions stated no answer in the answer format {self.answer_format(t)}" if t in problems
                        else "turns did not parse as an action")
                fix = FORMAT_FIX if t in problems else "fine-tune it on demonstrations (graftkit train sft --init MODEL)"
                out.append(f"{t}: {100 * share:.0f}% of {kind} (most common: {self.top_invalid(t)!r}); {fix}")
        return out


@dataclass(frozen=True, eq=False)
class HeadroomResult(EvalResult):
    """A headroom measurement: the sampled outcomes over [task, seed, episode, sample] (k samples, as in
    :class:`EvalResult`) beside the greedy ones, ``greedy`` [task, seed, episode, greedy_sample]."""

    greedy: np.ndarray | None = None
    kind: ClassVar[str] = HEADROOM

    @classmethod
    def from_outcomes(cls, greedy, sampled, model_desc: dict, config: HeadroomConfig | None = None, **more_attrs):
        """The view of a greedy and a sampled ``agent.EvalOutcome`` of the same episodes."""
        view = EvalResult.from_outcome(sampled, model_desc, config, **more_attrs)
        return cls(**{f.name: getattr(view, f.name) for f in fields(view)}, greedy=greedy.success.astype(np.int8))

    @classmethod
    def from_result(cls, res: Result):
        view = EvalResult.from_result(res)
        return cls(**{f.name: getattr(view, f.name) for f in fields(view)}, greedy=_optional(res, "greedy_success"))

    def to_result(self) -> Result:
        coords, data = self._coords(), self._data()
        if self.greedy is not None:
            coords["greedy_sample"] = np.arange(self.greedy.shape[3])
            data["greedy_success"] = (("task", "seed", "episode", "greedy_sample"), self.greedy)
        return Result(self.kind, coords, data, dict(self.attrs))

    @property
    def k(self) -> int:
        return int(self.success.shape[-1])

    def pairs(self) -> tuple[dict, dict] | None:
        """Per task, greedy and sampled outcomes [seed, episode·k], each greedy episode repeated against
        its k samples; None when they cannot be paired (no greedy array, or greedy samples neither 1 nor k)."""
        s, g, k = self.success, self.greedy, self.k
        if g is None or g.shape[:3] != s.shape[:3] or g.shape[-1] not in (1, k):
            return None
        if g.shape[-1] == 1:
            g = np.repeat(g, k, axis=-1)
        n_seeds = s.shape[1]
        return ({t: g[i].reshape(n_seeds, -1) for i, t in enumerate(self.tasks)},
                {t: s[i].reshape(n_seeds, -1) for i, t in enumerate(self.tasks)})

    def table(self, level: float = 0.95):
        """``stats.headroom`` per task (a = greedy, b = sampled): the episode is the unit (its greedy outcome
        against its k samples), clustered by item where the result kept items, else by seed; None when the
        arrays cannot be paired (no greedy array, or greedy samples neither 1 nor k)."""
        s, g, k = self.success, self.greedy, self.k
        if g is None or g.shape[:3] != s.shape[:3] or g.shape[-1] not in (1, k):
            return None
        greedy = {t: g[i, ..., 0] for i, t in enumerate(self.tasks)}  # [seed, episode]
        sampled = {t: s[i] for i, t in enumerate(self.tasks)}  # [seed, episode, k]
        if self.item is None:
            return headroom(greedy, sampled, level=level)
        return headroom({t: v.ravel() for t, v in greedy.items()}, {t: v.reshape(-1, k) for t, v in sampled.items()},
                        level=level, clusters={t: self.item[i].ravel() for i, t in enumerate(self.tasks)})


def eval_result(outcome, model_desc: dict, config: CommandConfig | None = None) -> Result:
    """An ``agent.EvalOutcome`` as a labelled eval result (:class:`EvalResult`'s layout)."""
    return EvalResult.from_outcome(outcome, model_desc, config).to_result()


# ---------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class EvalRun:
    """What :func:`run_eval` wrote: one view and one file per role (``model`` for the first --model,
    ``model-2``, ``model-3``, ... for the others in order, and ``compare``), the rows of each model's summary
    (``tables``, per task and pooled ``all``) and those of the first (``rows``)."""

    rows: tuple[dict, ...]
    results: Mapping[str, EvalResult]
    files: Mapping[str, Path]
    tables: Mapping[str, tuple[dict, ...]] = field(default_factory=dict)

    @property
    def models(self) -> tuple[str, ...]:
        """The roles of the evaluated models, in --model order."""
        return tuple(self.tables) or ("model",)

    @property
    def notes(self) -> list[str]:
        """What each model's result notes (how its checkpoint was read, its items, what did not parse): a note
        every model shares once, any other after the model's label."""
        each = {role: r.notes for role, r in self.results.items()}
        shared = set.intersection(*(set(n) for n in each.values())) if each else set()
        out = [n for n in dict.fromkeys(n for notes in each.values() for n in notes) if n in shared]
        if len(each) > 1:
            out += [f"{self.results[role].label or role}: {n}" for role, notes in each.items() for n in notes
                    if n not in shared]
        else:
            out += [n for notes in each.values() for n in notes if n not in shared]
        return out

    def as_json(self, cfg: "EvalConfig") -> dict:
        """What ``graftkit eval --json`` prints: the first model's rows under ``tasks``, every model's under
        ``models``."""
        first = self.results["model"]
        return {"model": first.model_path, "compare": str(cfg.compare_to) if cfg.compare_to else None,
                "tasks": list(self.rows), "seeds": cfg.seeds, "episodes": cfg.episodes, "backend": cfg.backend,
                "obs": cfg.obs, "decode": first.decode,
                "models": [{"role": r, "model": self.results[r].model_path, "label": self.results[r].label,
                            "tasks": list(self.tables.get(r, self.rows)), "file": str(self.files[r])}
                           for r in self.models],
                "files": {k: str(p) for k, p in self.files.items()}, "notes": self.notes}

    def printed(self, cfg: "EvalConfig") -> list:
        """What ``graftkit eval`` prints (:class:`~graftkit.core.tables.Table` s and lines, from the rows
        :meth:`as_json` holds): per model, each task's items, success and parse rate, and with ``--compare`` the
        paired comparison; the notes; where each result went."""
        from ..core.tables import Table, items_text, percent

        columns = {"task": lambda r: r["task"], "items": items_text,
                   "success (95% Wilson)": lambda r: rate_text(r["model"]), "parsed": lambda r: percent(r["parsed"])}
        if cfg.compare_to:
            columns |= {Path(cfg.compare_to).name: lambda r: rate_text(r["compare"]),
                        "diff [bootstrap] [Bayes]": lambda r: diff_text(r, "diff"),
                        "McNemar p": lambda r: f"{r['mcnemar_p']:.3g}", "verdict": lambda r: r["verdict"]}
        decode = f"{'sampled' if cfg.sample else 'greedy'}, {cfg.backend}, obs {cfg.obs}"
        out: list = [Table(f"{self.results[role].model_path}: success over {cfg.seeds} seeds × {cfg.episodes} "
                           f"episodes ({decode})", columns, self.tables[role], left=("task", "verdict"))
                     for role in self.models]
        return out + [f"note: {n}" for n in self.notes] + [f"saved {path} ({self.results[role].seconds:.1f} s)"
                                                           for role, path in self.files.items()]


@dataclass(frozen=True)
class HeadroomRun:
    """What :func:`run_headroom` wrote, and the rows of its summary (one per task)."""

    rows: tuple[dict, ...]
    result: HeadroomResult
    file: Path

    def as_json(self, cfg: "HeadroomConfig") -> dict:
        """What ``graftkit headroom --json`` prints."""
        return {"model": str(cfg.model), "k": cfg.k, "temperature": cfg.temperature, "obs": cfg.obs,
                "tasks": list(self.rows), "file": str(self.file), "notes": self.result.notes}

    def printed(self, cfg: "HeadroomConfig") -> list:
        """What ``graftkit headroom`` prints: per task greedy and sampled success, pass@k, the parse rate and the
        headroom with its intervals and verdict; the notes; where the result went."""
        from ..core.tables import Table, items_text, percent

        k = cfg.k
        columns = {"task": lambda r: r["task"], "items": items_text,
                   **{key: (lambda r, key=key: f"{100 * r[key]:.1f}%") for key in ("greedy", "sampled", f"pass@{k}")},
                   "parsed": lambda r: percent(r["parsed"]),
                   "headroom [bootstrap] [Bayes]": lambda r: diff_text(r, "headroom"), "verdict": lambda r: r["verdict"]}
        title = f"headroom of {cfg.model}: {cfg.seeds} seeds × {cfg.episodes} episodes, k={k}, T={cfg.temperature:g}"
        return [Table(title, columns, self.rows, left=("task", "verdict")),
                *(f"note: {n}" for n in self.result.notes), f"saved {self.file}"]


def _evaluate(cfg: EpisodeOptions, policy, decode, samples: int, what: str, on_progress: OnProgress):
    from ..agent import evaluate

    total = len(cfg.task_list) * cfg.seeds * cfg.episodes * samples
    return evaluate(policy, cfg.task_list, cfg.seed_list, cfg.episodes, decode, samples=samples, backend=cfg.backend,
                    batch_size=cfg.batch_size, on_episode=lambda e: on_progress(what, 1, total, "episodes"),
                    obs=cfg.obs, items="heldout" if cfg.items == "auto" else cfg.items, whole=cfg.whole_tasks)


def rate_dict(r) -> dict:
    """A ``stats.RateInterval`` as the JSON row fields."""
    return {"rate": r.rate, "low": r.low, "high": r.high, "successes": r.successes, "n": r.n}


def rate_text(r: Mapping) -> str:
    """A :func:`rate_dict` as a table shows it: ``92.0% [80.8, 96.8]``."""
    return f"{100 * r['rate']:.1f}% [{100 * r['low']:.1f}, {100 * r['high']:.1f}]"


def diff_text(r: Mapping, key: str) -> str:
    """A paired difference ``r[key]`` with its bootstrap and Bayesian intervals, in points."""
    return (f"{100 * r[key]:+.1f} [{100 * r['bootstrap'][0]:+.1f}, {100 * r['bootstrap'][1]:+.1f}] "
            f"[{100 * r['bayes'][0]:+.1f}, {100 * r['bayes'][1]:+.1f}]")


def item_fields(counts: Mapping[str, dict], task: str) -> dict:
    """The row fields on items: distinct items, overlap with training, and the too-few flag (pooled for ``all``)."""
    if not counts:
        return {}
    rows = list(counts.values()) if task == "all" else [counts[task]]
    out = {"items": sum(r["distinct"] for r in rows), "overlap": sum(r["overlap"] for r in rows),
           "too_few_items": any(r["too_few"] for r in rows)}
    if task != "all" and "total" in counts[task]:
        out["file_items"] = counts[task]["total"]  # a user's file: distinct items played of the file's
    return out



def eval_rows(model: EvalResult, compare_to: EvalResult | None = None) -> list[dict]:
    """Per task and pooled over tasks (``all``): the model's rate, and with ``compare_to`` the paired
    comparison on identical episodes (a = ``compare_to``, b = the model)."""
    rows, counts = [], model.item_counts()
    for t in [*model.tasks, "all"]:
        pick = None if t == "all" else [t]
        a = model.outcomes(pick)
        row = {"task": t, "model": rate_dict(wilson_interval(int(a.sum()), a.size)), **item_fields(counts, t),
               "unparseable": model.unparseable(None if t == "all" else t),
               "parsed": model.parsed(None if t == "all" else t),
               "top_invalid": None if t == "all" else model.top_invalid(t)}
        if compare_to is not None:
            (a_flat, clusters), (b_flat, _) = compare_to.clustered(pick), model.clustered(pick)
            c = compare(a_flat, b_flat, clusters=clusters)
            row.update({"compare": rate_dict(c.rate_a), "diff": c.diff,
                        "bootstrap": [c.bootstrap.low, c.bootstrap.high], "bayes": [c.bayes.low, c.bayes.high],
                        "mcnemar_p": c.mcnemar.p_value, "verdict": c.verdict})
        rows.append(row)
    return rows


def _describe(cfg: EpisodeOptions, path: Path) -> dict:
    """The fingerprinted description of a policy's checkpoint (a LoRA adapter: with its base's files)."""
    from ..weights import describe, open_model

    return describe(open_model(path, cfg.base, no_pickle=cfg.no_pickle, config=cfg.config))


def _play(cfg: EpisodeOptions, decode, path: Path, what: str, on_progress: OnProgress = no_progress,
          device: str | None = None) -> EvalResult:
    """One policy's evaluation (on ``device``, default ``cfg.device``), as its view."""
    from ..agent import load_policy

    policy = load_policy(Path(path), no_pickle=cfg.no_pickle, obs=cfg.obs, config=cfg.config, base=cfg.base,
                         device=device or cfg.device, dtype=cfg.dtype, engine=cfg.engine)
    try:
        outcome = _evaluate(cfg, policy, decode, 1, what, on_progress)
        placement = policy.placement
    finally:
        policy.close()
    return EvalResult.from_outcome(outcome, _describe(cfg, path), cfg, placement=placement)


def _play_unit(state, unit, cfg: EvalConfig, decode, device: str, on_progress: OnProgress) -> EvalResult:
    """One policy's evaluation as an executor's unit (``state``: none; the policy is loaded per unit)."""
    path, what = unit
    return _play(cfg, decode, path, what, on_progress, device=device)


def run_eval(cfg: EvalConfig, on_progress: OnProgress = no_progress) -> EvalRun:
    """Evaluate every ``cfg.model`` (a trainer's output_dir: its last checkpoint, or all of them with
    ``all_checkpoints``) and ``cfg.compare_to`` on the identical episodes, write one eval result per policy
    (``cfg.save``, else ``RUN/results/eval-NAME-greedy|sampled[-som].h5``) and summarise each model, compared
    with ``compare_to``. The policies are the units of the command's executor (``executor="ray"``: one Ray
    worker each)."""
    import functools

    from ..agent import Decode
    from ..weights import checkpoint_of, checkpoints_of

    decode = Decode(greedy=not cfg.sample, temperature=cfg.temperature, top_p=cfg.top_p,
                    max_new_tokens=cfg.max_new_tokens)
    models = [p for m in cfg.model for p in checkpoints_of(m, all_checkpoints=cfg.all_checkpoints, flag="--model")]
    if cfg.save and len(models) > 1:
        raise GraftkitError(f"--save names one result file, but {len(models)} policies are evaluated",
                            f"drop --save: each policy's result goes to RUN/{RESULTS}/{glob_pattern(EVAL, label='NAME')}")
    roles = {("model" if i == 0 else f"model-{i + 1}"): p for i, p in enumerate(models)}
    if cfg.compare_to:
        roles["compare"] = checkpoint_of(cfg.compare_to, "--compare")  # a trainer's output_dir: its last checkpoint
    labels = dict(zip(roles, result_labels(roles.values())))
    # A policy named twice (--compare X --model X) plays once: the same episodes would give the same outcomes.
    first: dict[Path, Path] = {}
    for p in roles.values():
        first.setdefault(Path(p).resolve(), p)
    units = [(path, f"eval {Path(path).name}") for path in first.values()]
    executor = Executor.of(cfg)
    total = len(cfg.task_list) * cfg.seeds * cfg.episodes
    # a unit in this process reports each episode; a Ray worker's progress stays there, so each policy's end here
    views = executor.run(units, functools.partial(_play_unit, cfg=cfg, decode=decode, device=executor.unit_device,
                                                  on_progress=on_progress if executor.local else no_progress),
                         on_result=(lambda i, r: None) if executor.local else
                         lambda i, r: on_progress(units[i][1], total, total, "episodes"))
    played = dict(zip(first, views))
    results, files = {role: played[Path(p).resolve()] for role, p in roles.items()}, {}
    for role in roles:
        dest = cfg.save if role == "model" and cfg.save else \
            eval_path(run_layout(cfg.run).results, labels[role], "sampled" if cfg.sample else "greedy", cfg.obs)
        files[role] = write_result(dest, results[role].to_result(), flag="--save" if dest == cfg.save else None)
    tables = {r: tuple(eval_rows(results[r], results.get("compare"))) for r in roles if r != "compare"}
    return EvalRun(tables["model"], results, files, tables)


def headroom_rows(view: HeadroomResult) -> list[dict]:
    """Per task: greedy and sampled success, pass@k, and the headroom with its intervals and verdict."""
    k, table, counts = view.k, view.table(), view.item_counts()
    rows = []
    for i, t in enumerate(view.tasks):
        c = view.success[i].sum(-1)  # successes among k samples, per (seed, episode)
        h = table[t]
        rows.append({"task": t, "greedy": float(view.greedy[i].mean()), "sampled": float(view.success[i].mean()),
                     f"pass@{k}": float(np.mean([pass_at_k(k, int(x), k) for x in c.ravel()])),
                     "headroom": h.headroom, "bootstrap": [h.comparison.bootstrap.low, h.comparison.bootstrap.high],
                     "bayes": [h.comparison.bayes.low, h.comparison.bayes.high], "verdict": h.verdict,
                     "unparseable": view.unparseable(t), "parsed": view.parsed(t), "top_invalid": view.top_invalid(t),
                     **item_fields(counts, t)})
    return rows


def run_headroom(cfg: HeadroomConfig, on_progress: OnProgress = no_progress) -> HeadroomRun:
    """Play every episode of ``cfg.model`` greedily once and sampled ``cfg.k`` times, write one headroom
    result (``cfg.save``, else ``RUN/results/headroom-NAME[-som].h5``) and summarise it."""
    from ..agent import Decode, load_policy
    from ..weights import checkpoint_of

    cfg = cfg.replace(model=checkpoint_of(cfg.model, "--model"))  # a trainer's output_dir: its last checkpoint
    policy = load_policy(Path(cfg.model), no_pickle=cfg.no_pickle, obs=cfg.obs, config=cfg.config, base=cfg.base,
                         device=cfg.device, dtype=cfg.dtype, engine=cfg.engine)
    try:
        greedy = _evaluate(cfg, policy, Decode(greedy=True, max_new_tokens=cfg.max_new_tokens), 1, "greedy",
                           on_progress)
        sampled = _evaluate(cfg, policy, Decode(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p,
                                                max_new_tokens=cfg.max_new_tokens), cfg.k, "sampled", on_progress)
        placement = policy.placement
    finally:
        policy.close()
    desc = _describe(cfg, cfg.model)
    view = HeadroomResult.from_outcomes(greedy, sampled, desc, cfg, k=cfg.k, temperature=cfg.temperature,
                                        top_p=cfg.top_p, placement=placement)
    rows = headroom_rows(view)
    dest = cfg.save or headroom_path(run_layout(cfg.run).results, result_labels([cfg.model])[0], cfg.obs)
    return HeadroomRun(tuple(rows), view, write_result(dest, view.to_result(), flag="--save" if cfg.save else None))
