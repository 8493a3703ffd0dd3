"""``graftkit graft``: export one graft (or plan it with ``--dry-run``), or evaluate grafts in memory.

Export: θ = θ_base + α·M⊙Δ for the chosen groups and layers, written as an HF folder (:func:`run_graft`).
``--eval`` (one graft), ``--sweep`` (a family of grafts) and ``--vs`` (the same sweep for a second RL run,
then the double-dissociation test) load the base policy once per worker of the executor (this process, or
each Ray worker with ``--executor ray``), graft each configuration into it in place, evaluate it on
identical episodes and compare it with base and RL (:func:`run_graft_experiments`). A sweep writes a
partial result after every configuration and resumes from it (or from its finished result) without
playing a finished configuration again. ``--metric kl`` scores each configuration instead (``both``: as well) by
the fraction of RL's behavioural change it reproduces, from forward passes on RL's and SFT's own rollouts played
once per sweep on the first worker (:mod:`graftkit.graft.kl`); :func:`sweep_tables` is what the command prints.
``--all-checkpoints`` reads a trainer's output_dir given to ``--from`` as its training trajectory: every checkpoint's
sweep in step order on the same workers (the base loaded once per worker, its own outcomes played once), each its own
result that resumes on its own, and :func:`trajectory_tables`: one row per step, a column per swept group.

:class:`GraftConfig` serves four modes (:data:`MODE_FIELDS`): export, ``--eval``, ``--sweep`` and ``--vs``;
each validates what it reads, and refuses a flag only another mode reads.

A graft keeps the base's dtype. An RL checkpoint that stores tensors in another dtype is refused unless
``--cast``, which reads RL's values rounded to base's dtype (:func:`graftkit.weights.cast_like`); the
notes and the output's ``graftkit.json`` say what was cast. A pair that is no fine-tune
(:data:`graftkit.weights.FINE_TUNE_RULE`) is refused unless ``--force-pair``: the export checks it in one
extra streaming pass over the matrices before writing (its own pass copies bytes in the kernel, unseen),
``--eval``/``--sweep`` in the delta pass that gives the movement shares, before the policy loads.
``--dry-run`` reads no tensor values, so it does not judge the pair.
"""

from __future__ import annotations

import functools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from ..core.config import DeviceOption, EngineOption, ExecutorOption, OnProgress, RunOption, check_choice, no_progress, opt
from ..core.errors import GraftkitError
from ..results.layout import (GRAFT_SWEEP, RESULTS, dissociation_path_of, glob_pattern, partial_path, result_labels,
                              run_layout, sweep_kl_path, sweep_path, with_tag)
from ..results.store import write_result
from ..verifiable.format import FORMAT_FIX, MOSTLY_UNPARSED, PromptOption
from ..weights.commands import ReadOptions
from ..weights.resolve import base_of, checkpoint_of, checkpoints_of
from ..weights.runs import recorded_step
from . import attribution as attr
from . import experiments as X
from .plan import GraftSpec
from .sparse import SCOPES


#: Fields of :class:`GraftConfig` that only evaluations in memory read: the episodes, where they run, where
#: their results go.
EPISODE_FIELDS = ("tasks", "seeds", "episodes", "sample", "temperature", "max_new_tokens", "batch_size", "save",
                  "results", "device", "dtype", "engine", "executor", "ray_address", "workers", "items", "system",
                  "template", "answer_format")
#: The modes of ``graftkit graft`` (:attr:`GraftConfig.mode`) and the fields each reads beyond those every mode
#: reads (the pair, how it is read and judged, ``groups``, ``dry_run``). A field set in a mode that does not
#: read it is an error, not ignored without a word.
MODE_FIELDS: dict[str, frozenset[str]] = {
    "export": frozenset({"layers", "alpha", "reverse", "top_frac", "top_scope", "out_dir", "force", "max_shard_size"}),
    "eval": frozenset({"layers", "alpha", "reverse", "top_frac", "top_scope", "metric", "all_checkpoints",
                       *EPISODE_FIELDS}),
    "sweep": frozenset({"layers", "alphas", "fracs", "top_frac", "top_scope", "metric", "all_checkpoints",
                        *EPISODE_FIELDS}),
    "dissociation": frozenset({"layers", "vs", "metric", *EPISODE_FIELDS}),
}
#: Each mode as the error messages name it.
MODE_NAMES = {"export": "an export", "eval": "--eval", "sweep": "--sweep", "dissociation": "--vs"}


