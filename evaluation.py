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

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

from .config import CommandConfig, OnProgress, no_progress, opt
from .errors import GraftkitError
from .stats import compare, fold_episodes, headroom, pass_at_k, wilson_interval
from .store import Result, current_run, write_result

DIMS = ("task", "seed", "episode", "sample")
EPISODE_ARRAYS = ("success", "reward", "turns", "invalid")


def check_obs(obs: str, backend: str) -> None:
    """Validate --backend and --obs before any model loads. ``som`` needs a vision-language policy
    folder (``agent.load_policy`` refuses a text-only one, naming it); ``text`` works with either kind."""
    if backend not in ("py", "miniwob"):
        raise GraftkitError(f"unknown --backend {backend!r}", "use py (the mirror) or miniwob (Chromium)")
    if obs not in ("text", "som"):
        raise GraftkitError(f"unknown --obs {obs!r}", "use text (element list) or som (Set-of-Marks screenshot)")


# ------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True, kw_only=True)
class EpisodeOptions(CommandConfig):
    """Which policy plays which episodes, and how (the fields ``eval`` and ``headroom`` share)."""

    model: Path = opt(flags=("--model",))
    """Policy: an HF causal LM folder with its tokenizer, or an image-text-to-text folder with its processor
    (for --obs som)."""
    tasks: str = "mastered"
    """Suite (mastered, headroom, all) or comma list of tasks."""
    seeds: int = 25
    """Evaluation seeds 0..N-1."""
    episodes: int = 4
    """Episodes per seed and task."""
    backend: str = "py"
    """py (the pure-Python mirror) or miniwob (real MiniWoB++ in Chromium)."""
    obs: str = "text"
    """Observation: text (element list) or som (Set-of-Marks screenshot)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    batch_size: int = 64
    """Episodes advanced together."""
    allow_pickle: bool = False
    """Load pickled .bin/.pt weights (weights_only=True)."""
    config: Path | None = None
    """HF folder whose config.json (and tokenizer) a single-file checkpoint uses (default: the other side's
    folder; a policy run from one file needs it)."""

    def check_episodes(self) -> None:
        """Raise on an unknown task or suite, or on no seeds (before any model loads)."""
        from .agent import resolve_tasks, seed_list

        resolve_tasks(self.tasks)
        seed_list(self.seeds)

    def check_models(self, *paths: Path | None) -> None:
        """Raise, before any model loads, on a single checkpoint file without ``--config`` to build it over."""
        from .weights.hf import single_file_config

        for p in (self.model, *paths):
            if p is not None and Path(p).is_file():
                single_file_config(Path(p), self.config, self.allow_pickle)

    @property
    def task_list(self) -> list[str]:
        from .agent import resolve_tasks

        return resolve_tasks(self.tasks)

    @property
    def seed_list(self) -> list[int]:
        from .agent import seed_list

        return seed_list(self.seeds)


@dataclass(frozen=True, kw_only=True)
class EvalConfig(EpisodeOptions):
    """``graftkit eval``: success per task, and the paired comparison with a second policy."""

    command = "eval"
    compare_to: Path | None = opt(None, flags=("--compare",))
    """A second policy to compare on identical episodes."""
    sample: bool = False
    """Sample actions instead of greedy decoding."""
    save: Path | None = opt(None, flags=("--save",))
    """HDF5 result file (default: RUN/results/eval-*.h5)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_obs(self.obs, self.backend)
        self.check_episodes()
        self.check_models(self.compare_to)


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
    kind: ClassVar[str] = "eval"

    @classmethod
    def from_outcome(cls, outcome, model_desc: dict, config: CommandConfig | None = None, **more_attrs):
        """The view of an ``agent.EvalOutcome`` of the checkpoint ``model_desc`` (``weights.describe``)."""
        attrs = {"model": model_desc, "label": Path(model_desc.get("path", "model")).name,
                 "decode": asdict(outcome.decode), "backend": outcome.backend, "obs": outcome.obs,
                 "episode_seed": "env seed = 1000 * seed + episode", "seconds": outcome.seconds,
                 "success": "raw reward == 1 at the end of the episode", **more_attrs}
        if config is not None:
            attrs["config"] = config.as_dict()
        return cls(tuple(outcome.tasks), np.array(outcome.seeds), outcome.success.astype(np.int8), outcome.reward,
                   outcome.turns, outcome.invalid, attrs)

    @classmethod
    def from_result(cls, res: Result):
        return cls(tuple(str(t) for t in res.coords["task"]), np.asarray(res.coords["seed"]),
                   np.asarray(res["success"]), *(_optional(res, k) for k in EPISODE_ARRAYS[1:]), dict(res.attrs))

    def _coords(self) -> dict[str, np.ndarray]:
        return {"task": np.array(self.tasks, dtype=object), "seed": self.seeds,
                "episode": np.arange(self.success.shape[2]), "sample": np.arange(self.success.shape[3])}

    def _data(self) -> dict:
        return {k: (DIMS, v) for k in EPISODE_ARRAYS if (v := getattr(self, k)) is not None}

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
    def notes(self) -> list[str]:
        """How a single-file checkpoint was read (state dict container, prefixes stripped, config source)."""
        m = self.attrs.get("model")
        return [str(n) for n in (m.get("notes") or [])] if isinstance(m, dict) else []


