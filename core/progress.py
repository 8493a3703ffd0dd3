"""Progress on stderr for the command line: rich bars drawn from :class:`~graftkit.core.config.OnProgress` calls
and from training steps, shown only when stderr is a terminal; byte counts as :func:`~.files.fmt_size` writes them."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from .files import fmt_size

err = Console(stderr=True, highlight=False)


class Bars:
    """An :class:`~graftkit.core.config.OnProgress` drawn as rich progress bars on stderr, one per ``what``."""

    def __init__(self):
        self.p = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), Count(), TimeRemainingColumn(),
                          console=err, transient=True, disable=not err.is_terminal)
        self.ids: dict[str, int] = {}

    def __enter__(self) -> "Bars":
        self.p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.p.__exit__(*exc)

    def __call__(self, what: str, advance: int, total: int, unit: str) -> None:
        if what not in self.ids:
            self.ids[what] = self.p.add_task(escape(what), total=total, unit=unit)
        self.p.advance(self.ids[what], advance)


class Count(ProgressColumn):
    def render(self, task) -> Text:
        unit = task.fields.get("unit", "")
        if unit == "bytes":
            return Text(f"{fmt_size(task.completed)}/{fmt_size(task.total or 0)}")
        return Text(f"{task.completed:.0f}/{task.total:.0f} {unit}")


def step_printer(total: int, what: str, keys: tuple[str, ...]):
    """A progress bar on stderr whose description shows the latest metrics."""
    p = Progress(TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                 TextColumn("{task.description}"), TimeRemainingColumn(), console=err, transient=True,
                 disable=not err.is_terminal)
    task = p.add_task("", total=total)

    def on_step(m: dict) -> None:
        p.update(task, completed=m["step"], description=" ".join(f"{k} {m[k]:.3g}" for k in keys if k in m))

    return p, on_step