@dataclass(frozen=True, kw_only=True)
class GraftConfig(ReadOptions, RunOption, DeviceOption, EngineOption, ExecutorOption, PromptOption):
    """``graftkit graft``: splice RL's delta for some groups and layers into the base, or evaluate grafts."""

    command = "graft"
    rl: Path = opt(flags=("--from",))
    """RL checkpoint: HF folder, .safetensors, or LoRA adapter (a trainer's output_dir: its last checkpoint)."""
    all_checkpoints: bool = False
    """With --eval/--sweep: a trainer's output_dir given to --from stands for every one of its checkpoints, in step
    order (the training trajectory): the sweep of each, its own result, and a row per step."""
    groups: Optional[str] = None
    """Groups to move: comma list of embed,attn,mlp,norm,lm_head,vision,projector | all | none (a sweep: the
    groups it varies, default every group present)."""
    base: Optional[Path] = None
    """The SFT base (default: the parent recorded in graftkit.json)."""
    layers: str = "all"
    """Decoder layers: all | early | mid | late | 0-3,10."""
    alpha: float = 1.0
    """Scale of the grafted delta (1 = exact copy of RL's tensors)."""
    reverse: bool = False
    """Revert the selection in the RL model to base (ablation)."""
    top_frac: Optional[float] = None
    """Move only this fraction F of the selected tensors' entries: the ⌈F·n⌉ of largest |Δ| (exact; F = 1 is the
    whole graft); the rest keep base's value (RL's with --reverse)."""
    top_scope: str = "tensor"
    """With --top-frac: tensor (each tensor keeps its own top fraction) or global (the top fraction of every
    selected entry together: a tensor that moved more keeps more)."""
    out_dir: Optional[Path] = opt(None, flags=("--out",))
    """Output folder (default: RUN/grafts/<name>)."""
    force: bool = False
    """Replace an existing output folder written by graftkit."""
    cast: bool = False
    """RL stores tensors in another dtype than base: cast RL's values to base's dtype (round to nearest).
    The graft always keeps base's dtype; without this flag such a pair is refused."""
    shared_vocab: bool = False
    """RL's vocabulary was resized (extra token rows): compare and graft over the rows both share, reporting the
    extra ones; refused by default."""
    force_pair: bool = False
    """Graft a pair that is no fine-tune (RL moved most matrices by their own norm or more, or points
    elsewhere); refused by default. Not --force, which replaces an existing output folder."""
    dry_run: bool = False
    """List what would move, per group and layer; write nothing."""
    max_shard_size: str = "5GB"
    """HF max shard size of the output."""
    eval_: bool = opt(False, flags=("--eval",))
    """Graft in memory and evaluate against base and RL on identical episodes (no export)."""
    sweep: Optional[str] = None
    """Evaluate a sweep of in-memory grafts: single | loo | factorial | layers | alpha | sparsity."""
    alphas: str = "0,0.25,0.5,0.75,1"
    """α values of --sweep alpha."""
    fracs: str = "0.001,0.01,0.05,0.2,0.5,1"
    """Fractions F of --sweep sparsity: each grafts the top F of the groups' entries by |Δ| (--top-scope says
    where F counts)."""
    vs: Optional[Path] = opt(None, flags=("--vs",))
    """A second RL run of the same base: run the sweep for it too and test a double dissociation."""
    tasks: str = "mastered"
    """With --eval/--sweep: suite (mastered, headroom, all) or comma list of tasks."""
    seeds: int = 25
    """With --eval/--sweep: evaluation seeds 0..N-1."""
    episodes: int = 4
    """With --eval/--sweep: episodes per seed and task."""
    items: str = "auto"
    """With --eval/--sweep: auto (a generated task's held-out items, every item of a user's FILE.jsonl: nothing in
    a sweep trains on it), heldout (only items training never draws), train or all (every seed's own item)."""
    sample: bool = False
    """With --eval/--sweep: sample actions instead of greedy decoding."""
    temperature: float = 1.0
    """Sampling temperature."""
    max_new_tokens: int = 32
    """With --eval/--sweep: longest action in tokens (longer turns are cut and count invalid)."""
    batch_size: int = 64
    """Episodes advanced together."""
    metric: str = "success"
    """With --eval/--sweep: what scores each configuration: success (its episodes played and compared), kl (the
    fraction of RL's behavioural change it reproduces, 1 − KL(π_RL‖π_graft)/KL(π_RL‖π_SFT) on RL's rollouts and
    KL(π_SFT‖π_graft)/KL(π_SFT‖π_RL) on SFT's, by forward passes on rollouts played once at temperature 1) or
    both."""
    save: Optional[Path] = opt(None, flags=("--save",))
    """With --eval/--sweep: HDF5 result (default: RUN/results/graft-<sweep>-<rl>.h5, with --metric kl
    graft-<sweep>-<rl>-kl.h5)."""
    results: Optional[Path] = opt(None, cli=False)
    """Folder of the sweep and dissociation results (default: RUN/results)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        {"export": self._check_export, "eval": self._check_eval, "sweep": self._check_sweep,
         "dissociation": self._check_dissociation}[self.mode]()
        self._check_mode_fields()
        self._check_engine()
        check_choice(self.items, ("auto", "heldout", "train", "all"), "--items")
        if self.top_frac is None and self.top_scope != _default("top_scope") and self.sweep != "sparsity":
            raise GraftkitError("--top-scope says where --top-frac counts, and no --top-frac was given",
                                "pass e.g. --top-frac 0.01, or drop --top-scope")
        if self.all_checkpoints and self.save is not None:
            raise GraftkitError("--save names one result file, but --all-checkpoints writes one per checkpoint",
                                f"drop --save: each checkpoint's sweep goes to RUN/{RESULTS}/"
                                f"{glob_pattern(GRAFT_SWEEP, label='RUN-checkpoint-N')}")

    def _check_export(self) -> None:
        if self.groups is None:
            raise GraftkitError("--groups is required to export a graft",
                                "pass e.g. --groups attn,mlp (or --sweep single)")
        self.spec()
        from ..weights import parse_size

        parse_size(self.max_shard_size)

    def _check_eval(self) -> None:
        if self.groups is None:
            raise GraftkitError("--eval needs --groups", "pass e.g. --groups attn,mlp")
        self.spec()
        self._check_metric()

    def _check_metric(self) -> None:
        """--metric is one of :data:`METRICS`; KL rollouts are sampled at temperature 1, so with --metric kl alone
        the success path's decoding flags would be read by nothing."""
        check_choice(self.metric, X.METRICS, "--metric")
        if self.metric == "kl":
            for name in ("sample", "temperature"):
                if getattr(self, name) != _default(name):
                    raise GraftkitError(f"{_flag(name)} applies to --metric success and both (the episodes each "
                                        "configuration plays), not to --metric kl, whose rollouts are sampled at "
                                        "temperature 1", f"drop {_flag(name)}")

    def _check_sweep(self) -> None:
        if self.sweep not in X.SWEEPS:
            raise GraftkitError(f"unknown --sweep {self.sweep!r}", f"use one of {', '.join(X.SWEEPS)}")
        if self.reverse:
            raise GraftkitError("--reverse applies to one graft, not a sweep", "drop --reverse or --sweep")
        if self.groups not in (None, "all"):
            GraftSpec.parse(self.groups)
        self.alpha_values()
        if self.sweep != "alpha" and self.alphas != _default("alphas"):
            raise GraftkitError(f"--alphas applies to --sweep alpha, not --sweep {self.sweep}", "drop --alphas")
        if self.sweep != "sparsity" and (self.fracs != _default("fracs") or self.top_scope != _default("top_scope")):
            flag = "--fracs" if self.fracs != _default("fracs") else "--top-scope"
            raise GraftkitError(f"{flag} applies to --sweep sparsity, not --sweep {self.sweep}", f"drop {flag}")
        if self.top_frac is not None:
            raise GraftkitError("--top-frac grafts one fraction; a sweep over fractions is --sweep sparsity --fracs",
                                "pass --sweep sparsity --fracs F1,F2,... or drop --top-frac")
        check_choice(self.top_scope, SCOPES, "--top-scope")
        bad = [f"{f:g}" for f in self.frac_values() if not 0 < f <= 1]
        if bad:
            raise GraftkitError(f"--fracs {', '.join(bad)}: each must be a fraction in (0, 1]",
                                "pass e.g. --fracs 0.001,0.01,0.1,1")
        if self.sweep == "layers" and self.layers != _default("layers"):
            raise GraftkitError("--sweep layers grafts each band early, mid, late and all itself: --layers applies "
                                "to the other sweeps", "drop --layers")
        if self.vs is None:
            self._check_metric()

    def _check_dissociation(self) -> None:
        if self.sweep is not None and self.sweep not in X.SWEEPS:
            raise GraftkitError(f"unknown --sweep {self.sweep!r}", f"use one of {', '.join(X.SWEEPS)}")
        if self.kind not in X.GROUP_EFFECT:
            raise GraftkitError(f"--vs needs --sweep single, loo or factorial (got {self.kind})",
                                "pass e.g. --sweep single --vs RL2")
        if self.metric == "kl":  # the test compares success effects; each run's sweep may carry KL beside them
            raise GraftkitError("--vs tests a double dissociation of success effects, which --metric kl does not play",
                                "pass --metric both (each run's sweep scored by KL as well) or drop --metric")
        self._check_sweep()

    def _check_engine(self) -> None:
        if self.engine != "hf":  # hf needs no check, and an export or a delta then never imports the agent (torch)
            from ..agent.engine import resolve_engine

            resolve_engine(self.engine)

    def _check_mode_fields(self) -> None:
        """A mode-specific field (:data:`MODE_FIELDS`) set in a mode that does not read it is an error."""
        read = MODE_FIELDS[self.mode]
        for name in sorted(set().union(*MODE_FIELDS.values()) - read, key=_FIELD_ORDER.index):
            if getattr(self, name) != _default(name):
                users = [MODE_NAMES[m] for m in MODE_FIELDS if name in MODE_FIELDS[m]]
                users = ", ".join(users[:-1]) + f" and {users[-1]}" if len(users) > 1 else users[0]
                flag = _flag(name)
                raise GraftkitError(f"{flag} applies to {users}, not to {MODE_NAMES[self.mode]}", f"drop {flag}")

    @property
    def mode(self) -> str:
        """export (write one graft), eval (evaluate one graft in memory), sweep (a family of grafts in memory)
        or dissociation (the sweep for --from and for --vs, and the double-dissociation test)."""
        if self.vs is not None:
            return "dissociation"
        if self.sweep is not None:
            return "sweep"
        return "eval" if self.eval_ else "export"

    @property
    def rl_paths(self) -> dict[str, Path]:
        """The RL runs by key: A (--from) and, with --vs, B."""
        return {"A": self.rl, **({"B": self.vs} if self.vs is not None else {})}

    @property
    def experiments(self) -> bool:
        """Evaluate grafts in memory (--eval, --sweep, --vs) rather than export one."""
        return self.eval_ or self.sweep is not None or self.vs is not None

    @property
    def kind(self) -> str:
        """The sweep, or ``eval`` for one graft."""
        return self.sweep or "eval"

    @property
    def episode_items(self) -> str:
        """Which items the episodes draw: ``auto`` is a generated task's held-out items."""
        return "heldout" if self.items == "auto" else self.items

    @property
    def whole_tasks(self) -> tuple[str, ...]:
        """Under ``--items auto``, the user's files among the tasks: played on every item (nothing in a sweep trains
        on them)."""
        if self.items != "auto" or self.mode == "export":
            return ()
        from ..agent.tasks import resolve_tasks, task_spec

        return tuple(t for t in resolve_tasks(self.tasks, self.prompt_format) if task_spec(t).items is not None)

    def spec(self) -> GraftSpec:
        return GraftSpec.parse(self.groups, self.layers, self.alpha, self.reverse, self.top_frac, self.top_scope)

    def frac_values(self) -> list[float]:
        try:
            return [float(f) for f in self.fracs.split(",") if f.strip()]
        except ValueError:
            raise GraftkitError(f"--fracs {self.fracs!r}: expected a comma list of numbers",
                                "e.g. --fracs 0.001,0.01,0.1,1") from None

    def alpha_values(self) -> list[float]:
        try:
            return [float(a) for a in self.alphas.split(",") if a.strip()]
        except ValueError:
            raise GraftkitError(f"--alphas {self.alphas!r}: expected a comma list of numbers",
                                "e.g. --alphas 0,0.5,1") from None


