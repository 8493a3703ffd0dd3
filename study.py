"""The study in miniature: what ``graftkit demo`` runs, end to end, on the embedded default.

SFT on oracle demonstrations → headroom of the SFT policy → a GRPO grid on the ``mastered`` suite
(learning rates from null to collapse, several seeds) plus GRPO on the ``headroom`` suite → greedy
evaluation of every policy on identical episodes (25 seeds) with paired tests against SFT → delta
anatomy → graft sweeps (full factorial over groups) on a degraded and a collapsed run, with their double
dissociation → weight, delta and activation ranks and their coupling to success → the four findings of
DESIGN.md, each stated with its interval, whatever it came out as → the HTML report.

Each stage writes its outputs (a policy folder, or one result file) atomically and is skipped when its
output already exists, so a run killed mid-way resumes where it stopped without redoing finished work;
a GRPO run killed mid-way resumes from its last checkpoint. The stages are plain functions of a frozen
:class:`StudyConfig`; the command line only picks the preset and shows progress.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .errors import GraftkitError
from .webenv.tasks import SUITES

#: GRPO learning-rate regimes of the mastered-suite grid, calibrated on the embedded tiny policy with
#: ``graftkit eval --compare`` (see grids/paper18.yaml): null leaves success unchanged, degrade makes it
#: credibly worse, collapse destroys it.
REGIMES: dict[str, float] = {"null": 1e-5, "degrade": 3e-4, "collapse": 3e-3}


@dataclass(frozen=True)
class StudyConfig:
    """One run of the miniature study."""

    out: str = "runs/demo"
    """Run folder: policies, results/, report.html."""
    quick: bool = False
    """The CI-sized preset (fewer steps, seeds and probes); findings are stated all the same."""
    sft: str | None = None
    """Start from this SFT policy folder instead of training one (copied into the run)."""
    sft_steps: int = 6000
    """SFT optimizer steps (the default recipe of ``graftkit train sft``)."""
    sft_lr: float = 3e-3
    """SFT peak learning rate."""
    grpo_steps: int = 40
    """GRPO steps of every run."""
    regimes: Mapping[str, float] = field(default_factory=lambda: dict(REGIMES))
    """Learning-rate regimes of the mastered-suite grid (name → lr)."""
    seeds: tuple[int, ...] = (0, 1)
    """Training seeds of the mastered-suite grid."""
    headroom_lr: float = 3e-4
    """Learning rate of GRPO on the headroom suite."""
    headroom_seeds: tuple[int, ...] = (0,)
    """Training seeds of GRPO on the headroom suite."""
    eval_seeds: int = 25
    """Evaluation seeds (every policy plays identical episodes)."""
    eval_episodes: int = 2
    """Episodes per evaluation seed and task."""
    headroom_k: int = 8
    """Samples per episode when measuring headroom."""
    graft_groups: tuple[str, ...] = ("embed", "attn", "mlp", "norm")
    """Groups of the graft factorial (2^k configurations per swept run)."""
    graft_seeds: int = 25
    """Evaluation seeds of each graft configuration."""
    probes: int = 64
    """Probe prompts for activation ranks."""
    rank_layers: str = "late"
    """Layer band of the rank–success coupling."""
    threads: int = 2
    """torch threads."""

    @classmethod
    def preset(cls, out: str, quick: bool = False, **overrides) -> "StudyConfig":
        if quick:
            base = cls(out=out, quick=True, sft_steps=600, grpo_steps=12, seeds=(0, 1), eval_seeds=6,
                       eval_episodes=1, headroom_k=4, graft_groups=("embed", "attn", "mlp"), graft_seeds=6,
                       probes=16)
        else:
            base = cls(out=out)
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    def as_dict(self) -> dict:
        d = asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


@dataclass(frozen=True)
class RLRun:
    """One GRPO run of the study."""

    name: str
    suite: str
    regime: str
    lr: float
    seed: int


def rl_runs(cfg: StudyConfig) -> list[RLRun]:
    runs = [RLRun(f"{regime}-s{s}", "mastered", regime, lr, s) for regime, lr in cfg.regimes.items()
            for s in cfg.seeds]
    runs += [RLRun(f"headroom-s{s}", "headroom", "headroom", cfg.headroom_lr, s) for s in cfg.headroom_seeds]
    return runs


def all_tasks() -> list[str]:
    return list(SUITES["mastered"]) + list(SUITES["headroom"])


# ------------------------------------------------------------------------------------------ stages


@dataclass
class Study:
    """The run folder of one study and the callbacks that show its progress."""

    cfg: StudyConfig
    #: on_stage(name, status, detail): status is "start", "done" or "skip".
    on_stage: Callable[[str, str, str], None] = lambda name, status, detail: None
    #: on_work(stage, completed, total): fine-grained progress inside a stage.
    on_work: Callable[[str, int, int], None] = lambda stage, done, total: None
    timings: dict = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return Path(self.cfg.out)

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    def rl(self, run: RLRun) -> Path:
        return self.root / "rl" / run.name

    def stage(self, name: str, outputs: list[Path], fn: Callable[[], object], detail: str = "") -> None:
        """Run ``fn`` unless every output already exists (a finished stage is never redone)."""
        if outputs and all(p.exists() for p in outputs):
            self.on_stage(name, "skip", detail)
            return
        self.on_stage(name, "start", detail)
        t0 = time.perf_counter()
        fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        self.on_stage(name, "done", f"{time.perf_counter() - t0:.0f} s")


def training_curves(folder: Path, kind: str):
    """A run's train_log.jsonl as a labelled result: every numeric metric over [step]."""
    from .store import Result

    log = [json.loads(x) for x in (folder / "train_log.jsonl").read_text().splitlines() if x]
    keys = [k for k in log[0] if k != "step" and all(isinstance(m.get(k), (int, float)) for m in log)]
    data = {k: (("step",), np.array([float(m[k]) for m in log])) for k in keys}
    prov = json.loads((folder / "graftkit.json").read_text())
    return Result(f"train-{kind}", {"step": np.array([m["step"] for m in log])}, data,
                  {"model": str(folder.resolve()), "label": folder.name, "config": prov.get("config"),
                   "producer": prov.get("producer")})


