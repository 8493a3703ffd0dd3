"""Commands as configs: the frozen, typed config every command is built from.

A command is one frozen dataclass (a docstring per field, validated in ``__post_init__``) and one
``run_*(cfg, on_progress=...)`` that writes its results and never prints. The command line generates its
options from the fields (name, type, default, and help from the field's docstring, as mergekit's
``add_merge_options`` does), so a default or a help text lives in exactly one place; every result stores
``cfg.as_dict()`` as its provenance. This module is a leaf: every package may import it.

Field metadata (:func:`opt`): ``flags`` (the option's names, default ``--field-name``), ``argument``
(a positional argument), ``cli=False`` (set by callers, never on the command line), ``cli_type`` (the
type the command line parses when it differs from the stored one, e.g. a suite name for a task tuple;
the config's ``__post_init__`` turns it into the stored type).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
import textwrap
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .errors import GraftkitError


class OnProgress(Protocol):
    """Progress of long work: ``on_progress(what, advance, total, unit)``.

    ``what`` names the bar (one bar per distinct ``what``), ``advance`` is how much was done since the last
    call, ``total`` the bar's size, ``unit`` what is counted (``bytes``, ``episodes``, ``prompts``, ``configs``).
    """

    def __call__(self, what: str, advance: int, total: int, unit: str) -> None: ...


def no_progress(what: str, advance: int, total: int, unit: str) -> None:
    """The default :class:`OnProgress`: show nothing."""


def opt(default: Any = MISSING, *, flags: tuple[str, ...] = (), argument: bool = False, cli: bool = True,
        default_factory: Any = MISSING, cli_type: Any = None) -> Any:
    """A config field with command-line metadata (its help is the field's docstring)."""
    return field(default=default, default_factory=default_factory,
                 metadata={"flags": tuple(flags), "argument": argument, "cli": cli, "cli_type": cli_type})


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after it in the class body), over the MRO."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_class_docs(klass))
    return docs