_FIELD_ORDER = [f.name for f in fields(GraftConfig)]


def _default(name: str):
    return next(f.default for f in fields(GraftConfig) if f.name == name)


def _flag(name: str) -> str:
    """How a field of :class:`GraftConfig` is given: its command-line flag, or (an API-only field) ``name=``."""
    f = next(f for f in fields(GraftConfig) if f.name == name)
    if not f.metadata.get("cli", True):
        return f"{name}="
    return (f.metadata.get("flags") or (f"--{name.replace('_', '-')}",))[0]


def default_graft_out(cfg: GraftConfig) -> Path:
    """RUN/grafts/<rl>-<groups>-<layers>[-a<α>][-reverse]."""
    tag = f"{result_labels([cfg.rl])[0]}-{cfg.groups.replace(',', '+') or 'none'}-{cfg.layers.replace(',', '_')}"
    if cfg.alpha != 1:
        tag += f"-a{cfg.alpha:g}"
    if cfg.top_frac is not None:
        tag += f"-top{cfg.top_frac:g}" + ("-global" if cfg.top_scope == "global" else "")
    if cfg.reverse:
        tag += "-reverse"
    return run_layout(cfg.run).grafts / tag


# ------------------------------------------------------------------------------------------ export


def run_graft(cfg: GraftConfig, on_progress: OnProgress = no_progress):
    """``graftkit graft``: the export (or its ``--dry-run`` plan) as a summary dict, or with --eval /
    --sweep / --vs the :class:`GraftExperiments` of :func:`run_graft_experiments` (its plan with --dry-run)."""
    if cfg.experiments:
        return run_graft_experiments(cfg, on_progress)
    from ..weights import check_fine_tune, guard_pair_distance, notes, open_pair, shared_vocab
    from ..weights.writer import check_output_room
    from .export import export_graft
    from .plan import plan_graft
    from .plan import sparsify

    t0 = time.perf_counter()
    spec = cfg.spec()
    cfg = cfg.replace(rl=checkpoint_of(cfg.rl, "--from"))  # a trainer's output_dir: its last checkpoint
    base_path = base_of(cfg.rl, cfg.base)
    b, (stored,) = open_pair(base_path, [cfg.rl], no_pickle=cfg.no_pickle, unknown=cfg.unknown,
                             config=cfg.config)
    tax = b.taxonomy(cfg.unknown)
    r = _cast_pair(cfg, b, stored, tax)
    plan = sparsify(plan_graft(tax, spec), b, r)  # a top-fraction graft's entries, chosen from the pair's values
    moved = {}
    for n in plan.selected:
        role = tax.roles[n]
        key = (role.group, role.layer if role.stack == "decoder" else None)
        row = moved.setdefault(key, {"tensors": 0, "bytes": 0, "names": []})
        row["tensors"] += 1
        row["bytes"] += b.metas[n].nbytes
        row["names"].append(n)
        if plan.sparsity is not None:  # a top-fraction graft: how many of the row's entries move
            size = b.metas[n].numel
            row["entries"] = row.get("entries", 0) + size
            row["selected_entries"] = row.get("selected_entries", 0) + (
                plan.cuts[n].selected if n in plan.cuts else size if plan.coef[n] != spec.neutral else 0)
    summary = {
        "base": str(base_path), "rl": str(cfg.rl), "spec": spec.as_dict(),
        "notes": notes(b, r) + list(plan.notes),
        "selected": [{"group": g, "layer": L, **v} for (g, L), v in
                     sorted(moved.items(), key=lambda x: (x[0][0], x[0][1] if x[0][1] is not None else -1))],
        "selected_bytes": sum(v["bytes"] for v in moved.values()),
        "total_bytes": b.nbytes, "neutral_coefficient": spec.neutral,  # an unselected tensor's (or entry's)
        **({"sparsity": dict(plan.sparsity)} if plan.sparsity is not None else {}),
    }
    if cfg.dry_run:
        return {**summary, "dry_run": True}
    out = cfg.out_dir or default_graft_out(cfg)
    # the output's size is known (the base's): a disk that cannot hold it, or cannot be written, is refused
    # before the fine-tune pass reads every matrix
    check_output_room(out, b.nbytes, "--out", "the graft")
    # the fine-tune guard (numpy on the checkpoint as stored: an eighth of every matrix, and all of it when
    # that is not clearly a fine-tune) runs in a thread beside the export, which copies in the kernel: a
    # refusal stops the export at the next tensor, or at the latest before graftkit.json, and the output
    # folder, written atomically, never appears
    judged = shared_vocab(stored, b, tax) if cfg.shared_vocab else stored  # the stored values, over shared rows
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="graftkit-fine-tune") as pool:
        judging = pool.submit(lambda: check_fine_tune(guard_pair_distance(b, judged)[0], b, judged,
                                                      force=cfg.force_pair))

        def tick(s) -> None:
            if judging.done() and judging.exception() is not None:
                raise judging.exception()
            on_progress("graft", s.out.nbytes, b.nbytes, "bytes")

        written = export_graft(
            b, r, plan, out, force=cfg.force, max_shard_size=cfg.max_shard_size,
            command={"unknown": cfg.unknown, "max_shard_size": cfg.max_shard_size, "cast": cfg.cast,
                     "force_pair": cfg.force_pair},
            on_tensor=tick, notes=lambda: judging.result(),
        )
    forced = judging.result()
    return {**summary, "notes": summary["notes"] + list(forced), "out": str(written),
            "seconds": time.perf_counter() - t0}


