"""Sweeps of a control grid: a grid file expands to frozen run specs, an executor runs them.

Grid file (YAML)::

    out: runs/paper18            # every run writes <out>/<name>
    inits:                       # named initial policies (paths relative to the grid file's folder
      sft: ../runs/demo/sft      #   or absolute); a run's ``init`` may name one
    base: {steps: 40, tasks: mastered, init: sft}   # GRPOConfig fields shared by every run
    product: {lr: [3e-5, 3e-4], seed: [0, 1]}       # optional: the Cartesian product of these lists
    runs:                                           # optional: explicit runs (overrides of base)
      - {name: kl-high, lr: 3e-4, beta: 0.2}

The runs are the product's combinations followed by the explicit runs; a run's name is given or made
from its overrides (``lr3e-04_seed1``). Names must be unique. Executing skips completed runs (their
final folder records the full step count), resumes partial runs from their newest checkpoint, and starts
the rest; ``--dry-run`` prints the specs and runs nothing.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from ..core.errors import GraftkitError
from ..core.suites import suites
from .configs import GRPOConfig, SweepConfig  # noqa: F401 (SweepConfig: the command's config)
from .grpo import latest_checkpoint, run_grpo

_FIELDS = set(GRPOConfig.__dataclass_fields__) - {"out"}


@dataclass(frozen=True)
class RunSpec:
    name: str
    config: GRPOConfig

    def status(self) -> str:
        """``done``, ``partial`` (a checkpoint to resume from) or ``new``."""
        final = Path(self.config.out) / "graftkit.json"
        if final.is_file() and json.loads(final.read_text()).get("step") == self.config.steps:
            return "done"
        return "partial" if latest_checkpoint(self.config) is not None else "new"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.0e}" if v and (abs(v) < 1e-2 or abs(v) >= 1e3) else f"{v:g}"
    return str(v)


def _tasks(v) -> tuple[str, ...]:
    names = v.split(",") if isinstance(v, str) else list(v)
    out: list[str] = []
    for n in (x.strip() for x in names):
        out.extend(suites().get(n, (n,)))
    return tuple(out)


def expand(grid_path: Path) -> list[RunSpec]:
    """The run specs of a grid file (see the module docstring)."""
    grid_path = Path(grid_path)
    try:
        grid = yaml.safe_load(grid_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise GraftkitError(f"{grid_path}: cannot read the grid ({str(exc).splitlines()[0]})") from None
    unknown = set(grid) - {"out", "inits", "base", "product", "runs"}
    if unknown:
        raise GraftkitError(f"{grid_path}: unknown key(s) {sorted(unknown)}", "use out, inits, base, product, runs")
    root = grid_path.parent
    out = Path(grid.get("out") or "runs/sweep")
    out = out if out.is_absolute() else root / out
    inits = {k: str(Path(v) if Path(v).is_absolute() else (root / v)) for k, v in (grid.get("inits") or {}).items()}
    base = dict(grid.get("base") or {})
    product = grid.get("product") or {}
    combos = [dict(zip(product, values)) for values in itertools.product(*product.values())] if product else []
    runs = combos + [dict(r) for r in (grid.get("runs") or [])]
    if not runs:
        raise GraftkitError(f"{grid_path}: no runs (give a product, runs, or both)")
    specs, seen = [], set()
    for overrides in runs:
        name = overrides.pop("name", None) or "_".join(f"{k}{_fmt(v)}" for k, v in overrides.items()) or "base"
        fields = {**base, **overrides}
        bad = set(fields) - _FIELDS
        if bad:
            raise GraftkitError(f"{grid_path}: run {name}: unknown setting(s) {sorted(bad)}",
                                f"GRPO settings are: {', '.join(sorted(_FIELDS))}")
        if "init" not in fields:
            raise GraftkitError(f"{grid_path}: run {name} has no init", "set base.init or the run's init")
        fields["init"] = inits.get(fields["init"], fields["init"])
        if "tasks" in fields:
            fields["tasks"] = _tasks(fields["tasks"])
        if name in seen:
            raise GraftkitError(f"{grid_path}: two runs are named {name}", "give them distinct names")
        seen.add(name)
        cfg = GRPOConfig(out=str(out / name), **fields)
        if cfg.trainer != "graftkit":  # a sweep's runs train with graftkit's own trainer (train.grpo.run_grpo)
            raise GraftkitError(f"{grid_path}: run {name}: trainer {cfg.trainer}: a sweep trains with graftkit's own "
                                "trainer", "drop trainer from the grid, or train the run alone with graftkit train "
                                "grpo --trainer trl")
        specs.append(RunSpec(name, cfg))
    return specs


def _train(state, unit: tuple[int, GRPOConfig, bool], local: bool,
           on_step: Callable[[int, dict], None] | None = None) -> str:
    """One run of a grid as an executor's unit: ``(index, config, resume)``. On a Ray worker the run takes
    the device as the worker sees its GPU, and its steps stay there (``on_step`` is for this process only)."""
    from dataclasses import replace

    from ..core.executor import worker_device

    i, cfg, resume = unit
    if not local:
        cfg = replace(cfg, device=worker_device(cfg.device))
    report = (lambda m: on_step(i, m)) if on_step is not None else (lambda m: None)
    return str(run_grpo(cfg, resume=resume, force=True, on_step=report))


def sweep_device(specs: list[RunSpec]) -> str:
    """The device the runs of a grid ask for, for sizing Ray workers: cuda where any run names a CUDA
    device, cpu where every run does, else auto."""
    devices = {s.config.device for s in specs}
    return "cuda" if any(d.startswith("cuda") for d in devices) else ("cpu" if devices == {"cpu"} else "auto")


def run_sweep(specs: list[RunSpec], on_run: Callable[[RunSpec, str], None] = lambda s, st: None,
              on_step: Callable[[RunSpec, dict], None] = lambda s, m: None, *, executor: str = "serial",
              ray_address: str = "local", workers: int | None = None,
              on_done: Callable[[RunSpec], None] = lambda s: None) -> list[dict]:
    """Run every spec in order: skip completed ones, resume partial ones. Returns one record per run.

    The runs left to train are the units of the ``executor``: in this process, in order (serial), or each on
    a Ray worker (one GPU each where the runs ask for CUDA). ``on_run`` is called as each is started (finished
    runs first, reported as done), ``on_done`` as each finishes, ``on_step`` with each step in this process
    (a Ray worker's steps stay on the worker)."""
    import functools

    from ..core.executor import Executor

    statuses = [s.status() for s in specs]
    records = [{"name": s.name, "status": st, "out": s.config.out} for s, st in zip(specs, statuses)]
    todo = [i for i, st in enumerate(statuses) if st != "done"]
    for spec, status in zip(specs, statuses):  # a finished run is only reported: no worker starts for it
        if status == "done":
            on_run(spec, status)
            on_done(spec)
    ex = Executor(executor, ray_address, workers, sweep_device([specs[i] for i in todo]) if todo else "cpu")
    ex.run([(i, specs[i].config, statuses[i] == "partial") for i in todo],
           functools.partial(_train, local=ex.local, on_step=(lambda i, m: on_step(specs[i], m)) if ex.local else None),
           on_start=lambda j: on_run(specs[todo[j]], statuses[todo[j]]),
           on_result=lambda j, out: on_done(specs[todo[j]]))
    return records