def eval_result(outcome, model_desc: dict, extra: dict | None = None, kind: str = "eval", more: dict | None = None):
    """An evaluation as a labelled result: every episode's outcome over [task, seed, episode, sample]
    (``more``: further arrays over the same task/seed/episode axes, e.g. greedy outcomes beside sampled)."""
    from .store import Result

    dims = ("task", "seed", "episode", "sample")
    coords = {"task": np.array(outcome.tasks, dtype=object), "seed": np.array(outcome.seeds),
              "episode": np.arange(outcome.episodes), "sample": np.arange(outcome.samples)}
    for dims_more, values in (more or {}).values():
        for d, n in zip(dims_more, np.shape(values)):
            coords.setdefault(d, np.arange(n))
    data = {k: (dims, getattr(outcome, k)) for k in ("success", "reward", "turns", "invalid")}
    data["success"] = (dims, outcome.success.astype(np.int8))
    attrs = {"model": model_desc, "label": Path(model_desc.get("path", "model")).name,
             "decode": asdict(outcome.decode), "backend": outcome.backend, "obs": outcome.obs,
             "episode_seed": "env seed = 1000 * seed + episode", "seconds": outcome.seconds,
             "success": "raw reward == 1 at the end of the episode", **(extra or {})}
    return Result(kind, coords, {**data, **(more or {})}, attrs)


def _write(path: Path, result) -> Path:
    from .store import write_result

    return write_result(path, result)


def _policy(path: Path):
    from .agent import load_policy

    return load_policy(path)


def _evaluate(st: Study, stage: str, policy, tasks, seeds: int, episodes: int, decode, samples: int = 1):
    from .agent import evaluate

    total = len(tasks) * seeds * episodes * samples
    done = [0]

    def tick(_):
        done[0] += 1
        if done[0] % 16 == 0 or done[0] == total:
            st.on_work(stage, done[0], total)

    return evaluate(policy, tasks, list(range(seeds)), episodes, decode, samples=samples, on_episode=tick)


def stage_sft(st: Study) -> None:
    """Train the SFT policy with the default recipe (or copy the given one into the run)."""
    cfg = st.cfg

    def run():
        import shutil

        from .train.sft import SFTConfig, run_sft

        if cfg.sft:
            src = Path(cfg.sft)
            if not (src / "config.json").is_file():
                raise GraftkitError(f"--sft {src}: not an HF model folder (no config.json)",
                                    "pass a folder written by `graftkit train sft`")
            tmp = st.root / ".sft.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            tmp.rename(st.sft)
        else:
            sft_cfg = SFTConfig(out=str(st.sft), steps=cfg.sft_steps, lr=cfg.sft_lr, threads=cfg.threads)
            run_sft(sft_cfg, on_step=lambda m: st.on_work("sft", m["step"], cfg.sft_steps), force=True)
        if (st.sft / "train_log.jsonl").is_file():
            _write(st.results / "train-sft-sft.h5", training_curves(st.sft, "sft"))

    st.stage("sft", [st.sft / "graftkit.json"], run, "SFT on oracle demonstrations")