def _cast_pair(cfg: GraftConfig, base, rl, tax):
    """``rl`` checked against ``base`` and read in base's dtypes: differing dtypes are refused unless
    ``--cast``, and then cast on reading (:func:`graftkit.weights.cast_like`, stated in its notes)."""
    from ..weights import cast_like, check_pair, shared_vocab

    rl = shared_vocab(rl, base, tax) if cfg.shared_vocab else rl
    check_pair(base, rl, tax, dtypes="cast" if cfg.cast else "same", dtype_flag="--cast")
    return cast_like(rl, base)


# ------------------------------------------------------------------------------------- experiments


@dataclass(frozen=True)
class GraftExperiments:
    """What ``graft --eval`` / ``--sweep`` wrote: the sweep of each RL run (A; B with ``--vs``; with
    ``--all-checkpoints`` each checkpoint, keyed by its label, in step order), read through its view, and with
    ``--vs`` the double dissociation."""

    base: Path
    rl: dict[str, Path]
    labels: dict[str, str]
    sweeps: dict[str, X.SweepResult]
    dissociation: X.DissociationResult | None
    files: dict[str, str]
    resumed: dict[str, list[str]]
    seconds: float
    notes: tuple[str, ...] = ()  # how single-file checkpoints were read
    steps: dict[str, int] = field(default_factory=dict)
    """With --all-checkpoints: each run key's step (the N of checkpoint-N), in step order; else empty."""
    trainer_run: Path | None = None
    """With --all-checkpoints: the trainer's output_dir."""

    def as_json(self) -> dict:
        a = next(iter(self.sweeps.values())).attrs
        runs = {k: sweep_json(v, self.rl[k]) for k, v in self.sweeps.items()}
        return {"sweep": a["sweep"], "metric": a.get("metric", "success"), "base": str(self.base), "runs": runs,
                "dissociation": None if self.dissociation is None else dissociation_json(self.dissociation),
                "files": self.files, "resumed": self.resumed, "tasks": a["tasks"], "seeds": len(a["seeds"]),
                "episodes": a["episodes"], "decode": a["decode"], "seconds": self.seconds,
                "notes": list(self.notes),
                **({"trajectory": trajectory_json(a["sweep"], runs, self.steps, self.files, self.trainer_run)}
                   if self.steps else {})}


def sweep_json(v: X.SweepResult, rl_path) -> dict:
    """One run's sweep as JSON: every configuration's success and comparisons, the attribution per group; with
    KL (``--metric kl`` or ``both``) each configuration's ``kl`` and the KL attribution per side (whose rollouts)."""
    groups_, layers, alpha = v.strings("config_groups"), v.strings("config_layers"), v.array("config_alpha")
    frac, erank = v.array("config_top_frac"), v.array("config_delta_erank")
    configs = [{"config": c, "groups": groups_[i], "layers": layers[i], "alpha": float(alpha[i]),
                **({"top_frac": float(frac[i])} if frac is not None else {}),
                **({"delta_erank": float(erank[i]) if math.isfinite(erank[i]) else None}
                   if erank is not None else {})}
               for i, c in enumerate(v.configs)]
    for c in configs if v.has_success else ():
        label = c["config"]
        c.update({"success": v.success(label), "parsed": v.parsed(label), "diff_vs_base": v.diff(label).tolist(),
                  "verdict_vs_base": v.verdict(label), "diff_vs_rl": v.diff(label, "rl").tolist(),
                  "verdict_vs_rl": v.verdict(label, "rl")})
    for c in configs if v.has_kl else ():
        c["kl"] = {s: {"kl_per_token": v.kl_per_token(c["config"], s),
                       "reproduced": v.reproduced(c["config"], s).tolist()} for s in v.sides}
    groups, share = v.groups, v.movement_share
    stored = {name: v.array(name) for name in v.ATTRIBUTION if v.array(name) is not None}
    attribution = {g: {**{name: a[j].tolist() for name, a in stored.items()},
                       **({} if share is None else {"movement_share": share[g]})} for j, g in enumerate(groups)}
    payload = {"rl": str(rl_path), "metric": v.metric, "configs": configs, "attribution": attribution,
               "group_effect": v.effect_kind, "prompt_formats": dict(v.attrs.get("prompt_formats") or {}),
               "coverage": file_coverage(v)}
    inter = v.array("interaction")
    if inter is not None:
        payload["interactions"] = [{"groups": [groups[a], groups[c]], "interaction": inter[a, c].tolist()}
                                   for a in range(len(groups)) for c in range(a + 1, len(groups))]
    if v.has_kl:
        payload["kl"] = kl_json(v)
    return payload


#: What share of RL's squared movement outside the swept groups still counts as movement (1 − Σ of the swept
#: groups' shares is a difference of floats, ~1e-16 when they hold it all).
UNSWEPT_MOVEMENT = 1e-9


def shapley_total_of(v: X.SweepResult) -> dict:
    """What a sweep's Shapley total v(N) − v(∅) is of: N, the swept groups (at the sweep's layers), and whether
    graft(N) is the RL model, i.e. the total RL's whole change: only when the sweep covers every layer and the
    groups it left out hold none of RL's squared weight movement (``unswept_movement_share``, from the
    movement shares the sweep stored; None when it stored none, and then ``whole_change`` is None too)."""
    groups, layers, share = list(v.groups), str(v.attrs.get("layers", "all")), v.movement_share
    unswept = None if share is None else max(0.0, 1.0 - sum(share.values()))
    whole = None if unswept is None else (layers == "all" and unswept <= UNSWEPT_MOVEMENT)
    name = f"v(all swept groups: {', '.join(groups)}{'' if layers == 'all' else f'; layers {layers}'}) − v(∅)"
    return {"groups": groups, "layers": layers, "unswept_movement_share": unswept, "whole_change": whole,
            "what": name}


def shapley_total_caveat(of: dict) -> str | None:
    """Why a Shapley total is not the RL model's whole change, one clause (None when it is)."""
    if of["whole_change"]:
        return None
    if of["whole_change"] is None:
        return "whether the swept groups hold all of RL's movement was not recorded"
    unswept, layers = of["unswept_movement_share"], of["layers"]
    parts = ([f"the groups not swept hold {100 * unswept:.3g}% of RL's squared weight movement"]
             if unswept > UNSWEPT_MOVEMENT else [])
    parts += [f"only layers {layers} were grafted"] if layers != "all" else []
    return "not the RL model's whole change: " + " and ".join(parts)


def file_coverage(v: X.SweepResult) -> list[str]:
    """How the sweep's episodes covered each user's file it played on every item: one line each. The items are
    those :func:`graftkit.verifiable.user.file_seed` gives the recorded seeds and episodes (a sweep keeps no item
    ids beside its success outcomes)."""
    from ..verifiable.user import coverage, coverage_note, file_seed

    seeds, episodes = [int(s) for s in v.attrs.get("seeds", ())], int(v.attrs.get("episodes", 0))
    sizes = {str(t): int(n) for t, n in (v.attrs.get("file_items") or {}).items()}
    return [coverage_note(t, coverage([file_seed(s, e, episodes) % sizes[t] for s in seeds for e in range(episodes)],
                                      sizes[t]), len(seeds), episodes)
            for t in v.attrs.get("whole", ()) if t in sizes]