@dataclass(frozen=True, eq=False)
class HeadroomResult(EvalResult):
    """A headroom measurement: the sampled outcomes over [task, seed, episode, sample] (k samples, as in
    :class:`EvalResult`) beside the greedy ones, ``greedy`` [task, seed, episode, greedy_sample]."""

    greedy: np.ndarray | None = None
    kind: ClassVar[str] = "headroom"

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
        """``stats.headroom`` of the pairs (a = greedy, b = sampled), or None when they cannot be paired."""
        pairs = self.pairs()
        return None if pairs is None else headroom(*pairs, level=level)


def eval_result(outcome, model_desc: dict, config: CommandConfig | None = None) -> Result:
    """An ``agent.EvalOutcome`` as a labelled eval result (:class:`EvalResult`'s layout)."""
    return EvalResult.from_outcome(outcome, model_desc, config).to_result()


# ---------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class EvalRun:
    """What :func:`run_eval` wrote: one view and one file per role (``model``, and ``compare``), and the
    rows of the summary (per task and pooled ``all``)."""

    rows: tuple[dict, ...]
    results: Mapping[str, EvalResult]
    files: Mapping[str, Path]

    @property
    def notes(self) -> list[str]:
        """How each role's checkpoint was read, where it is a single file."""
        return [n for r in self.results.values() for n in r.notes]

    def as_json(self, cfg: "EvalConfig") -> dict:
        """What ``graftkit eval --json`` prints."""
        return {"model": str(cfg.model), "compare": str(cfg.compare_to) if cfg.compare_to else None,
                "tasks": list(self.rows), "seeds": cfg.seeds, "episodes": cfg.episodes, "backend": cfg.backend,
                "obs": cfg.obs, "decode": self.results["model"].decode,
                "files": {k: str(p) for k, p in self.files.items()}, "notes": self.notes}


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


def _evaluate(cfg: EpisodeOptions, policy, decode, samples: int, what: str, on_progress: OnProgress):
    from .agent import evaluate

    total = len(cfg.task_list) * cfg.seeds * cfg.episodes * samples
    return evaluate(policy, cfg.task_list, cfg.seed_list, cfg.episodes, decode, samples=samples, backend=cfg.backend,
                    batch_size=cfg.batch_size, on_episode=lambda e: on_progress(what, 1, total, "episodes"),
                    obs=cfg.obs)


def rate_dict(r) -> dict:
    """A ``stats.RateInterval`` as the JSON row fields."""
    return {"rate": r.rate, "low": r.low, "high": r.high, "successes": r.successes, "n": r.n}


def eval_rows(model: EvalResult, compare_to: EvalResult | None = None) -> list[dict]:
    """Per task and pooled over tasks (``all``): the model's rate, and with ``compare_to`` the paired
    comparison on identical episodes (a = ``compare_to``, b = the model)."""
    rows = []
    for t in [*model.tasks, "all"]:
        pick = None if t == "all" else [t]
        a = model.outcomes(pick)
        row = {"task": t, "model": rate_dict(wilson_interval(int(a.sum()), a.size))}
        if compare_to is not None:
            c = compare(compare_to.outcomes(pick), a)
            row.update({"compare": rate_dict(c.rate_a), "diff": c.diff,
                        "bootstrap": [c.bootstrap.low, c.bootstrap.high], "bayes": [c.bayes.low, c.bayes.high],
                        "mcnemar_p": c.mcnemar.p_value, "verdict": c.verdict})
        rows.append(row)
    return rows


