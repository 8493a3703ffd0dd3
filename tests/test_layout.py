"""The run's layout (:mod:`graftkit.results.layout`): every result name parses back to what made it, the commands
write exactly the paths the layout gives, the readers find what the producers wrote, and no module but the
layout builds a result file name."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from graftkit.results import layout as L  # noqa: E402
from graftkit.weights.runs import CHECKPOINTS, rl_checkpoints  # noqa: E402
from graftkit.results.layout import (  # noqa: E402
    NAMES,
    RunLayout,
    coupling_path,
    delta_path,
    dissociation_path,
    eval_path,
    find_results,
    findings_path,
    glob_pattern,
    headroom_path,
    kl_path,
    parse_result_name,
    rank_path,
    result_files,
    result_path,
    study_delta_path,
    sweep_kl_path,
    sweep_path,
    training_path,
    trajectory_path,
    with_tag,
)
from graftkit.results.store import Result, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------- the table

#: Labels as result_labels makes them: plain, with hyphens and digits, a trainer's step folder, a primed one.
LABELS = ("sft", "degrade-s0", "grpo-lora-checkpoint-6", "init-b-degrade", "kl0.04", "a'", "x-greedy")

#: Fields of every kind of name, one example each (over LABELS where a field is a label).
EXAMPLES = {
    "findings": [{}],
    "forgetting": [{}],
    "study-delta": [{}],
    "delta-trajectory": [{"label": lab} for lab in LABELS],
    "delta": [{"labels": "+".join(LABELS[:k])} for k in (1, 2, 3)],
    "eval": [{"label": lab, "decoding": d, "obs": o} for lab in LABELS for d in ("greedy", "sampled")
             for o in ("text", "som")],
    "headroom": [{"label": lab, "obs": o} for lab in LABELS for o in ("text", "som")],
    "graft-dissociation": [{"a": a, "b": b} for a in LABELS[:3] for b in LABELS[1:4]],
    "graft-sweep": [{"sweep": s, "label": lab} for s in ("single", "loo", "factorial", "layers", "alpha", "eval")
                    for lab in LABELS],
    "graft-sweep-kl": [{"sweep": s, "label": lab} for s in ("single", "factorial", "eval") for lab in LABELS],
    "kl": [{"a": a, "b": b} for a in LABELS[:3] for b in LABELS[1:4]],
    "rank": [{"what": w, "label": lab} for w in ("weights", "delta", "activations") for lab in LABELS],
    "coupling": [{"what": w, "metric": m} for w in ("weights", "activations") for m in ("erank", "stable_rank")],
    "train": [{"kind": k, "label": lab} for k in ("sft", "grpo", "trainer") for lab in LABELS],
}


def test_every_kind_of_name_has_examples():
    assert set(EXAMPLES) == set(NAMES)


@pytest.mark.parametrize("kind", list(NAMES))
def test_a_name_parses_back_to_its_kind_and_fields(kind, tmp_path):
    for fields in EXAMPLES[kind]:
        path = result_path(tmp_path, kind, **fields)
        assert path.parent == tmp_path and path.suffix == ".h5"
        parsed = parse_result_name(path.name)
        assert parsed is not None and (parsed.kind, dict(parsed.fields), parsed.key) == (kind, fields, None), path.name
        assert parsed.name == path.name
        # beside another model's result: the same kind and fields, and the key
        for key in ("1a2b3c4d", "unkeyed"):
            keyed = parse_result_name(with_tag(path, key).name)
            assert (keyed.kind, dict(keyed.fields), keyed.key) == (kind, fields, key)
            assert keyed.name == with_tag(path, key).name


def test_the_names_are_the_ones_runs_hold(tmp_path):
    """The names every earlier run wrote (a renamed result would make the study redo a finished stage)."""
    r = tmp_path
    assert eval_path(r, "sft") == r / "eval-sft-greedy.h5"
    assert eval_path(r, "rl", "sampled", "som") == r / "eval-rl-sampled-som.h5"
    assert headroom_path(r, "sft") == r / "headroom-sft.h5" and headroom_path(r, "x", "som") == r / "headroom-x-som.h5"
    assert sweep_path(r, "factorial", "degrade-s0") == r / "graft-factorial-degrade-s0.h5"
    assert dissociation_path(r, "degrade-s0", "collapse-s0") == r / "graft-dissociation-degrade-s0-vs-collapse-s0.h5"
    assert sweep_kl_path(r, "factorial", "degrade-s0") == r / "graft-factorial-degrade-s0-kl.h5"
    assert kl_path(r, "degrade-s0", "sft") == r / "kl-degrade-s0-vs-sft.h5"
    assert rank_path(r, "weights", "sft") == r / "rank-weights-sft.h5"
    assert rank_path(r, "activations", "sft", "late") == r / "rank-activations-sft-late.h5"
    assert rank_path(r, "delta", "rl", "0,2") == r / "rank-delta-rl-0+2.h5"
    assert delta_path(r, ["a", "b"]) == r / "delta-a+b.h5" and trajectory_path(r, "out") == r / "delta-out-trajectory.h5"
    assert coupling_path(r, "activations", "erank") == r / "coupling-activations-erank.h5"
    assert training_path(r, "grpo", "null-s0") == r / "train-grpo-null-s0.h5"
    assert findings_path(r) == r / "findings.h5" and study_delta_path(r) == r / "delta.h5"
    run = RunLayout(tmp_path)
    assert (run.results, run.report, run.study) == (r / "results", r / "report.html", r / "study.json")
    assert (run.base, run.sft, run.sft_adapter, run.sft_b, run.grafts, run.rl("kl0.04")) == \
        (r / "base", r / "sft", r / "sft-adapter", r / "sft-b", r / "grafts", r / "kl0.04")
    assert rl_checkpoints(r / "null-s0") == r / "null-s0.checkpoints"
    assert rl_checkpoints(f"{r}/null-s0/") == r / "null-s0.checkpoints"


def test_a_rank_name_carries_its_layer_tag_in_the_label():
    parsed = parse_result_name(rank_path(Path(), "weights", "sft", "late").name)
    assert (parsed.kind, parsed.fields["what"], parsed.fields["label"]) == ("rank", "weights", "sft-late")


def test_names_no_template_makes_are_not_results():
    for name in ("same.h5", ".partial-graft-single-rl.h5", "eval-sft-greedy.json", "eval-sft.h5", "rank-sft.h5",
                 "coupling-weights.h5", "notes.txt"):
        assert parse_result_name(name) is None, name


def test_glob_patterns_name_what_the_readers_look_for():
    assert glob_pattern("rank", what="weights") == "rank-weights-*.h5"
    assert glob_pattern("eval", decoding="greedy", obs="text") == "eval-*-greedy.h5"
    assert glob_pattern("eval", label="NAME") == "eval-NAME-*.h5"


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"")


def test_find_results_and_result_files(tmp_path):
    results = tmp_path / "results"
    _touch(results, "eval-a-greedy.h5", "eval-a-sampled.h5", "eval-b-greedy-som.h5", "eval-c-greedy-1a2b3c4d.h5",
           "rank-weights-a.h5", "rank-weights-a-late.h5", "rank-delta-a.h5", ".partial-eval-x-greedy.h5", "x.txt")
    _touch(results / ".tmp", "eval-d-greedy.h5")
    _touch(tmp_path / "elsewhere", "mine.h5")
    greedy = find_results(results, "eval", decoding="greedy", obs="text")
    assert [(n.fields["label"], n.key, p.name) for n, p in greedy] == \
        [("a", None, "eval-a-greedy.h5"), ("c", "1a2b3c4d", "eval-c-greedy-1a2b3c4d.h5")]
    assert [p.name for _, p in find_results(results, "rank", what="weights")] == \
        ["rank-weights-a-late.h5", "rank-weights-a.h5"]
    assert find_results(tmp_path / "missing", "eval") == []
    assert [p.relative_to(tmp_path).as_posix() for p in result_files(tmp_path)] == [
        "elsewhere/mine.h5", "results/eval-a-greedy.h5", "results/eval-a-sampled.h5", "results/eval-b-greedy-som.h5",
        "results/eval-c-greedy-1a2b3c4d.h5", "results/rank-delta-a.h5", "results/rank-weights-a-late.h5",
        "results/rank-weights-a.h5"]


def test_the_current_run(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAFTKIT_RUNS", str(tmp_path / "runs"))
    assert L.current_run() == tmp_path / "runs" and L.run_layout().results == tmp_path / "runs" / "results"
    L.mark_current_run(tmp_path / "study")
    assert L.current_run() == (tmp_path / "study").resolve()
    assert L.run_layout(tmp_path / "mine").report == tmp_path / "mine" / "report.html"


# ------------------------------------------------------------------------------ producers and readers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SFT model and two RL children of it (planted deltas: one in attention and MLP, one in attention)."""
    import torch
    from planted import planted_pair, tiny_model, tiny_tokenizer

    from graftkit.weights import describe, open_checkpoint, save_model

    root = tmp_path_factory.mktemp("layout-models")
    sft, rl = planted_pair(root)
    model, d = tiny_model(0), describe(open_checkpoint(sft))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".self_attn." in n and p.dim() == 2:
                p.add_(0.002 * torch.randn(p.shape, generator=g))
    rl2 = save_model(root / "rl2", model, tiny_tokenizer(), inputs=[sft], provenance={
        "producer": "test (planted)", "base_model": {"path": d["path"], "fingerprint": d["fingerprint"]}})
    return {"sft": sft, "rl": rl, "rl2": rl2}