def unparsed_lines(run: dict) -> list[str]:
    """One line when most outputs of some configurations did not parse (:data:`MOSTLY_UNPARSED`): which, and the
    flags that read another answer format (verifiable tasks) — a sweep of zeros is otherwise silent about it."""
    bad = [c for c in run["configs"] if c.get("parsed", 1.0) < 1.0 - MOSTLY_UNPARSED]
    if not bad:
        return []
    worst = min(bad, key=lambda c: c["parsed"])
    fix = FORMAT_FIX if run.get("prompt_formats") else "the policy does not write the action format"
    return [f"warning: most outputs did not parse in {len(bad)} of {len(run['configs'])} configurations "
            f"({worst['config']}: {100 * worst['parsed']:.0f}% parsed); {fix}"]


def kl_json(v: X.SweepResult) -> dict:
    """The KL attribution of a sweep as JSON: per side (whose rollouts) and group each stored KL attribution
    array, the factorial's interactions and Shapley total (``shapley_total_of``: which groups, and whether it is
    RL's whole change, :func:`shapley_total_of`), and the definitions of the fractions."""
    from .kl import ENDPOINTS, REPRODUCED

    groups, out = v.groups, {"reproduced": REPRODUCED, "endpoints": ENDPOINTS, "sides": {},
                             "parsed": {s: v.kl_parsed(s) for s in v.sides}}
    kind = v.var_attrs("kl_group_effect").get("kind")
    for s in v.sides:
        stored = {name.removeprefix("kl_"): v.kl_attribution(name, s) for name in v.KL_ATTRIBUTION}
        side = {"attribution": {g: {name: a[j].tolist() for name, a in stored.items() if a is not None}
                                for j, g in enumerate(groups)}, "group_effect": kind}
        inter = v.kl_attribution("kl_interaction", s)
        if inter is not None:
            side["interactions"] = [{"groups": [groups[a], groups[c]], "interaction": inter[a, c].tolist()}
                                    for a in range(len(groups)) for c in range(a + 1, len(groups))]
        total = v.kl_total(s)
        if total is not None:
            side["shapley_total"] = total.tolist()
            out["shapley_total_of"] = shapley_total_of(v)
        out["sides"][s] = side
    return out


def sweep_tables(run: dict, label: str, n_seeds: int, episodes: int) -> list:
    """What ``graftkit graft --eval/--sweep`` prints for one run's sweep, from its JSON (:func:`sweep_json`):
    :class:`~graftkit.core.tables.Table` s and lines. With success: the configurations (success, paired differences
    from base and RL and their verdicts), the attribution beside weight movement, the interactions. With KL: the
    configurations' KL per token and reproduced fractions, their definition, and the KL attribution per side."""
    from ..core.tables import Table, percent, points

    out: list = []
    if run["configs"] and "success" in run["configs"][0]:
        out.append(Table(
            f"{label}: grafts evaluated on identical episodes ({n_seeds} seeds × {episodes} episodes per task)",
            {"config": lambda c: c["config"], "success": lambda c: f"{100 * c['success']:.1f}%",
             "vs base [95%]": lambda c: points(c["diff_vs_base"]), "verdict vs base": lambda c: c["verdict_vs_base"],
             "vs RL [95%]": lambda c: points(c["diff_vs_rl"]), "verdict vs RL": lambda c: c["verdict_vs_rl"],
             "parsed": lambda c: percent(c.get("parsed", float("nan"))),
             **({"erank(Δ)": lambda c: "—" if c["delta_erank"] is None else f"{c['delta_erank']:.4g}"}
                if "delta_erank" in run["configs"][0] else {})},
            run["configs"], left=("config", "verdict vs base", "verdict vs RL")))
        out += unparsed_lines(run) + [f"note: {line}" for line in run.get("coverage", [])]
    attribution = run["attribution"]
    if any(attribution.values()):
        cols = [c for c in ("group_effect", "main_effect", "shapley") if any(c in r for r in attribution.values())]

        def share(g: str) -> str:
            s = attribution[g].get("movement_share")
            return "—" if s is None else f"{100 * s:.1f}%"

        out.append(Table(
            f"attribution of the success change to groups ({run['group_effect']} effect) beside weight movement"
            if run["group_effect"] else "weight movement of the grafted groups",
            {"group": lambda g: g, "movement share": share,
             **{c.replace("_", " "): (lambda g, c=c: points(attribution[g].get(c))) for c in cols}},
            attribution, left=("group",)))
    out += [f"interaction {'×'.join(row['groups'])}: {points(row['interaction'])}"
            for row in run.get("interactions", [])]
    return out + (kl_tables(run, label, n_seeds, episodes) if "kl" in run else [])


def kl_tables(run: dict, label: str, n_seeds: int, episodes: int) -> list:
    """The KL part of :func:`sweep_tables`: each configuration's KL per token and the fraction of the behavioural
    change it reproduces on each side's rollouts, the definition, and per group the KL attribution of each side
    (in points of the fraction), its interactions and the Shapley total."""
    from ..core.tables import Table, bounds_text, percent, points

    kl, names = run["kl"], {"rl": ("RL", "π_RL"), "sft": ("SFT", "π_SFT")}
    columns = {"config": lambda c: c["config"]}
    for s, (who, _) in names.items():
        columns |= {f"KL({who}‖C)/token": lambda c, s=s: f"{c['kl'][s]['kl_per_token']:.4g}",
                    f"reproduced {who} [95%]": lambda c, s=s: bounds_text(c["kl"][s]["reproduced"], scale=100.0,
                                                                          spec=".1f", unit="%")}
    out: list = [Table(f"{label}: fraction of RL's behavioural change each graft reproduces, by KL on fixed rollouts "
                       f"of RL and SFT ({n_seeds} seeds × {episodes} episodes per task, T=1)", columns, run["configs"],
                       left=("config",)),
                 f"reproduced: {kl['reproduced']['rl']}; {kl['reproduced']['sft']} — {kl['endpoints']}",
                 "outputs that parsed in the KL rollouts: " + ", ".join(
                     f"{names[s][0]} {percent(p)}" for s, p in kl.get("parsed", {}).items())]
    bad = [names[s][0] for s, p in kl.get("parsed", {}).items() if p < 1.0 - MOSTLY_UNPARSED]
    if bad:
        out.append(f"warning: most of {' and '.join(bad)}'s rollout outputs did not parse; "
                   + (FORMAT_FIX if run.get("prompt_formats") else "the policy does not write the action format"))
    sides = kl["sides"]
    stored = [n for n in ("group_effect", "main_effect", "shapley")
              if any(n in a for side in sides.values() for a in side["attribution"].values())]
    if stored:
        attribution = {s: side["attribution"] for s, side in sides.items()}
        kind = next(iter(sides.values()))["group_effect"]
        out.append(Table(
            "attribution of the behavioural change to groups (fraction reproduced, in points: RL on RL's rollouts, "
            f"SFT on SFT's{f'; {kind} effect' if kind else ''})",
            {"group": lambda g: g, **{f"{names[s][0]} {n.replace('_', ' ')}": (lambda g, s=s, n=n: points(
                attribution[s][g].get(n))) for s in sides for n in stored}},
            list(run["attribution"]), left=("group",)))
    for s, side in sides.items():
        out += [f"KL interaction {names[s][0]} {'×'.join(r['groups'])}: {points(r['interaction'])}"
                for r in side.get("interactions", [])]
        if "shapley_total" in side:
            of = kl["shapley_total_of"]
            caveat = shapley_total_caveat(of)
            out.append(f"KL Shapley total {names[s][0]} ({of['what']}) = {points(side['shapley_total'])}"
                       + (f" — {caveat}" if caveat else " — all of RL's change"))
    return out