@functools.lru_cache(maxsize=None)
def _module_tree(filename: str) -> ast.Module | None:
    """The parsed source of one module, once per process (every command's config reads its classes' docs at
    start-up; ``inspect.getsource`` would parse the module again for each class)."""
    try:
        return ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def _class_docs(klass: type) -> dict[str, str]:
    """The field docstrings written in ``klass``'s own body."""
    node = None
    try:
        tree = _module_tree(inspect.getsourcefile(klass) or "")
    except TypeError:
        tree = None
    if tree is not None:
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == klass.__qualname__), None)
    if node is None:  # a nested or generated class: its own source, if it has one
        try:
            parsed = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            return {}
        node = parsed.body[0] if parsed.body and isinstance(parsed.body[0], ast.ClassDef) else None
    body = node.body if node is not None else []
    docs = {}
    for a, b in zip(body, body[1:]):
        if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def plain(v: Any) -> Any:
    """A config value as JSON-able data: paths as strings, tuples and sets as lists, nested configs as dicts."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, (tuple, list, set, frozenset)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return v


@dataclass(frozen=True, kw_only=True)
class CommandConfig:
    """The base of every command's config: lists become tuples, paths become :class:`Path`, and
    :meth:`as_dict` is the provenance every result of the command stores."""

    command: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
            elif isinstance(v, str) and _is_path(hints.get(f.name)):
                object.__setattr__(self, f.name, Path(v))
            elif isinstance(v, tuple) and _is_path(_item_type(hints.get(f.name))):
                object.__setattr__(self, f.name, tuple(Path(x) for x in v))

    def as_dict(self) -> dict:
        return {"command": self.command, **{f.name: plain(getattr(self, f.name)) for f in fields(self)}}

    def replace(self, **changes) -> "CommandConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class RunOption(CommandConfig):
    """The run folder of a command that writes results (mixed into its config)."""

    run: Path | None = opt(None, flags=("--run",))
    """Run folder whose results/ this command reads and writes (default: the run named in runs/.current, which
    graftkit demo writes, else runs/)."""


@dataclass(frozen=True, kw_only=True)
class DeviceOption(CommandConfig):
    """Where and in what precision a command's model runs (mixed into every config that runs a model)."""

    device: str = "auto"
    """auto (the first CUDA device when there is one, else the CPU), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """auto (on a GPU the checkpoint's dtype, and bfloat16 autocast for training; float32 on the CPU), float32,
    bfloat16 or float16; training keeps float32 master weights and runs autocast in this dtype."""

    def __post_init__(self) -> None:
        super().__post_init__()
        from .devices import check_device, check_dtype

        check_device(self.device)
        check_dtype(self.dtype)

    @property
    def placement(self) -> dict[str, str]:
        """``device`` and ``dtype``, to pass on to the configs of the commands this one runs."""
        return {"device": self.device, "dtype": self.dtype}


#: What generates a policy's actions (``--engine``): :mod:`graftkit.agent.engine`.
GENERATION_ENGINES = ("hf", "vllm", "auto")


@dataclass(frozen=True, kw_only=True)
class EngineOption(CommandConfig):
    """Which engine generates the policy's actions (mixed into the configs that play episodes)."""

    engine: str = "hf"
    """hf (graftkit's batched decoder over transformers), vllm (a vLLM engine over the same weights; the vllm
    extra) or auto (vllm where it is installed and the observation is text)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.engine, GENERATION_ENGINES, "--engine")


@dataclass(frozen=True, kw_only=True)
class LoraOption(CommandConfig):
    """LoRA instead of full fine-tuning (mixed into the training configs)."""

    lora_r: int = 0
    """LoRA rank (0: full fine-tuning); the run writes a PEFT adapter over --init."""
    lora_alpha: float = 16.0
    """LoRA alpha (the adapter's scale is alpha / r)."""
    lora_targets: str = "attn"
    """Modules that get adapters: attn (q, k, v, o projections), qv, all-linear, or a comma list of module names."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lora_r < 0 or not self.lora_alpha > 0 or not self.lora_targets.strip(" ,"):
            raise GraftkitError(f"--lora-r {self.lora_r} must be ≥ 0, --lora-alpha {self.lora_alpha} > 0 and "
                                "--lora-targets name modules", "e.g. --lora-r 8 --lora-alpha 16 --lora-targets attn")


EXECUTORS = ("serial", "ray")


@dataclass(frozen=True, kw_only=True)
class ExecutorOption(CommandConfig):
    """How the many units of a sweep run: one after another, or on Ray workers (mixed into sweep configs)."""

    executor: str = "serial"
    """serial (one after another, in this process) or ray (one worker per GPU or CPU; needs the ray extra)."""
    ray_address: str = "local"
    """Ray cluster for --executor ray: local (start one on this machine), auto (the running cluster) or
    HOST:PORT."""
    workers: int | None = None
    """Ray workers (default: one per GPU with a CUDA --device, else one per CPU of the cluster)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.executor, EXECUTORS, "--executor")
        if self.workers is not None and self.workers < 1:
            raise GraftkitError(f"--workers {self.workers} must be ≥ 1", "pass e.g. --workers 2")
        if self.executor == "serial" and (self.ray_address != "local" or self.workers is not None):
            raise GraftkitError("--ray-address and --workers need --executor ray", "add --executor ray")


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", ())) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def _item_type(tp: Any) -> Any:
    tp, _ = _strip_optional(tp)
    if typing.get_origin(tp) in (tuple, list) and typing.get_args(tp):
        return typing.get_args(tp)[0]
    return None


def _is_path(tp: Any) -> bool:
    tp, _ = _strip_optional(tp)
    return tp is Path


def cli_type(tp: Any) -> Any:
    """The type typer parses for a config field's type (variadic tuples are repeatable options)."""
    inner, optional = _strip_optional(tp)
    if typing.get_origin(inner) in (tuple, list):
        inner = typing.List[typing.get_args(inner)[0]]
    return typing.Optional[inner] if optional else inner


def cli_parameters(cls: type, defaults: dict[str, Any] | None = None) -> list[inspect.Parameter]:
    """One typer parameter per command-line field of ``cls``: name, type, default and help from the field.

    ``defaults`` overrides a field's default on this command line only (e.g. ``headroom --tasks all``)."""
    import typer

    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    params = []
    own = set(cls.__dict__.get("__annotations__", {}))
    for f in sorted(fields(cls), key=lambda f: f.name not in own):  # the command's own fields first
        md = f.metadata
        if not md.get("cli", True):
            continue
        if defaults and f.name in defaults:
            default = defaults[f.name]
        elif f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = ...
        if isinstance(default, tuple):
            default = list(default) or None
        help_ = docs.get(f.name, "")
        maker = typer.Argument if md.get("argument") else typer.Option
        info = maker(default, *md.get("flags", ()), help=help_, show_default=default not in (None, ...))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=info,
                                        annotation=md.get("cli_type") or cli_type(hints[f.name])))
    return params


def check_choice(value: Any, choices, flag: str, what: str = "") -> None:
    """A one-line error naming the flag and the choices when ``value`` is not one of them."""
    if value not in choices:
        raise GraftkitError(f"{flag} {value!r} is not an option{what}", f"use one of {', '.join(map(str, choices))}")
