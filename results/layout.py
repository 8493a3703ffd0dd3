"""The layout of a run folder: where every policy, result file and page of a run goes, in one table.

Every command that writes into a run and every reader of one finds its path here, so a producer and its
readers cannot disagree about a name. A run folder (:class:`RunLayout`)::

    RUN/
      results/                     every result file of the run (``RESULTS``), named by ``NAMES``
      report.html                  ``graftkit report`` and the demo's last stage (``REPORT``)
      study.json                   the demo's StudyConfig (``STUDY``)
      base/ sft/ sft-adapter/ sft-b/   the study's imported model, SFT policy, its LoRA adapter, second init
      sft-stage1/ sft-control/     the first stage of a trained SFT policy; the positive control's biased SFT
      <rl run>/                    a GRPO run's policy; ``<rl run>.checkpoints/`` its resumable checkpoints
      grafts/<tag>/                ``graftkit graft`` exports (``GRAFTS``)
    runs/.current                  the run a command uses without ``--run`` (``CURRENT``; :func:`current_run`)

Result files. ``NAMES`` maps each kind of result name to its template; :func:`result_path` (and the
function per kind below it) fills a template, :func:`parse_result_name` reads a name back into the same
kind and fields, and :func:`find_results` lists a results folder's files of one kind. A field's value
matches ``FIELDS[field]`` (labels: any text; ``SPELLED`` fields are written as a fixed suffix). Where a
result about other checkpoints already holds a name, ``write_result`` writes beside it under
``<name>-<key>.h5`` (:func:`with_tag`, the first 8 hex digits of a digest of the checkpoints, or
``unkeyed``), which parses back with its ``key``. A result being written piece by piece sits at
``.partial-<name>`` (:func:`partial_path`); no hidden name is a result (:func:`result_files`).

Result kinds. Every result records its kind (``Result.kind``: ``eval``, ``graft-sweep``, ``train-grpo``...); the
constants below are the one spelling of each, which producers write and readers (the typed views' ``KINDS``, the
report's sections, the study's findings) match. A name of a kind of result file that holds one kind of result is
keyed in ``NAMES`` by that kind.

Labels (:func:`result_labels`): a checkpoint's folder or file name, prefixed by its parent's where the name
says nothing of the run (``grpo-lora-checkpoint-6``). A command that names its results by the checkpoints it was
given names them through the function here that takes those paths (:func:`training_path_of`,
:func:`sweep_path_of`, :func:`kl_path_of`, :func:`dissociation_path_of`), so the study finds each file by asking the
same function, never by labelling the checkpoints the way it expects the command to.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# ---------------------------------------------------------------------------------- the run's folders

#: Folder of every result file of a run.
RESULTS = "results"
#: The run's HTML report.
REPORT = "report.html"
#: The demo's configuration, as it ran.
STUDY = "study.json"
#: The study's policies: the imported pretrained model, the SFT policy, its LoRA adapter (merged into the
#: SFT policy), the second initialisation, the first stage of an SFT trained in stages, and the positive control's
#: SFT policy (a planted position bias).
BASE, SFT, SFT_ADAPTER, SFT_B = "base", "sft", "sft-adapter", "sft-b"
SFT_STAGE1, SFT_CONTROL = "sft-stage1", "sft-control"
#: Folder of ``graftkit graft`` exports.
GRAFTS = "grafts"
#: The file in the runs root naming the current run.
CURRENT = ".current"
#: The suffix of every result file.
SUFFIX = ".h5"
#: Prefix of a result being written piece by piece (hidden: never read as a result).
PARTIAL = ".partial-"


def runs_root() -> Path:
    """Where run folders live: ``$GRAFTKIT_RUNS``, else ``runs/`` of the current directory."""
    return Path(os.environ.get("GRAFTKIT_RUNS", "runs"))


def current_run(run: str | os.PathLike | None = None) -> Path:
    """The run folder a command writes to and reads from: ``run`` (its ``--run``) when given, else the run
    named in ``runs/.current`` (``graftkit demo`` writes it), else ``runs/`` itself."""
    if run is not None:
        return Path(run)
    marker = runs_root() / CURRENT
    if marker.is_file():
        return Path(marker.read_text().strip())
    return runs_root()


def mark_current_run(run: str | os.PathLike) -> None:
    """Name ``run`` in ``runs/.current``: the run of every later command without ``--run``."""
    runs_root().mkdir(parents=True, exist_ok=True)
    (runs_root() / CURRENT).write_text(str(Path(run).resolve()) + "\n")


@dataclass(frozen=True)
class RunLayout:
    """The folders and fixed files of the run folder ``root``."""

    root: Path

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def study(self) -> Path:
        return self.root / STUDY

    @property
    def base(self) -> Path:
        return self.root / BASE

    @property
    def sft(self) -> Path:
        return self.root / SFT

    @property
    def sft_adapter(self) -> Path:
        return self.root / SFT_ADAPTER

    @property
    def sft_b(self) -> Path:
        return self.root / SFT_B

    @property
    def sft_stage1(self) -> Path:
        return self.root / SFT_STAGE1

    @property
    def sft_control(self) -> Path:
        return self.root / SFT_CONTROL

    @property
    def grafts(self) -> Path:
        return self.root / GRAFTS

    def rl(self, name: str) -> Path:
        """The policy folder of the RL run ``name``."""
        return self.root / name


def run_layout(run: str | os.PathLike | None = None) -> RunLayout:
    """The layout of ``run`` (its ``--run``), else of the current run (:func:`current_run`)."""
    return RunLayout(current_run(run))


# ------------------------------------------------------------------------------------- result kinds

#: Each kind of result, as the result records it (``Result.kind``), with the command that writes it.
DELTA = "delta"                                             # graftkit delta (graft/anatomy.py DeltaResult)
EVAL, HEADROOM = "eval", "headroom"                         # graftkit eval, headroom (evaluation/commands.py)
KL = "kl"                                                   # graftkit kl (evaluation/kl.py KLResult)
GRAFT_SWEEP = "graft-sweep"                                 # graft --eval / --sweep (graft/experiments.py SweepResult)
GRAFT_DISSOCIATION = "graft-dissociation"                   # graft --vs (graft/experiments.py DissociationResult)
RANK_WEIGHTS = "rank-weights"                               # graftkit rank (rank/results.py RankResult)
RANK_DELTA = "rank-delta"                                   # rank --what delta
RANK_ACTIVATIONS = "rank-activations"                       # rank --what activations
COUPLING = "coupling"                                       # graftkit couple (rank/coupling.py CouplingResult)
BOTH_DIRECTIONS = "both-directions"                         # the both-directions test alone, before couple joins it
TRAIN_SFT, TRAIN_GRPO = "train-sft", "train-grpo"           # train sft, train grpo (train/commands.py TrainingCurves)
TRAIN_TRAINER = "train-trainer"                             # another trainer's trainer_state.json (delta of its run)
FINDINGS = "findings"                                       # graftkit demo (study/findings.py FindingsResult)
FORGETTING = "forgetting"                                   # graftkit forgetting (graft/forgetting.py ForgettingResult)

#: The rank results, by what was ranked (``rank --what``: weights, delta, activations).
RANK_KINDS: tuple[str, ...] = (RANK_WEIGHTS, RANK_DELTA, RANK_ACTIVATIONS)
#: Training curves by what trained the run (the ``kind`` field of their name, ``train-{kind}-{label}``) → their kind.
TRAINING: dict[str, str] = {"sft": TRAIN_SFT, "grpo": TRAIN_GRPO, "trainer": TRAIN_TRAINER}
TRAIN_KINDS: tuple[str, ...] = tuple(TRAINING.values())
#: Every kind of result.
KINDS: tuple[str, ...] = (DELTA, EVAL, HEADROOM, KL, GRAFT_SWEEP, GRAFT_DISSOCIATION, *RANK_KINDS, COUPLING,
                          BOTH_DIRECTIONS, *TRAIN_KINDS, FINDINGS, FORGETTING)

# ------------------------------------------------------------------------------------- result names

#: Each kind of result name → its template (without ``SUFFIX``); a name that holds one kind of result is keyed by
#: that kind. In parse order: a fixed name comes before a template that would also match it, a longer template
#: before a shorter one of the same prefix.
NAMES: dict[str, str] = {
    FINDINGS: "findings",                                   # the study's four findings
    FORGETTING: "forgetting",                               # does KL predict forgetting, across the run's RL runs
    "study-delta": "delta",                                 # the study's delta anatomy of every RL run
    "delta-trajectory": "delta-{label}-trajectory",         # delta --all-checkpoints of one trainer run
    DELTA: "delta-{labels}",                                # delta of RL runs, labels joined by "+"
    EVAL: "eval-{label}-{decoding}{obs}",
    HEADROOM: "headroom-{label}{obs}",
    GRAFT_DISSOCIATION: "graft-dissociation-{a}-vs-{b}",
    "graft-sweep-kl": "graft-{sweep}-{label}-kl",           # a sweep scored by KL alone (--metric kl)
    GRAFT_SWEEP: "graft-{sweep}-{label}",
    KL: "kl-{a}-vs-{b}",                                    # graftkit kl: policy a against its base b
    # the label carries the layer selection's tag (layer_tag), which a name cannot tell apart from it: readers
    # key rank results by the model they record
    "rank": "rank-{what}-{label}",
    COUPLING: "coupling-{what}-{metric}",
    "train": "train-{kind}-{label}",                        # training curves: kind sft, grpo or trainer (TRAINING)
}

#: The pattern of each field's value in a name.
FIELDS: dict[str, str] = {"label": ".+?", "labels": ".+?", "a": ".+?", "b": ".+?", "sweep": "[a-z]+",
                          "what": "[a-z]+", "metric": "[a-z0-9_]+", "kind": "[a-z]+",
                          "decoding": "greedy|sampled"}

#: Fields written as a fixed spelling of their value.
SPELLED: dict[str, dict[str, str]] = {"obs": {"text": "", "som": "-som"}}

#: The key ``write_result`` adds to a name held by a result about other checkpoints.
KEY = "[0-9a-f]{8}|unkeyed"

_FIELD = re.compile(r"\{(\w+)\}")


def _pattern(template: str) -> re.Pattern:
    """The regex that reads a name of ``template`` back: each field by its ``FIELDS`` pattern (its spellings for
    a ``SPELLED`` one), then an optional key and ``SUFFIX``."""
    parts, at = [], 0
    for m in _FIELD.finditer(template):
        name = m[1]
        value = ("|".join(re.escape(s) for s in SPELLED[name].values()) if name in SPELLED else FIELDS[name])
        parts += [re.escape(template[at:m.start()]), f"(?P<{name}>{value})"]
        at = m.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts) + f"(?:-(?P<key>{KEY}))?" + re.escape(SUFFIX))


_PATTERNS = {kind: _pattern(t) for kind, t in NAMES.items()}


@dataclass(frozen=True)
class ResultName:
    """A result file name taken apart: its kind of name (a key of ``NAMES``), the fields that fill its
    template, and the key ``write_result`` added (None where it added none)."""

    kind: str
    fields: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None

    @property
    def name(self) -> str:
        """The file name back (key included)."""
        path = result_path(Path(), self.kind, **self.fields)
        return (with_tag(path, self.key) if self.key else path).name


def result_path(results: str | os.PathLike, kind: str, /, **fields: str) -> Path:
    """The path of the result named by template ``NAMES[kind]`` filled with ``fields``, in ``results``."""
    values = {k: SPELLED[k][v] if k in SPELLED else str(v) for k, v in fields.items()}
    wanted = set(_FIELD.findall(NAMES[kind]))
    if set(values) != wanted:
        raise TypeError(f"result name {kind!r} takes fields {sorted(wanted)}, got {sorted(values)}")
    return Path(results) / (NAMES[kind].format(**values) + SUFFIX)


def parse_result_name(name: str) -> ResultName | None:
    """The kind and fields of the result file ``name`` (a file name, no folder); None for a name no
    template makes (a user's ``--save`` file, a hidden partial result)."""
    for kind, pattern in _PATTERNS.items():
        m = pattern.fullmatch(name)
        if m:
            fields = {k: v for k, v in m.groupdict().items() if k != "key"}
            for k, spelling in SPELLED.items():
                if k in fields:
                    fields[k] = {s: v for v, s in spelling.items()}[fields[k]]
            return ResultName(kind, fields, m["key"])
    return None


def glob_pattern(kind: str, /, **fields: str) -> str:
    """The shell pattern of the result names of ``kind`` with ``fields`` (the others any), as the errors
    that name missing results show it: ``glob_pattern("rank", what="weights")`` = ``rank-weights-*.h5``."""
    values = {k: SPELLED[k][v] if k in SPELLED else str(v) for k, v in fields.items()}
    return re.sub(r"\*+", "*", _FIELD.sub(lambda m: values.get(m[1], "*"), NAMES[kind])) + SUFFIX


def find_results(results: str | os.PathLike, kind: str, /, **fields: str) -> list[tuple[ResultName, Path]]:
    """Every result file directly in the folder ``results`` whose name is of ``kind`` with these ``fields``
    (the others any, keyed names included), by path."""
    folder = Path(results)
    if not folder.is_dir():
        return []
    found = []
    for p in sorted(folder.iterdir()):
        parsed = parse_result_name(p.name) if p.is_file() else None
        if parsed and parsed.kind == kind and all(parsed.fields.get(k) == str(v) for k, v in fields.items()):
            found.append((parsed, p))
    return found


def result_files(run_dir: str | os.PathLike) -> list[Path]:
    """Every result file under ``run_dir`` (any depth), by path; none below a hidden name (temporaries and
    partial results)."""
    run_dir = Path(run_dir)
    return [p for p in sorted(run_dir.rglob("*" + SUFFIX))
            if not any(part.startswith(".") for part in p.relative_to(run_dir).parts)]


def with_tag(path: str | os.PathLike, tag: str) -> Path:
    """``path`` with ``-<tag>`` before its suffix: another model's result beside the one at ``path``
    (``eval-checkpoint-6-greedy-1a2b3c4d.h5``), the second run's sweep beside a ``--save`` file."""
    path = Path(path)
    return path.with_name(f"{path.stem}-{tag}{path.suffix}")


def partial_path(dest: str | os.PathLike) -> Path:
    """Where a sweep writes its partial result while it runs: ``.partial-<name>`` beside ``dest`` (the result
    itself is written once, complete, so a finished result is never mistaken for a partial one)."""
    dest = Path(dest)
    return dest.with_name(PARTIAL + dest.name)


# ------------------------------------------------------------------------------ one function per kind


def eval_path(results: str | os.PathLike, label: str, decoding: str = "greedy", obs: str = "text") -> Path:
    """``graftkit eval`` of the checkpoint ``label``: ``decoding`` greedy or sampled, ``obs`` text or som."""
    return result_path(results, EVAL, label=label, decoding=decoding, obs=obs)


def headroom_path(results: str | os.PathLike, label: str, obs: str = "text") -> Path:
    """``graftkit headroom`` of the checkpoint ``label``."""
    return result_path(results, HEADROOM, label=label, obs=obs)


def sweep_path(results: str | os.PathLike, sweep: str, label: str) -> Path:
    """``graftkit graft --sweep SWEEP`` (or ``--eval``: sweep ``eval``) of the RL checkpoint ``label``."""
    return result_path(results, GRAFT_SWEEP, sweep=sweep, label=label)


def sweep_kl_path(results: str | os.PathLike, sweep: str, label: str) -> Path:
    """``graftkit graft --sweep SWEEP --metric kl`` of the RL checkpoint ``label`` (``--metric both`` writes
    :func:`sweep_path`, beside the success arrays)."""
    return result_path(results, "graft-sweep-kl", sweep=sweep, label=label)


def kl_path(results: str | os.PathLike, a: str, b: str) -> Path:
    """``graftkit kl`` of the policy ``a`` against the policy ``b`` (its base)."""
    return result_path(results, KL, a=a, b=b)


def dissociation_path(results: str | os.PathLike, a: str, b: str) -> Path:
    """The double dissociation of RL runs ``a`` and ``b`` (``graftkit graft --vs``)."""
    return result_path(results, GRAFT_DISSOCIATION, a=a, b=b)


def layer_tag(layers: str) -> str:
    """The name suffix of a layer selection: '' for all layers, else ``-<spec>`` with commas as ``+``."""
    spec = layers.strip().lower()
    return "" if spec in ("", "all") else "-" + spec.replace(",", "+")


def rank_path(results: str | os.PathLike, what: str, label: str, layers: str = "all") -> Path:
    """``graftkit rank --what WHAT`` (weights, delta, activations) of the checkpoint ``label`` over ``layers``."""
    return result_path(results, "rank", what=what, label=label + layer_tag(layers))


def delta_path(results: str | os.PathLike, labels: Sequence[str]) -> Path:
    """``graftkit delta`` of the RL checkpoints ``labels`` against their base."""
    return result_path(results, DELTA, labels="+".join(labels))


def trajectory_path(results: str | os.PathLike, label: str) -> Path:
    """``graftkit delta --all-checkpoints`` of the trainer run ``label``."""
    return result_path(results, "delta-trajectory", label=label)


def forgetting_path(results: str | os.PathLike) -> Path:
    """``graftkit forgetting`` of the run."""
    return result_path(results, FORGETTING)


def coupling_path(results: str | os.PathLike, what: str, metric: str) -> Path:
    """``graftkit couple --what WHAT --metric METRIC`` of the run."""
    return result_path(results, COUPLING, what=what, metric=metric)


def training_path(results: str | os.PathLike, kind: str, label: str) -> Path:
    """The training curves of the run ``label``: ``kind`` sft or grpo (its ``train_log.jsonl``), or trainer
    (a Trainer's ``trainer_state.json``)."""
    return result_path(results, "train", kind=kind, label=label)


def findings_path(results: str | os.PathLike) -> Path:
    """The study's four findings."""
    return result_path(results, FINDINGS)


def study_delta_path(results: str | os.PathLike) -> Path:
    """The study's delta anatomy of every RL run against its SFT policy."""
    return result_path(results, "study-delta")


# ----------------------------------------------------------------------------------------- labels


#: Folder names that say nothing about which run they belong to: a trainer's step folders
#: (``checkpoint-500``, TRL and transformers' Trainer; ``global_step500``, DeepSpeed) and final ones.
_GENERIC_NAME = re.compile(r"(checkpoint|ckpt|step|global_step|epoch)[-_]?\d+|final|last|best|model|merged|"
                           r"adapter|output|outputs|hf|huggingface|actor", re.IGNORECASE)


def result_labels(paths: Iterable[str | os.PathLike]) -> list[str]:
    """One distinct label per checkpoint path, used to name its results and to label it in tables and
    figures: its folder or file name, prefixed by its parent's where the name says nothing of the run
    (``grpo-lora-checkpoint-6``, not ``checkpoint-6``; see ``_GENERIC_NAME``) or two paths share it."""
    labels: list[str] = []
    for p in paths:
        p = Path(p)
        lab = p.name.removesuffix(".safetensors") or str(p)
        if _GENERIC_NAME.fullmatch(lab) and p.resolve().parent.name:
            lab = f"{p.resolve().parent.name}-{lab}"
        if lab in labels:
            lab = f"{Path(p).parent.name}-{lab}"
        while lab in labels:
            lab += "'"
        labels.append(lab)
    return labels


# ------------------------------------------------------------- the names commands give their checkpoints' results


def training_path_of(results: str | os.PathLike, kind: str, folder: str | os.PathLike) -> Path:
    """The training curves of the run in ``folder`` (``kind`` sft, grpo or trainer: :data:`TRAINING`), as ``train
    sft``, ``train grpo`` and ``delta`` of a trainer's run name them: by the folder's label."""
    return training_path(results, kind, result_labels([folder])[0])


def sweep_path_of(results: str | os.PathLike, sweep: str, rl: str | os.PathLike) -> Path:
    """``graftkit graft --sweep SWEEP --from RL`` of the one RL checkpoint ``rl``: named by its label."""
    return sweep_path(results, sweep, result_labels([rl])[0])


def kl_path_of(results: str | os.PathLike, rl: str | os.PathLike, base: str | os.PathLike) -> Path:
    """``graftkit kl --model RL --base BASE``: named by the two checkpoints' labels, taken together."""
    return kl_path(results, *result_labels([rl, base]))


def dissociation_path_of(results: str | os.PathLike, rl: str | os.PathLike, vs: str | os.PathLike) -> Path:
    """``graftkit graft --from RL --vs VS``: named by the two RL checkpoints' labels, taken together."""
    return dissociation_path(results, *result_labels([rl, vs]))