def dissociation_json(d: X.DissociationResult) -> dict:
    effect, diff, verdicts = d.effect, d.difference, d.verdicts
    return {"effect": d.effect_kind, "double_dissociation": d.double_dissociation, "rule": attr.DISSOCIATION_RULE,
            "groups": {g: {"A": effect[0, i].tolist(), "B": effect[1, i].tolist(), "difference": diff[i].tolist(),
                           "verdict": verdicts[i]} for i, g in enumerate(d.groups)}}


def trajectory_json(sweep: str, runs: dict[str, dict], steps: dict[str, int], files: dict[str, str],
                    trainer_run) -> dict:
    """The sweeps of a trainer run's checkpoints (``--all-checkpoints``) as one row per step, from each run's JSON
    (:func:`sweep_json`): the RL checkpoint's success change from base with its interval and, with KL, its
    KL(π_RL‖π_SFT) per token on its own rollouts (when behaviour moved); then per column its ``success`` effect
    (points, with interval) and, with KL, ``reproduced_rl``, the fraction of the behavioural change it reproduces on
    RL's rollouts (which group moved it). Columns are the swept groups, with the sweep's group effect (single:
    v({g}) − v(∅), loo: v(N) − v(N∖g), factorial: Shapley), for a sweep that has one; else the grafted
    configurations, each against base."""
    by_group = sweep in X.GROUP_EFFECT
    rows, columns = [], []
    for key, run in runs.items():
        configs = {c["config"]: c for c in run["configs"]}
        rl = configs[X.RL_LABEL]
        row = {"step": steps[key], "checkpoint": key, "file": files[key]}
        if "success" in rl:
            row |= {"rl_success": rl["success"], "base_success": configs[X.BASE_LABEL]["success"],
                    "rl_vs_base": rl["diff_vs_base"], "verdict": rl["verdict_vs_base"]}
        if "kl" in rl:  # KL(π_RL‖π_∅) on RL's rollouts: how far the checkpoint's behaviour moved from SFT's
            row["kl_rl_sft_per_token"] = configs[X.BASE_LABEL]["kl"]["rl"]["kl_per_token"]
        effects = {}
        if by_group:
            kl_side = run["kl"]["sides"]["rl"]["attribution"] if "kl" in run else {}
            for g, a in run["attribution"].items():
                effects[g] = {**({"success": a.get("group_effect")} if "success" in rl else {}),
                              **({"reproduced_rl": kl_side.get(g, {}).get("group_effect")} if "kl" in rl else {})}
        else:
            for label, c in configs.items():
                if label not in (X.BASE_LABEL, X.RL_LABEL):
                    effects[label] = {**({"success": c["diff_vs_base"]} if "success" in c else {}),
                                      **({"reproduced_rl": c["kl"]["rl"]["reproduced"]} if "kl" in c else {})}
        row["effects"] = effects
        columns += [c for c in effects if c not in columns]
        rows.append(row)
    effect = X.GROUP_EFFECT.get(sweep)
    return {"trainer_run": str(trainer_run), "columns": "group" if by_group else "config", "effect": effect,
            "formula": attr.EFFECTS[effect] if effect else "success(C) − success(base); reproduced_RL(C)",
            "names": columns, "rows": rows}


def trajectory_tables(j: dict) -> list:
    """What ``graftkit graft --sweep … --all-checkpoints`` prints, from its JSON (:func:`trajectory_json` under
    ``trajectory``): one row per step — the checkpoint's success change from base and, with KL, its KL from SFT
    per token; a column per swept group (or configuration) with its effect on success in points and, with KL, the
    fraction of RL's behavioural change it reproduces on RL's rollouts — and what the columns mean."""
    from ..core.tables import Table, bounds_text, points

    t = j["trajectory"]
    rows = t["rows"]
    success, kl = j["metric"] != "kl", j["metric"] != "success"
    columns = {"step": lambda r: str(r["step"]), "checkpoint": lambda r: r["checkpoint"]}
    if success:
        columns |= {"RL success": lambda r: f"{100 * r['rl_success']:.1f}%",
                    "RL − base [95%]": lambda r: points(r["rl_vs_base"]), "verdict": lambda r: r["verdict"]}
    if kl:
        columns["KL(RL‖SFT)/token"] = lambda r: f"{r['kl_rl_sft_per_token']:.4g}"

    def effect(r: dict, c: str, what: str):
        return r["effects"].get(c, {}).get(what)

    for c in t["names"]:
        if success:
            columns[f"{c}: success [95%]"] = lambda r, c=c: points(effect(r, c, "success"))
        if kl:
            columns[f"{c}: reproduced RL [95%]"] = lambda r, c=c: bounds_text(
                effect(r, c, "reproduced_rl"), scale=100.0, spec=".1f", unit="%")
    what = {"group": f"each swept group's {t['effect']} effect", "config": "each graft"}[t["columns"]]
    measures = " and ".join((["on success (points)"] if success else [])
                            + (["on the fraction of RL's behavioural change it reproduces on RL's rollouts"] if kl
                               else []))
    out: list = [Table(f"{t['trainer_run']}: the {j['sweep']} sweep at every checkpoint ({len(rows)} steps; "
                       f"{j['seeds']} seeds × {j['episodes']} episodes per task): {what} {measures}",
                       columns, rows, left=("checkpoint", "verdict"))]
    out.append(f"{t['columns']} effect: {t['formula']}")
    if success:
        out.append(f"base success {100 * rows[0]['base_success']:.1f}% (its episodes played once for every step)")
    if kl:
        from .kl import REPRODUCED

        out.append(f"reproduced: {REPRODUCED['rl']}; KL(RL‖SFT)/token: KL(π_RL‖π_SFT) per action token on the "
                   "checkpoint's own rollouts (T=1)")
    for key, run in j["runs"].items():
        out += [f"{key}: {line}" for line in unparsed_lines(run)]
    return out


def _experiments(cfg: GraftConfig, tax) -> tuple[list[X.GraftExperiment], tuple[str, ...]]:
    """The configurations to evaluate and the groups they vary."""
    present = X.present_groups(tax)
    if cfg.kind == "eval":
        spec = cfg.spec()
        chosen = tuple(g for g in spec.groups if g in present) if set(spec.groups) != set(X.GROUPS) else present
        return X.one_experiment(spec, present), chosen
    default = X.layered_groups(tax) if cfg.kind == "layers" else present
    chosen = default if cfg.groups in (None, "all") else GraftSpec.parse(cfg.groups).groups
    layers = cfg.layers if cfg.kind != "layers" else "all"
    return X.expand_sweep(cfg.kind, chosen, present, layers=layers, alphas=cfg.alpha_values(),
                          fracs=cfg.frac_values(), scope=cfg.top_scope), chosen