EPISODES = dict(tasks="click-button", seeds=1, episodes=1, max_new_tokens=4)


def test_the_commands_write_exactly_the_paths_the_layout_gives(models, tmp_path):
    from graftkit.evaluation.commands import EvalConfig, HeadroomConfig, run_eval, run_headroom
    from graftkit.graft.anatomy import DeltaConfig, run_delta
    from graftkit.graft.commands import GraftConfig, run_graft_experiments
    from graftkit.rank.commands import RankConfig, run_rank
    from graftkit.train.commands import write_curves

    run = tmp_path / "run"
    results = RunLayout(run).results
    sft, rl, rl2 = models["sft"], models["rl"], models["rl2"]
    written = {}
    ev = run_eval(EvalConfig(model=(rl, rl2), run=run, **EPISODES))
    written |= {"eval-rl": ev.files["model"], "eval-rl2": ev.files["model-2"]}
    written["eval-rl-sampled"] = run_eval(EvalConfig(model=(rl,), sample=True, run=run, **EPISODES)).files["model"]
    written["headroom"] = run_headroom(HeadroomConfig(model=sft, k=2, run=run, **EPISODES)).file
    for what, layers in (("weights", "all"), ("weights", "late"), ("delta", "all")):
        out = run_rank(RankConfig(model=(rl,), what=what, layers=layers, run=run))
        written[f"rank-{what}-{layers}"] = out["models"]["rl"]["result_file"]
    out = run_rank(RankConfig(model=(sft,), what="activations", probes=2, tasks="click-button", run=run))
    written["rank-activations"] = out["models"]["sft"]["result_file"]
    written["delta"] = run_delta(DeltaConfig(rl=(rl, rl2), base=sft, run=run)).path
    g = run_graft_experiments(GraftConfig(rl=rl, vs=rl2, base=sft, sweep="single", groups="attn", run=run, **EPISODES))
    written |= {f"graft-{k}": v for k, v in g.files.items()}
    trained = tmp_path / "grpo-x"
    trained.mkdir()
    (trained / "train_log.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (trained / "graftkit.json").write_text("{}")
    written["train"] = write_curves(trained, "grpo", results).path

    want = {"eval-rl": eval_path(results, "rl"), "eval-rl2": eval_path(results, "rl2"),
            "eval-rl-sampled": eval_path(results, "rl", "sampled"), "headroom": headroom_path(results, "sft"),
            "rank-weights-all": rank_path(results, "weights", "rl"),
            "rank-weights-late": rank_path(results, "weights", "rl", "late"),
            "rank-delta-all": rank_path(results, "delta", "rl"),
            "rank-activations": rank_path(results, "activations", "sft"), "delta": delta_path(results, ["rl", "rl2"]),
            "graft-A": sweep_path(results, "single", "rl"), "graft-B": sweep_path(results, "single", "rl2"),
            "graft-dissociation": dissociation_path(results, "rl", "rl2"),
            "train": training_path(results, "grpo", "grpo-x")}
    assert {k: Path(v) for k, v in written.items()} == want
    assert sorted(result_files(run)) == sorted(want.values())  # nothing else, no partial result left


def test_a_trainer_run_writes_its_trajectory_and_curves_where_the_layout_says(models, tmp_path):
    from trl_shapes import trl_run

    from graftkit.graft.anatomy import DeltaConfig, run_delta

    out = trl_run(tmp_path / "grpo-out", models["sft"], steps=(2, 4))
    run = tmp_path / "run"
    d = run_delta(DeltaConfig(rl=(out,), base=models["sft"], all_checkpoints=True, run=run))
    results = RunLayout(run).results
    assert d.path == trajectory_path(results, "grpo-out")
    assert sorted(result_files(run)) == sorted([d.path, training_path(results, "trainer", "grpo-out")])


def _checkpoint(folder: Path, base: Path | None = None) -> dict:
    folder.mkdir(parents=True)
    prov = {"producer": "test"} | ({"base_model": {"path": str(base.resolve())}} if base else {})
    (folder / "graftkit.json").write_text(json.dumps(prov))
    return {"path": str(folder.resolve()), "kind": "hf-folder", "sha256": folder.name.encode().hex().ljust(64, "0")}


def test_couple_reads_what_eval_and_rank_wrote_and_writes_where_the_layout_says(tmp_path):
    """Four checkpoints' eval and rank results at their layout paths, one of them keyed (another model's
    result held its name): couple finds all four by the models they record."""
    from graftkit.rank.commands import CoupleConfig, run_couple
    from graftkit.weights import band_rule

    run = tmp_path / "run"
    results = RunLayout(run).results
    rng = np.random.default_rng(3)
    n_layers, rates = 6, {"sft": 0.5, "lr0": 0.9, "lr1": 0.2, "other": 0.7}
    coords = {"task": np.array(["click-button"], dtype=object), "seed": np.arange(20), "episode": np.arange(5),
              "sample": np.arange(1)}
    for name, rate in rates.items():
        # "other" is another model whose folder is also named lr1: its results go beside lr1's, keyed
        label = "lr1" if name == "other" else name
        desc = _checkpoint(run / "ckpts" / name, None if name == "sft" else run / "ckpts" / "sft")
        success = (rng.random((1, 20, 5, 1)) < rate).astype(np.int8)
        write_result(eval_path(results, label), Result("eval", coords, {
            "success": (("task", "seed", "episode", "sample"), success)}, {"model": desc, "decode": {"greedy": True}}))
        v = np.zeros((n_layers, 1, 1))
        v[:, 0, 0] = 10 + 10 * success.mean() + rng.normal(0, 0.1, n_layers)
        write_result(rank_path(results, "weights", label), Result("rank-weights", {
            "layer": np.arange(n_layers), "group": np.array(["all"], dtype=object),
            "metric": np.array(["erank"], dtype=object)}, {"value_layer": (("layer", "group", "metric"), v)},
            {"model": desc, "band_rule": band_rule(n_layers), "layers": "all"}))
    assert len(find_results(results, "eval", decoding="greedy", obs="text")) == 4  # one of them keyed
    p = run_couple(CoupleConfig(run=run, what="weights", n_boot=200))
    assert Path(p["result_file"]) == coupling_path(results, "weights", "erank")
    assert len(p["checkpoints"]) == 4
    assert {Path(c["eval_file"]).name for c in p["checkpoints"]} == \
        {"eval-sft-greedy.h5", "eval-lr0-greedy.h5", "eval-lr1-greedy.h5"} | {
            with_tag(eval_path(results, "lr1"), n.key).name for n, _ in find_results(results, "eval") if n.key}


def test_the_study_reads_and_skips_by_the_layout(tmp_path):
    from graftkit.study.findings import RLRun
    from graftkit.study.pipeline import Study, StudyConfig

    st = Study(StudyConfig(out=str(tmp_path)))
    run = RLRun("degrade-s0", "mastered", "degrade", 2e-3, 0)
    layout = RunLayout(tmp_path.resolve())
    assert (st.results, st.sft, st.sft_b, st.rl(run)) == (layout.results, layout.sft, layout.sft_b, layout.rl(run.name))
    assert st.sweep(run) == sweep_path(layout.results, "factorial", "degrade-s0")
    assert st.coupling == coupling_path(layout.results, "activations", "erank")


# --------------------------------------------------------------------- no result name built elsewhere

#: The text of a result name before its first field (``eval-``), and a partial result's prefix.
HEADS = {t.split("{")[0] for t in NAMES.values() if "{" in t} | {L.PARTIAL}
#: A string that is a whole result file name or a pattern of them.
RESULT_FILE = re.compile(r"[\w*+.'-]+\.h5")
#: Names of the run folder that only the layout spells (and the suffix of an RL run's checkpoint folder, which
#: weights/runs.py spells: the readers of training runs find a graftkit run's steps by it).
FOLDER_NAMES = {L.RESULTS, L.REPORT, L.STUDY, CHECKPOINTS, L.CURRENT, L.SFT_ADAPTER, L.GRAFTS}
#: Strings that look like result names and are none, each with why.
ALLOWED = {
    ("results/store.py", 'f"graftkit-result-{os.getpid()}-{id(result)}.h5"'): "an in-memory HDF5 image's name",
}


def _package_modules() -> list[Path]:
    skip = {"tests", "benchmarks", "build", "runs", "assets"}
    out = []
    for top in ROOT.iterdir():
        if top.name in skip or top.name.startswith("."):
            continue
        out += list(top.rglob("*.py")) if top.is_dir() else [top] if top.suffix == ".py" else []
    return [p for p in out if p != ROOT / "results" / "layout.py"]


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}


