"""Commands as configs: every command's options are generated from its config's fields, and configs are
frozen and validated on creation."""

import dataclasses
from dataclasses import fields
from pathlib import Path

import pytest
import typer.main

from graftkit.cli import app
from graftkit.core.config import CommandConfig, field_docs
from graftkit.core.errors import GraftkitError

#: Options that are no config field: how to render or where to write, never what to compute.
EXTRAS = {"help", "as_json", "force", "resume", "open_it", "top", "vs"}  # vs: rank refuses it, naming --base
#: Commands without a config.
PLAIN = {"version"}


def _commands(group, prefix: str = ""):
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            yield from _commands(cmd, path + " ")
        else:
            yield path, cmd


def _configs() -> dict[str, type]:
    found, todo = {}, [CommandConfig]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.command:
            found[cls.command] = cls
    return found


COMMANDS = dict(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - PLAIN))
def test_options_are_generated_from_the_config_fields(name):
    configs = _configs()
    assert name in configs, f"`graftkit {name}` has no CommandConfig whose command is {name!r}"
    cls, cmd = configs[name], COMMANDS[name]
    docs, own = field_docs(cls), {f.name: f for f in fields(cls)}
    params = {p.name: p for p in cmd.params}
    for pname, p in params.items():
        if pname in EXTRAS:
            continue
        assert pname in own, f"`graftkit {name}`: option {pname} is no field of {cls.__name__}"
        help_ = getattr(p, "help", None)
        if help_ is not None:  # typer keeps an argument's help outside click
            assert help_ == docs[pname], f"`graftkit {name}` {pname}: help differs from the field docstring"
    for f in own.values():
        if f.metadata.get("cli", True):
            assert f.name in params, f"`graftkit {name}`: field {f.name} has no option"
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"


@pytest.mark.parametrize("cls", sorted(_configs().values(), key=lambda c: c.command), ids=lambda c: c.command)
def test_configs_are_frozen_and_record_their_command(cls):
    assert cls.__dataclass_params__.frozen
    assert all(field_docs(cls).get(f.name) for f in fields(cls)), f"{cls.__name__}: a field without a docstring"
    required = {f.name: "x" for f in fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    try:
        cfg = cls(**required)
    except GraftkitError:
        return  # "x" is no valid value for a required field: validated, which is the point
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, fields(cls)[0].name, None)
    assert cfg.as_dict()["command"] == cls.command


@pytest.mark.parametrize("make, message", [
    (lambda: _cls("delta")(rl=("a",), unknown="maybe"), "--unknown"),
    (lambda: _cls("delta")(rl=()), "no RL checkpoint"),
    (lambda: _cls("train grpo")(init="a", out="b", group_size=1), "--group-size 1 must be ≥ 2"),
    (lambda: _cls("train grpo")(init="a", out="b", tasks="nope"), "unknown task or suite"),
    (lambda: _cls("train sft")(out="a", budgets=("click-button",)), "expected TASK=N"),
    (lambda: _cls("train sft")(out="a", decoys=("click-button=2",)), "0 ≤ RATE < 1"),
    (lambda: _cls("train sft")(out="a", tasks="mastered", budgets={"click-tab": 5}), "given whole"),
    (lambda: _cls("train sft")(out="a", steps=0), "--steps must be ≥ 1"),
])
def test_bad_settings_are_refused_on_creation(make, message):
    with pytest.raises(GraftkitError, match=message):
        make()


def _cls(name: str) -> type:
    return _configs()[name]


def test_command_line_forms_become_the_stored_types():
    from graftkit.train.sft import DEFAULT_BUDGETS, SFTConfig
    from graftkit.study.design import SUITES

    grpo = _cls("train grpo")(init=Path("sft"), out=Path("rl"), tasks="mastered,headroom")
    assert grpo.init == "sft" and grpo.out == "rl"
    assert grpo.tasks == (*SUITES["mastered"], *SUITES["headroom"])
    assert _cls("train grpo")(init="a", out="b").tasks == tuple(SUITES["mastered"])
    # the command line's TASK=N changes to the default recipe become its pools; none given: the default recipe
    assert _cls("train sft") is SFTConfig
    sft = SFTConfig(out="o", tasks="click-tab,enter-text", budgets=["click-tab=7"], decoys=["click-tab=0.5"])
    assert sft.out == Path("o") and sft.pools == {"click-tab": 7, "enter-text": DEFAULT_BUDGETS["enter-text"]}
    assert sft.decoys == {"click-tab": 0.5} and SFTConfig(out="o").pools == DEFAULT_BUDGETS
    # what the policy records: how it trained, not where its curves go nor how the pools were spelled
    assert set(sft.recorded()) == {"out", "budgets", "decoys", "size", "init", "steps", "batch_size", "lr", "warmup",
                                   "weight_decay", "grad_clip", "seed", "threads", "device", "dtype", "save_dtype",
                                   "lora_r", "lora_alpha", "lora_targets"}
    assert sft.recorded()["budgets"] == sft.pools
    # the fields keep what was given: a derived config resolves its own tasks (the study derives its SFT runs so)
    other = sft.replace(tasks="enter-text,click-button")  # its TASK=N changes still apply
    assert other.pools == {"click-button": DEFAULT_BUDGETS["click-button"], "enter-text": DEFAULT_BUDGETS["enter-text"],
                           "click-tab": 7}
    assert sft.replace(tasks=None).pools == {**DEFAULT_BUDGETS, "click-tab": 7}
    study = _cls("demo")(out=Path("runs/x"), sft=Path("s"))
    assert study.out == "runs/x" and study.sft == "s"


def test_the_command_line_stays_thin():
    """cli.py parses, builds a config, calls one run function and renders: at most 600 lines, and no
    function in it over 60."""
    import ast

    path = Path(__file__).resolve().parents[1] / "cli.py"
    source = path.read_text()
    assert len(source.splitlines()) <= 600, f"cli.py has {len(source.splitlines())} lines (at most 600)"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 60]
    assert not long, f"cli.py functions over 60 lines: {long}"