def _sweep_dest(cfg: GraftConfig, key: str, label: str) -> Path:
    if cfg.save and key == "A":
        return cfg.save
    if cfg.save and key == "B":
        return with_tag(cfg.save, "vs")
    results = cfg.results or run_layout(cfg.run).results
    return (sweep_kl_path if cfg.metric == "kl" else sweep_path)(results, cfg.kind, label)


def _open_sweep(cfg: GraftConfig, base_path: Path, device: str, paths: dict[str, Path] | None = None
                ) -> X.SweepWorker:
    """The state each worker of a sweep's executor builds once, in its own process (this one for the serial
    executor, never this one under Ray): the pair opened and every RL run read in base's dtypes
    (:func:`_cast_pair`), by key (``paths``, default :attr:`GraftConfig.rl_paths`; with --all-checkpoints every
    checkpoint); the base policy loaded on ``device`` when first needed, once for every run."""
    from ..agent import load_policy, resolve_tasks
    from ..weights import open_pair

    paths = paths or cfg.rl_paths
    b, stored = open_pair(base_path, list(paths.values()), no_pickle=cfg.no_pickle, unknown=cfg.unknown,
                          config=cfg.config)
    tax = b.taxonomy(cfg.unknown)
    rls = {key: _cast_pair(cfg, b, r, tax) for key, r in zip(paths, stored)}

    def load():
        resolve_tasks(cfg.tasks, cfg.prompt_format)  # a user's tasks are registered in the worker's process too
        # a single-file base is built over the config (and tokenizer) its names were matched with
        return load_policy(Path(base_path), no_pickle=cfg.no_pickle, obs="text",
                           config=cfg.config or b.config_from, device=device, dtype=cfg.dtype, engine=cfg.engine)

    return X.SweepWorker(b, rls, load, unknown=cfg.unknown, tax=tax)


def _plan(worker: X.SweepWorker, cfg: GraftConfig) -> tuple[list[X.GraftExperiment], tuple[str, ...], list[str]]:
    """On a worker: the configurations, the groups they vary (each spec checked to select something) and how
    the checkpoints were read. Reads no tensor values."""
    from ..weights import notes

    exps, chosen = _experiments(cfg, worker.tax)
    X.plan_sweep(worker.tax, exps)
    return exps, chosen, notes(worker.base, *worker.rls.values())


@dataclass(frozen=True)
class _Survey:
    """What a sweep's first worker measures of the pair before any configuration plays."""

    movement: dict[str, dict[str, float]]
    """Run key → group → share of the run's squared weight movement."""
    forced: tuple[str, ...]
    """The notes of the pair's delta pass: one graded no fine-tune but analysed (its graftkit.json records this
    base, or --force-pair), or one in which nothing moved."""
    base: dict
    rls: dict[str, dict]
    """The checkpoints' descriptions (path, fingerprint), the RL runs' by key."""
    placement: dict
    """Where and in what precision the base policy runs."""
    delta_erank: dict[str, dict[str, float]] = field(default_factory=dict)
    """A sparsity sweep's: run key → configuration → the effective rank of the delta it grafts
    (:func:`graftkit.graft.experiments.grafted_delta_erank`)."""


def _survey(worker: X.SweepWorker, cfg: GraftConfig, labels: dict[str, str],
            exps: tuple[X.GraftExperiment, ...] = ()) -> _Survey:
    """On a worker: the movement shares' delta pass, before the policy loads (it also refuses a pair that is no
    fine-tune), the checkpoints' fingerprints, the loaded policy's placement, and for a sparsity sweep the rank of
    the delta each configuration grafts."""
    from ..weights import describe
    from .anatomy import DeltaResult, delta_anatomy

    movement, forced, eranks = {}, [], {}
    for key, r in worker.rls.items():
        d = DeltaResult(delta_anatomy(worker.base, [r], [labels[key]], worker.tax, force_pair=cfg.force_pair))
        movement[key] = d.group_shares(0)
        forced += [f"{labels[key]}: {x}" if len(worker.rls) > 1 else x for x in d.result.attrs["pair_notes"]]
        if cfg.kind == "sparsity":
            eranks[key] = {e.label: X.grafted_delta_erank(worker.base, r, worker._plan(key, e)) for e in exps}
    return _Survey(movement, tuple(forced), describe(worker.base),
                   {key: describe(r) for key, r in worker.rls.items()}, worker.placement, eranks)