def _result_names(path: Path) -> list[str]:
    """Every f-string, string or path step in ``path`` that builds a result file name or a run folder's, in
    source order: an f-string with ``.h5`` in its text or that starts as a result name does (``eval-{...``); a string that is a whole result
    file name or a pattern of them; a run folder's name joined onto a path (``/``) or a string (``+``)."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    docs, found = _docstrings(tree), []
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    joined = {id(n.right) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.Add))}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            literal = [v.value for v in node.values if isinstance(v, ast.Constant)]
            first = node.values[0] if node.values else None
            head = first.value if isinstance(first, ast.Constant) and len(node.values) > 1 else None
            if ".h5" in "".join(literal) or head in HEADS:
                found.append(node)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and id(node) not in in_fstring):
            if RESULT_FILE.fullmatch(node.value) or (node.value in FOLDER_NAMES and id(node) in joined):
                found.append(node)
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return [ast.get_source_segment(text, n) for n in found]


def _only_allowed(found: list, allowed, name: str, fix: str, key=lambda f: f) -> None:
    """Every place a scan found is allowed (else ``fix``), and every allowance still matches a place (else it is
    stale: remove it from ``name``)."""
    assert [f for f in found if key(f) not in allowed] == [], fix
    assert set(allowed) <= {key(f) for f in found}, f"an allowance no longer needed: remove it from {name}"


def test_no_module_but_the_layout_builds_a_result_name():
    rel = lambda p: p.relative_to(ROOT).as_posix()  # noqa: E731
    found = [(rel(p), s) for p in _package_modules() for s in _result_names(p)]
    _only_allowed(found, ALLOWED, "ALLOWED", "build these names with graftkit.results.layout")


def test_the_scan_sees_names_built_elsewhere(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""docstring: RUN/results/eval-*.h5"""\n'
                     'a = run / "results" / f"eval-{label}-greedy.h5"\n'
                     'b = sorted(results.glob("rank-*.h5"))\n'
                     'c = f"graft-{kind}-{label}" + ".h5"\n'
                     'd = root / "report.html"\n'
                     'e = f"{results}/x.h5"\n'
                     'f = "a sentence that names no file (.h5)"\n'
                     'g = f"headroom-s{seed}"  # a run, not a result\n'
                     'h = f"rank-{what}-" + label\n')
    assert _result_names(probe) == ['"results"', 'f"eval-{label}-greedy.h5"', '"rank-*.h5"', 'f"graft-{kind}-{label}"',
                                    '"report.html"', 'f"{results}/x.h5"', 'f"rank-{what}-"']