def stage_headroom(st: Study) -> Path:
    """Greedy vs sampled success of the SFT policy on every task."""
    from .agent import Decode
    from .weights import describe, open_checkpoint

    cfg, dest = st.cfg, st.results / "headroom-sft.h5"

    def run():
        policy = _policy(st.sft)
        tasks = all_tasks()
        greedy = _evaluate(st, "headroom", policy, tasks, cfg.eval_seeds, cfg.eval_episodes, Decode(greedy=True))
        sampled = _evaluate(st, "headroom", policy, tasks, cfg.eval_seeds, cfg.eval_episodes,
                            Decode(greedy=False, temperature=1.0), samples=cfg.headroom_k)
        _write(dest, eval_result(sampled, describe(open_checkpoint(st.sft)),
                                 {"k": cfg.headroom_k, "temperature": 1.0, "top_p": 1.0}, kind="headroom",
                                 more={"greedy_success": (("task", "seed", "episode", "greedy_sample"),
                                                          greedy.success.astype(np.int8))}))

    st.stage("headroom", [dest], run, f"greedy vs sampled (k={cfg.headroom_k}) on {len(all_tasks())} tasks")
    return dest


def stage_grpo(st: Study) -> None:
    """Every GRPO run of the grid; a run killed mid-way resumes from its newest checkpoint."""
    from .train.grpo import GRPOConfig, latest_checkpoint, run_grpo

    cfg = st.cfg
    for run in rl_runs(cfg):
        gcfg = GRPOConfig(init=str(st.sft), out=str(st.rl(run)), tasks=SUITES[run.suite], steps=cfg.grpo_steps,
                          lr=run.lr, seed=run.seed, threads=cfg.threads,
                          checkpoint_every=max(1, cfg.grpo_steps // 4))

        def go(gcfg=gcfg, run=run):
            run_grpo(gcfg, resume=latest_checkpoint(gcfg) is not None, force=True,
                     on_step=lambda m: st.on_work(f"grpo {run.name}", m["step"], gcfg.steps))
            _write(st.results / f"train-grpo-{run.name}.h5", training_curves(st.rl(run), "grpo"))

        st.stage(f"grpo {run.name}", [st.results / f"train-grpo-{run.name}.h5"], go,
                 f"{run.suite} suite, lr {run.lr:g}, seed {run.seed}")


def models(st: Study) -> dict[str, Path]:
    """label → policy folder: the SFT policy, then every RL run."""
    return {"sft": st.sft, **{r.name: st.rl(r) for r in rl_runs(st.cfg)}}


def stage_eval(st: Study) -> None:
    """Greedy evaluation of every policy on every task, on identical episodes."""
    from .agent import Decode
    from .weights import describe, open_checkpoint

    cfg = st.cfg
    for label, path in models(st).items():
        dest = st.results / f"eval-{label}-greedy.h5"

        def go(label=label, path=path, dest=dest):
            o = _evaluate(st, f"eval {label}", _policy(path), all_tasks(), cfg.eval_seeds, cfg.eval_episodes,
                          Decode(greedy=True))
            _write(dest, eval_result(o, describe(open_checkpoint(path))))

        st.stage(f"eval {label}", [dest], go, f"{cfg.eval_seeds} seeds × {cfg.eval_episodes} episodes, greedy")


def stage_delta(st: Study) -> Path:
    """Delta anatomy of every RL run against the SFT policy."""
    from .graft import delta_anatomy
    from .weights import describe, open_checkpoint

    dest = st.results / "delta.h5"

    def run():
        base = open_checkpoint(st.sft)
        runs = rl_runs(st.cfg)
        rls = [open_checkpoint(st.rl(r)) for r in runs]
        res = delta_anatomy(base, rls, [r.name for r in runs], base.taxonomy(),
                            provenance={"base": describe(base), "runs": [describe(c) for c in rls]})
        _write(dest, res)

    st.stage("delta anatomy", [dest], run, f"{len(rl_runs(st.cfg))} runs against SFT")
    return dest


# ---------------------------------------------------------------------------------------- findings


def suite_outcomes(res, tasks) -> np.ndarray:
    """Greedy outcomes of ``tasks`` from an eval result as [seed, task·episode] (rows are the clusters
    that paired statistics resample)."""
    names = list(res.coords["task"])
    idx = [names.index(t) for t in tasks]
    s = np.asarray(res["success"])[idx][..., 0]  # [task, seed, episode]
    return s.transpose(1, 0, 2).reshape(s.shape[1], -1)


def _pts(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:+.1f}"


def _interval(c) -> str:
    return f"{_pts(c.diff)} points [{_pts(c.bootstrap.low)}, {_pts(c.bootstrap.high)}]"


@dataclass(frozen=True)
class Finding:
    """One of the study's four findings as this run found it."""

    number: int
    claim: str
    statement: str
    estimate: float
    low: float
    high: float
    verdict: str  # "reproduced", "partly reproduced", "not reproduced" or "not measured"


def finding_1(evals: Mapping[str, object], runs: list[RLRun]) -> Finding:
    """No configuration credibly improves the SFT baseline on the mastered suite; the middle learning
    rate degrades it and the highest collapses it (success at most half of SFT's)."""
    from .stats import BETTER, WORSE, compare

    tasks = SUITES["mastered"]
    sft = suite_outcomes(evals["sft"], tasks)
    grid = [r for r in runs if r.suite == "mastered"]
    comps = {r.name: compare(sft, suite_outcomes(evals[r.name], tasks)) for r in grid}
    better = [n for n, c in comps.items() if c.verdict == BETTER]
    best = max(comps, key=lambda n: comps[n].diff)
    by_regime = {}
    for r in grid:
        by_regime.setdefault(r.regime, []).append(comps[r.name])
    parts = []
    for regime, cs in by_regime.items():
        worse = sum(c.verdict == WORSE for c in cs)
        parts.append(f"{regime}: {worse}/{len(cs)} credibly worse, mean change {_pts(float(np.mean([c.diff for c in cs])))}")
    sft_rate = float(sft.mean())
    degrade_ok = all(c.verdict == WORSE for c in by_regime.get("degrade", [])) and "degrade" in by_regime
    collapse_ok = "collapse" in by_regime and all(
        c.verdict == WORSE and c.rate_b.rate <= 0.5 * sft_rate for c in by_regime["collapse"])
    verdict = ("reproduced" if not better and degrade_ok and collapse_ok else
               "partly reproduced" if not better and (degrade_ok or collapse_ok) else "not reproduced")
    statement = (f"SFT greedy success on the mastered suite {100 * sft_rate:.1f}%. {len(better)}/{len(comps)} GRPO runs "
                 f"credibly improve it; best run {best}: {_interval(comps[best])}. " + "; ".join(parts) + ".")
    c = comps[best]
    return Finding(1, "No GRPO configuration credibly improves a strong SFT baseline on mastered tasks; a middle "
                      "learning rate degrades it and a high one collapses it.",
                   statement, c.diff, c.bootstrap.low, c.bootstrap.high, verdict)


def finding_2(evals: Mapping[str, object], runs: list[RLRun], headroom_res) -> Finding:
    """On the headroom suite (sampled success > greedy), the same recipe raises greedy success."""
    from .stats import BETTER, compare

    tasks = SUITES["headroom"]
    sft = suite_outcomes(evals["sft"], tasks)
    hr = [r for r in runs if r.suite == "headroom"]
    if not hr:
        return Finding(2, "GRPO helps only where there is headroom.", "no headroom-suite run", math.nan, math.nan,
                       math.nan, "not measured")
    comps = [compare(sft, suite_outcomes(evals[r.name], tasks)) for r in hr]
    pooled = compare(np.concatenate([sft] * len(hr), 1),
                     np.concatenate([suite_outcomes(evals[r.name], tasks) for r in hr], 1))
    g = np.asarray(headroom_res["greedy_success"]).astype(float)
    s = np.asarray(headroom_res["success"]).astype(float)
    names = list(headroom_res.coords["task"])
    idx = [names.index(t) for t in tasks]
    head = float(s[idx].mean() - g[idx].mean())
    statement = (f"SFT headroom on the headroom suite (sampled − greedy) {_pts(head)} points; GRPO on that suite "
                 f"changes greedy success by {_interval(pooled)} "
                 f"({sum(c.verdict == BETTER for c in comps)}/{len(comps)} runs credibly better).")
    verdict = "reproduced" if pooled.verdict == BETTER else "not reproduced"
    return Finding(2, "On tasks with headroom (sampled success above greedy), GRPO raises success.", statement,
                   pooled.diff, pooled.bootstrap.low, pooled.bootstrap.high, verdict)


def findings_result(findings: list[Finding], cfg: StudyConfig):
    from .store import Result

    f = sorted(findings, key=lambda x: x.number)
    arr = lambda key, dt=float: np.array([getattr(x, key) for x in f], dtype=dt)  # noqa: E731
    return Result("findings", {"finding": np.array([str(x.number) for x in f], dtype=object)},
                  {"claim": (("finding",), arr("claim", object)), "statement": (("finding",), arr("statement", object)),
                   "estimate": (("finding",), arr("estimate")), "low": (("finding",), arr("low")),
                   "high": (("finding",), arr("high")), "verdict": (("finding",), arr("verdict", object))},
                  {"config": cfg.as_dict(), "interval": "95% paired bootstrap over evaluation seeds, then episodes",
                   "units": "estimate/low/high: success-rate difference (fraction) unless the statement says otherwise"})
