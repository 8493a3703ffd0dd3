"""Progress on stderr for the command line, from :class:`~graftkit.core.config.OnProgress` calls and training steps.

Where stderr is an interactive terminal (rich's test, which ``FORCE_COLOR``, ``TTY_COMPATIBLE`` and
``TTY_INTERACTIVE`` steer): rich bars, one per ``what``, gone when the command ends. Elsewhere (a log file, CI, a
batch job's output): plain lines, as tqdm's ``mininterval`` gives in a log but without its carriage returns —
one line per bar at most every :data:`EVERY_S` seconds ("rank rl: 105/211 matrices (50%), 31 s elapsed, about
30 s left"), and its last line when the bar completes if it wrote one before; work that ends sooner writes
nothing, so a quick command's log holds its output alone. Byte counts as :func:`~.files.fmt_size` writes them.
"""

from __future__ import annotations

from time import monotonic

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text

from .files import fmt_size

err = Console(stderr=True, highlight=False)

#: Seconds between two plain progress lines of one bar when stderr is not a terminal.
EVERY_S = 30.0


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _count(completed: float, total: float, unit: str) -> str:
    if unit == "bytes":
        return f"{fmt_size(completed)}/{fmt_size(total or 0)}"
    return f"{completed:.0f}/{total:.0f} {unit}".rstrip()


class Lines:
    """Bars as occasional plain lines on stderr (see the module docstring): :meth:`update` with each bar's
    count so far; a line when :data:`EVERY_S` seconds have passed since the bar's start or its last line, and
    one when it completes after having written one. A bar starts when the work before it last reported (the
    first bar: when this was made), so its first unit of work counts in its elapsed time."""

    def __init__(self) -> None:
        self.bars: dict[str, dict] = {}
        self.latest = monotonic()

    def update(self, what: str, completed: float, total: float, unit: str, detail: str = "") -> None:
        now = monotonic()
        bar = self.bars.setdefault(what, {"start": self.latest, "last": self.latest, "wrote": False, "closed": False})
        self.latest = now
        done = bool(total) and completed >= total
        if bar["closed"] or not (now - bar["last"] >= EVERY_S or (done and bar["wrote"])):
            return
        elapsed = now - bar["start"]
        line = f"{what}: {_count(completed, total, unit)}"
        if total:
            line += f" ({100 * min(completed / total, 1.0):.0f}%)"
        line += f"{detail}, {_duration(elapsed)} elapsed"
        if done:
            line += ", done"
        elif total and completed > 0:
            line += f", about {_duration(elapsed * (total - completed) / completed)} left"
        err.print(Text(line), soft_wrap=True)
        bar.update(last=now, wrote=True, closed=done)


class Bars:
    """An :class:`~graftkit.core.config.OnProgress` on stderr: rich bars, one per ``what``, on an interactive
    terminal; else :class:`Lines`."""

    def __init__(self):
        self.terminal = err.is_interactive  # a live bar redraws itself: it needs an interactive terminal
        self.p = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), Count(), TimeRemainingColumn(),
                          console=err, transient=True, disable=not self.terminal)
        self.lines = None if self.terminal else Lines()
        self.ids: dict[str, int] = {}
        self.done: dict[str, float] = {}

    def __enter__(self) -> "Bars":
        self.p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.p.__exit__(*exc)

    def __call__(self, what: str, advance: int, total: int, unit: str) -> None:
        if what not in self.ids:
            self.ids[what] = self.p.add_task(escape(what), total=total, unit=unit)
        self.p.advance(self.ids[what], advance)
        self.done[what] = self.done.get(what, 0) + advance
        if self.lines is not None:
            self.lines.update(what, self.done[what], total, unit)


class Count(ProgressColumn):
    def render(self, task) -> Text:
        return Text(_count(task.completed, task.total or 0, task.fields.get("unit", "")))


def step_printer(total: int, what: str, keys: tuple[str, ...]):
    """A progress bar on stderr whose description shows the latest metrics (plain :class:`Lines` when stderr
    is not a terminal)."""
    terminal = err.is_interactive
    p = Progress(TextColumn(f"[bold]{escape(what)}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                 TextColumn("{task.description}"), TimeRemainingColumn(), console=err, transient=True,
                 disable=not terminal)
    task = p.add_task("", total=total)
    lines = None if terminal else Lines()

    def on_step(m: dict) -> None:
        shown = " ".join(f"{k} {m[k]:.3g}" for k in keys if k in m)
        p.update(task, completed=m["step"], description=shown)
        if lines is not None:
            lines.update(what, m["step"], total, "steps", f", {shown}" if shown else "")

    return p, on_step
