"""Every flag a hint names exists: a fix the user is told to apply must parse."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import typer.main

from graftkit.cli import app

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Flags of other programs that hints may name (pip, pytest, ray).
OTHERS = {"--extra-index-url", "--index-url", "--head", "--no-deps"}


def _command_flags() -> dict[str, set[str]]:
    """Every command path (``train grpo``) → its option names."""
    out: dict[str, set[str]] = {}

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            out[" ".join(path)] = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
                                   if o.startswith("--")}

    walk(typer.main.get_command(app), ())
    return out


def _hints() -> list[tuple[str, int, str]]:
    """(file, line, text) of the second argument of every ``GraftkitError(...)`` (its hint), as written."""
    from test_layout import _all_modules  # the package's own modules (not .venv, tests or build output)

    found = []
    for path in sorted(_all_modules()):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "GraftkitError":
                for arg in node.args[1:2]:
                    text = "".join(v.value for v in ast.walk(arg) if isinstance(v, ast.Constant) and isinstance(v.value, str))
                    found.append((str(rel), node.lineno, text))
    return found


def test_every_flag_a_hint_names_is_a_flag_of_some_command():
    flags = set().union(*_command_flags().values()) | OTHERS
    hints = _hints()
    assert len(hints) > 100  # the scan sees the project's errors
    unknown = [f"{f}:{line}: {flag}" for f, line, text in hints for flag in FLAG.findall(text) if flag not in flags]
    assert not unknown, "hints name flags no command has:\n" + "\n".join(unknown)


def test_the_flags_of_the_reading_commands_hints_are_their_own():
    """The hints of the commands that read a LoRA adapter or an RL checkpoint name that command's own flag."""
    flags = _command_flags()
    assert "--base" in flags["inspect"] and "--base" in flags["eval"] and "--base" in flags["headroom"]
    assert "--base" in flags["rank"]  # one name for the base in every command; graft's --vs is a second RL run
    assert {"--force-pair", "--all-checkpoints", "--run"} <= flags["delta"]
    assert {"--force-pair", "--cast", "--run"} <= flags["graft"]
    for cmd in ("eval", "headroom", "rank", "delta", "graft", "train sft"):
        assert "--run" in flags[cmd], cmd