def run_eval(cfg: EvalConfig, on_progress: OnProgress = no_progress) -> EvalRun:
    """Evaluate ``cfg.model`` (and ``cfg.compare_to`` on the identical episodes), write one eval result per
    policy (``cfg.save``, else ``RUN/results/eval-NAME-greedy|sampled[-som].h5``) and summarise them."""
    from .agent import Decode, load_policy
    from .weights import describe, open_one

    decode = Decode(greedy=not cfg.sample, temperature=cfg.temperature, top_p=cfg.top_p)
    roles = {"model": cfg.model, **({"compare": cfg.compare_to} if cfg.compare_to else {})}
    results, files = {}, {}
    for role, path in roles.items():
        policy = load_policy(Path(path), allow_pickle=cfg.allow_pickle, obs=cfg.obs, config=cfg.config)
        outcome = _evaluate(cfg, policy, decode, 1, f"eval {Path(path).name}", on_progress)
        desc = describe(open_one(path, allow_pickle=cfg.allow_pickle, config=cfg.config))
        results[role] = EvalResult.from_outcome(outcome, desc, cfg)
        name = f"eval-{Path(path).name}-{'sampled' if cfg.sample else 'greedy'}{'-som' if cfg.obs == 'som' else ''}.h5"
        dest = cfg.save if role == "model" and cfg.save else current_run() / "results" / name
        files[role] = write_result(dest, results[role].to_result())
    return EvalRun(tuple(eval_rows(results["model"], results.get("compare"))), results, files)


def headroom_rows(view: HeadroomResult) -> list[dict]:
    """Per task: greedy and sampled success, pass@k, and the headroom with its intervals and verdict."""
    k, table = view.k, view.table()
    rows = []
    for i, t in enumerate(view.tasks):
        c = view.success[i].sum(-1)  # successes among k samples, per (seed, episode)
        h = table[t]
        rows.append({"task": t, "greedy": float(view.greedy[i].mean()), "sampled": float(view.success[i].mean()),
                     f"pass@{k}": float(np.mean([pass_at_k(k, int(x), k) for x in c.ravel()])),
                     "headroom": h.headroom, "bootstrap": [h.comparison.bootstrap.low, h.comparison.bootstrap.high],
                     "bayes": [h.comparison.bayes.low, h.comparison.bayes.high], "verdict": h.verdict})
    return rows


def run_headroom(cfg: HeadroomConfig, on_progress: OnProgress = no_progress) -> HeadroomRun:
    """Play every episode of ``cfg.model`` greedily once and sampled ``cfg.k`` times, write one headroom
    result (``cfg.save``, else ``RUN/results/headroom-NAME[-som].h5``) and summarise it."""
    from .agent import Decode, load_policy
    from .weights import describe, open_one

    policy = load_policy(Path(cfg.model), allow_pickle=cfg.allow_pickle, obs=cfg.obs, config=cfg.config)
    greedy = _evaluate(cfg, policy, Decode(greedy=True), 1, "greedy", on_progress)
    sampled = _evaluate(cfg, policy, Decode(greedy=False, temperature=cfg.temperature, top_p=cfg.top_p), cfg.k,
                        "sampled", on_progress)
    desc = describe(open_one(cfg.model, allow_pickle=cfg.allow_pickle, config=cfg.config))
    view = HeadroomResult.from_outcomes(greedy, sampled, desc, cfg, k=cfg.k, temperature=cfg.temperature,
                                        top_p=cfg.top_p)
    rows = headroom_rows(view)
    name = f"headroom-{Path(cfg.model).name}{'-som' if cfg.obs == 'som' else ''}.h5"
    dest = cfg.save or current_run() / "results" / name
    return HeadroomRun(tuple(rows), view, write_result(dest, view.to_result()))