# ------------------------------------------------------------- no result kind, no study folder, spelled elsewhere

#: A kind with a hyphen (``graft-sweep``, ``train-grpo``) and its family's prefix (``train-``) mean nothing but a kind:
#: any such string outside the layout spells one.
UNIQUE = {k for k in L.KINDS if "-" in k} | {k.split("-")[0] + "-" for k in L.KINDS if "-" in k}
#: Names a kind is held in: a variable, attribute or parameter named so holds a kind (``kind``, ``KINDS``,
#: ``TRAIN_KINDS``, ``kinds``).
KIND_NAME = re.compile(r"kinds?|[A-Z_]*KINDS")
#: Strings in a kind's place that are no result kind, each with why (by file and the expression they sit in).
KIND_ALLOWED = {
    ("graft/commands.py", 'cfg.kind == "eval"'): "graft --eval is a sweep of one configuration (GraftConfig.kind)",
    ("graft/commands.py", 'cfg.kind not in ("layers", "eval")'): "the sweep kinds that play every layer",
}
#: The study's policy folders (``<run>/sft``...), which only the layout spells.
FOLDERS = {L.BASE, L.SFT, L.SFT_ADAPTER, L.SFT_B, L.SFT_STAGE1, L.SFT_CONTROL}
#: Strings in study/ that read as a folder's name and are none, each with why.
FOLDER_ALLOWED = {
    ("study/pipeline.py", 'overrides.get("sft")'): "the preset's --sft (StudyConfig.sft), a path the user gives",
    ("study/pipeline.py", '("out", "sft")'): "StudyConfig fields that hold paths",
    ("study/pipeline.py", 'write_curves(st.sft, "sft", st.results)'): "what trained the curves (layout TRAINING)",
    ("study/findings.py", 'role in ("base", "rl")'): "a graft configuration's role (graft/experiments.py ROLES)",
    ("study/findings.py", 'sweep.reproduced(label, "sft")'): "a side of a sweep's KL (graft/kl.py SIDES)",
    ("study/findings.py", '"sft" in sweep.sides'): "a side of a sweep's KL (graft/kl.py SIDES)",
}