def run_graft_experiments(cfg: GraftConfig, on_progress: OnProgress = no_progress):
    """Expand the configurations, graft each into the loaded base in place, evaluate, compare and attribute
    (one bar per configuration, in episodes); with ``--vs`` the same for the second run (sharing the base's
    outcomes) and the double-dissociation test; with ``--all-checkpoints`` the same for every checkpoint of the
    trainer run ``--from`` in step order (sharing the base's outcomes), keyed by their labels. Returns
    :class:`GraftExperiments` (the plan with --dry-run).

    The executor is picked once: its workers (this process, or Ray workers) each open the pair and load the
    base once (:func:`_open_sweep`); with Ray, this process opens no checkpoint. The first worker plans and
    surveys the pair; every configuration still to play then runs as units
    (:func:`graftkit.graft.experiments.execute_sweep`)."""
    from ..agent import Decode, resolve_tasks, seed_list
    from ..agent.tasks import prompt_formats, task_spec
    from ..core.executor import Executor

    t0 = time.perf_counter()
    steps: dict[str, int] = {}
    if cfg.all_checkpoints:  # every checkpoint of a trainer's output_dir, keyed by its label, in step order
        models = checkpoints_of(cfg.rl, all_checkpoints=True, flag="--from")
        base_path = base_of(models[-1], cfg.base)
        paths = dict(zip(result_labels(models), models))
        labels = {k: k for k in paths}
        steps = {k: recorded_step(p) for k, p in paths.items()}
    else:
        cfg = cfg.replace(rl=checkpoint_of(cfg.rl, "--from"),  # a trainer's output_dir: its last checkpoint
                          vs=checkpoint_of(cfg.vs, "--vs") if cfg.vs is not None else None)
        base_path = base_of(cfg.rl, cfg.base)
        paths = cfg.rl_paths
        labels = dict(zip(paths, result_labels(list(paths.values()))))
    first = next(iter(paths))
    executor = Executor() if cfg.dry_run else Executor.of(cfg)  # a plan reads no values: here, without Ray
    # one pool for every run: each worker opens the pair (every checkpoint) and loads the base policy once
    with executor.pool(functools.partial(_open_sweep, cfg, Path(base_path), executor.unit_device, paths)) as pool:
        exps, chosen, read_notes = pool.first(functools.partial(_plan, cfg=cfg))
        if cfg.dry_run:
            return {"sweep": cfg.kind, "base": str(base_path), "rl": {k: str(p) for k, p in paths.items()},
                    "groups": list(chosen), "count": len(exps), "experiments": [e.as_dict() for e in exps],
                    "dry_run": True, "notes": read_notes}
        survey = pool.first(functools.partial(_survey, cfg=cfg, labels=labels, exps=tuple(exps)))
        decode = Decode(greedy=not cfg.sample, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
        grid = X.EpisodeGrid(tuple(resolve_tasks(cfg.tasks, cfg.prompt_format)), tuple(seed_list(cfg.seeds)),
                             cfg.episodes, decode, cfg.batch_size, items=cfg.episode_items, whole=cfg.whole_tasks)
        setup = {"base": survey.base, "tasks": list(grid.tasks), "seeds": list(grid.seeds), "episodes": cfg.episodes,
                 "decode": asdict(decode), "unknown": cfg.unknown, "items": grid.items, "whole": list(grid.whole),
                 "prompt_formats": prompt_formats(grid.tasks),
                 **({"file_items": sizes} if (sizes := {t: n for t in grid.tasks
                                                        if (n := task_spec(t).items) is not None}) else {}),
                 # outcomes of one sweep come from one precision on one kind of device (a resume checks it)
                 "placement": {"device": survey.placement["device"].split(":")[0], "dtype": survey.placement["dtype"],
                               # sampled outcomes are the engine's own: a resume never mixes engines
                               **({"engine": "vllm"} if survey.placement.get("engine") == "vllm" else {})}}
        width = pool.size(len(exps) * len(paths))
        outcomes, sweeps, files, resumed = {}, {}, {}, {}
        for key in paths:
            config = cfg.replace(rl=paths[key]).as_dict() if steps else cfg.as_dict()
            trajectory = {"step": steps[key], "trainer_run": str(cfg.rl)} if steps else {}
            run = SweepRun(key, labels[key], _sweep_dest(cfg, key, labels[key]), cfg.kind, tuple(exps), chosen,
                           cfg.layers if cfg.kind not in ("layers", "eval") else "all", grid, survey.movement[key],
                           {**setup, "rl": survey.rls[key]}, config, cfg.metric, trajectory,
                           survey.delta_erank.get(key, {}))
            # success outcomes resume (KL is recomputed: forward passes only)
            done = X.resume_outcomes(run.dest, exps, run.setup) if cfg.metric != "kl" else {}
            resumed[key] = sorted(done)
            known = {}
            if key != first and X.BASE_LABEL in outcomes[first]:
                done.setdefault(X.BASE_LABEL, outcomes[first][X.BASE_LABEL])  # one base for every run
                known = X.stored_played(files[first], {X.BASE_LABEL})
            res = _sweep_one(pool, run, done, width, on_progress, executor.local, known)
            outcomes[key] = res.all_outcomes()
            files[key], sweeps[key] = str(res.path), res
    dis = None
    if cfg.vs is not None:
        layers = cfg.layers if cfg.kind not in ("layers", "eval") else "all"
        subsets = {k: X.subset_outcomes(exps, outcomes[k], layers) for k in outcomes}
        d = attr.dissociation(subsets["A"], subsets["B"], chosen, kind=X.GROUP_EFFECT[cfg.kind])
        res = X.dissociation_result(d, {k: {"path": str(p), "label": labels[k], "result": files[k]}
                                        for k, p in paths.items()},
                                    attrs={"base": setup["base"], "sweep": cfg.kind, "config": cfg.as_dict()})
        dest = dissociation_path_of(cfg.results or run_layout(cfg.run).results, paths["A"], paths["B"])
        files["dissociation"] = str(write_result(dest, res))
        dis = X.DissociationResult.from_result(res, dest)
    return GraftExperiments(Path(base_path), dict(paths), labels, sweeps, dis, files, resumed,
                            time.perf_counter() - t0, (*read_notes, *survey.forced), steps,
                            Path(cfg.rl) if steps else None)


def _labelled(on_progress: OnProgress, label: str) -> OnProgress:
    """``on_progress`` with each bar named after the run."""
    return lambda what, advance, total, unit: on_progress(f"{label}: {what}", advance, total, unit)


@dataclass(frozen=True)
class SweepRun:
    """One RL run's sweep as this process writes it: what it plays, where its result goes, what it records."""

    key: str
    """A (--from) or B (--vs)."""
    label: str
    """The run's name in progress lines and result names."""
    dest: Path
    """Its result file (the partial result beside it while it runs)."""
    kind: str
    """The sweep, or eval."""
    experiments: tuple[X.GraftExperiment, ...]
    groups: tuple[str, ...]
    """The groups the sweep varies: the attribution's group axis."""
    layers: str
    """The layer selection of the configurations that are plain subsets of groups (the attribution's)."""
    grid: X.EpisodeGrid
    movement: dict[str, float]
    """Group → share of the run's squared weight movement."""
    setup: dict
    """What a resume must find unchanged: base and RL descriptions, episodes, decoding, placement."""
    config: dict
    """The command's config, saved into the result."""
    metric: str = "success"
    """What scores each configuration: success, kl or both (:data:`graftkit.graft.experiments.METRICS`)."""
    trajectory: dict = field(default_factory=dict)
    """With --all-checkpoints: ``step`` (the N of checkpoint-N) and ``trainer_run`` (the output_dir), recorded in
    the result's attrs (not part of ``setup``: a single checkpoint's sweep of the same episodes resumes it)."""
    delta_erank: dict = field(default_factory=dict)
    """A sparsity sweep's: configuration → the effective rank of the delta it grafts."""

    def result(self, success: dict, *, complete: bool = True, kl=None, played: dict | None = None):
        """The ``graft-sweep`` result of the outcomes in so far (``complete=False``: no comparisons, for the
        partial result), with the KL scores ``kl`` (:class:`~graftkit.graft.kl.SweepKL`) once they are in, and what
        parsed of each configuration's outputs (``played``: :class:`~graftkit.graft.experiments.Played` by label)."""
        g = self.grid
        return X.sweep_result(self.kind, self.experiments, success, g.tasks, g.seeds, g.episodes, self.groups,
                              layers=self.layers, movement_share=self.movement, compare_configs=complete,
                              attrs={**self.setup, **self.trajectory, "rl_label": self.label, "config": self.config},
                              metric=self.metric, kl=kl, played=played, delta_erank=self.delta_erank)


def _sweep_one(pool, run: SweepRun, done: dict, width: int, on_progress: OnProgress, local: bool,
               known: dict | None = None) -> X.SweepResult:
    """One run's sweep on ``pool`` (planned for ``width`` workers): play what ``done`` lacks, write a partial
    result as each configuration completes (an interrupted sweep resumes from it), then the finished result
    at ``run.dest``. Progress is per episode where the units run in this process (``local``), else per
    configuration as it completes."""
    partial, per, current = dict(X.checked_done(done, run.grid.shape)), run.grid.count, {}
    # what the outputs of resumed configurations parsed, where stored (``known``: the base played for run A)
    played = {**X.stored_played(run.dest, partial), **(known or {})}

    def finished(e, p: X.Played) -> None:
        if not local:
            on_progress(f"{run.label}: {e.label}", per, per, "episodes")
        partial[e.label], played[e.label] = p.success, p
        write_result(partial_path(run.dest), run.result(partial, complete=False, played=played))

    if run.metric != "kl":
        units = X.plan_units(run.experiments, len(run.grid.seeds), width, run=run.key, done=partial)
        X.execute_sweep(pool, units, run.grid, workers=width,
                        on_start=lambda u: current.update(what=f"{run.label}: {u.experiment.label}"),
                        on_episode=(lambda ep: on_progress(current["what"], 1, per, "episodes")) if local else None,
                        on_result=finished)
    kl = None
    if run.metric != "success":  # one unit on the first worker: rollouts once, then forward passes per configuration
        kl = pool.first(functools.partial(X.kl_unit, run=run.key, experiments=run.experiments, grid=run.grid,
                                          on_progress=_labelled(on_progress, run.label) if local else None))
    res = run.result(partial, kl=kl, played=played)
    written = write_result(run.dest, res)
    partial_path(run.dest).unlink(missing_ok=True)
    return X.SweepResult.from_result(res, written)