def _name(node: ast.AST) -> str | None:
    """The name a call, an assignment target or a comparison operand goes by: ``f`` of ``f`` and ``x.f``."""
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _strings(node: ast.AST) -> list[ast.Constant]:
    """``node`` if it is a string, else the strings of a tuple, list or set it displays."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _kind_parameters(paths: list[Path]) -> dict[str, set[int | str]]:
    """Every graftkit function and dataclass by name → where its calls take a kind: the positions of its parameters
    (a method's after ``self``) or fields named ``kind``/``kinds``, ``"*"`` from a ``*kinds`` on."""
    out: dict[str, set[int | str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                found = {i for i, n in enumerate(names) if KIND_NAME.fullmatch(n)}
                if node.args.vararg and KIND_NAME.fullmatch(node.args.vararg.arg):
                    found |= {len(names), "*"}
            elif isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
                fields = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                          and "ClassVar" not in ast.unparse(n.annotation)]
                found = {i for i, n in enumerate(fields) if KIND_NAME.fullmatch(n)}
            else:
                continue
            if found:
                out.setdefault(node.name, set()).update(found)
    return out


def _kind_places(tree: ast.AST, params: dict[str, set[int | str]]) -> list[tuple[ast.AST, ast.Constant]]:
    """(the expression, a string in it) wherever a string stands for a result kind: the first argument of
    ``Result(...)``; a value given to a name, attribute, parameter or field that holds a kind (``KIND_NAME``:
    ``KINDS = (...)``, ``kind: ClassVar[str] = ...``, ``_of(loaded, ...)``, ``glob_pattern(...)``); a side of a
    comparison with one (``x.kind == ...``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            where = params.get(name, set()) | ({0} if name == "Result" else set())
            for i, arg in enumerate(node.args):
                if i in where or ("*" in where and i >= min(w for w in where if w != "*")):
                    found += [(node, s) for s in _strings(arg)]
            found += [(node, s) for k in node.keywords if k.arg and KIND_NAME.fullmatch(k.arg) for s in _strings(k.value)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(KIND_NAME.fullmatch(_name(t) or "") for t in targets):
                found += [(node, s) for s in _strings(node.value)]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(KIND_NAME.fullmatch(_name(x) or "") for x in sides):
                found += [(node, s) for x in sides for s in _strings(x)]
    return found


def _spelled_kinds(path: Path, params: dict[str, set[int | str]]) -> list[tuple[str, str]]:
    """(the expression, the kind) for every result kind ``path`` spells: a string that is a hyphenated kind or a
    family's prefix anywhere but a docstring (in an f-string too), and any kind in a kind's place."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in UNIQUE and id(node) not in docs:
            found.append((node, node))
    found += [(ctx, s) for ctx, s in _kind_places(tree, params) if s.value in L.KINDS and s.value not in UNIQUE]
    found.sort(key=lambda f: (f[1].lineno, f[1].col_offset))
    return [(ast.get_source_segment(text, ctx), s.value) for ctx, s in found]


def _all_modules() -> list[Path]:
    return _package_modules() + [ROOT / "results" / "layout.py"]


def test_no_module_but_the_layout_spells_a_result_kind():
    rel = lambda p: p.relative_to(ROOT).as_posix()  # noqa: E731
    params = _kind_parameters(_all_modules())
    found = [(rel(p), ctx, kind) for p in _package_modules() for ctx, kind in _spelled_kinds(p, params)]
    _only_allowed(found, KIND_ALLOWED, "KIND_ALLOWED", "write these kinds from graftkit.results.layout",
                  key=lambda f: f[:2])


def test_the_kinds_are_the_views_and_the_names():
    """Every kind is some typed view's (read back by it), and each result file name keyed by a kind holds that kind."""
    from graftkit.evaluation.commands import EvalResult, HeadroomResult
    from graftkit.evaluation.kl import KLResult
    from graftkit.graft.anatomy import DeltaResult
    from graftkit.graft.experiments import DissociationResult, SweepResult
    from graftkit.graft.forgetting import ForgettingResult
    from graftkit.rank.coupling import CouplingResult
    from graftkit.rank.results import RankResult
    from graftkit.study.findings import FindingsResult
    from graftkit.train.commands import TrainingCurves

    viewed = {k for v in (DeltaResult, KLResult, SweepResult, DissociationResult, CouplingResult, RankResult,
                          FindingsResult, TrainingCurves, ForgettingResult) for k in v.KINDS} | {EvalResult.kind,
                                                                                              HeadroomResult.kind}
    assert viewed == set(L.KINDS) - {L.BOTH_DIRECTIONS}  # joined into a coupling result before it is written
    assert len(set(L.KINDS)) == len(L.KINDS) and set(L.TRAINING.values()) == set(L.TRAIN_KINDS)
    assert {k for k in NAMES if k in L.KINDS} == {L.FINDINGS, L.DELTA, L.EVAL, L.HEADROOM, L.GRAFT_DISSOCIATION,
                                                   L.GRAFT_SWEEP, L.KL, L.COUPLING, L.FORGETTING}


def test_the_kind_scan_sees_kinds_spelled_elsewhere(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""docstring: a graft-sweep result, kind "eval"."""\n'
                     'r = Result("eval", coords, data)\n'
                     'class V(View):\n    KINDS = ("kl", "train-sft")\n    kind: ClassVar[str] = "headroom"\n'
                     'a = _of(loaded, "delta", "coupling")\n'
                     'b = _items(results, ("findings",), labels)\n'
                     'c = x.kind == "kl" or kind in ("eval", "weights")\n'
                     'd = f"train-{kind}"\n'
                     'e = {"metric": "kl", "command": "eval", "suite": "headroom"}  # no kind\n'
                     'f = write_curves(folder, "sft")  # a training kind, not a result kind\n'
                     'g = Checkpoint(path, kind="pickle")\n')
    params = {"_of": {"*", 1}, "_items": {1}, "write_curves": {1}}
    assert _spelled_kinds(probe, params) == [
        ('Result("eval", coords, data)', "eval"), ('KINDS = ("kl", "train-sft")', "kl"), ('"train-sft"', "train-sft"),
        ('kind: ClassVar[str] = "headroom"', "headroom"), ('_of(loaded, "delta", "coupling")', "delta"),
        ('_of(loaded, "delta", "coupling")', "coupling"), ('_items(results, ("findings",), labels)', "findings"),
        ('x.kind == "kl"', "kl"), ('kind in ("eval", "weights")', "eval"), ('f"train-{kind}"', "train-")]
    defs = tmp_path / "defs.py"
    defs.write_text("def _of(loaded, *kinds): ...\ndef one(x, kind, y): ...\nclass C:\n    def m(self, a, kinds): ...\n"
                    "@dataclass\nclass S:\n    key: str\n    kinds: tuple\n    K: ClassVar[str] = 'x'\n")
    assert _kind_parameters([defs]) == {"_of": {1, "*"}, "one": {1}, "m": {1}, "S": {1}}


def _spelled_folders(path: Path) -> list[str]:
    """The expression around every string of ``path`` that is one of the study's folder names (docstrings aside): a
    call, comparison or subscript it sits in, else the string itself."""
    text = path.read_text()
    tree = ast.parse(text, str(path))
    docs = _docstrings(tree)
    parent = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in FOLDERS and id(node) not in docs:
            ctx = node
            while isinstance(parent.get(id(ctx)), (ast.Tuple, ast.List, ast.Set)):
                ctx = parent[id(ctx)]
            up = parent.get(id(ctx))
            found.append((node.lineno, node.col_offset, up if isinstance(up, (ast.Call, ast.Compare)) else ctx))
    return [ast.get_source_segment(text, ctx) for *_, ctx in sorted(found, key=lambda f: f[:2])]


def test_the_study_spells_no_folder_name():
    """The pipeline, its design and its findings name the study's policies (``sft``, ``sft-b``, ``sft-control``...)
    through the layout, which the stages, the labels of their results and the findings' ``evals[SFT]`` share."""
    found = [(p.relative_to(ROOT).as_posix(), s) for p in sorted((ROOT / "study").glob("*.py"))
             for s in _spelled_folders(p)]
    _only_allowed(found, FOLDER_ALLOWED, "FOLDER_ALLOWED", "spell these folders from graftkit.results.layout")


def test_the_folder_scan_sees_folder_names(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""the sft folder: "sft"."""\n'
                     'a = evals["sft"]\nb = g.init == "sft-b"\nc = {"sft-control": p}\nd = st.stage("sft", [x], go)\n'
                     'e = ("base", "rl")\nf = "sft-policy"\n')
    assert _spelled_folders(probe) == ['"sft"', 'g.init == "sft-b"', '"sft-control"', 'st.stage("sft", [x], go)',
                                       '("base", "rl")']
