"""Progress bars with ETA for long work, on stderr so piped results stay clean."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _console(stderr: bool) -> Console:
    """A console as wide as its terminal; piped to a file, 200 columns (not rich's 80), so paths
    in log lines and rows of result tables are not broken across lines."""
    return Console(stderr=stderr, width=None if Console(stderr=stderr).is_terminal else 200)


console = _console(stderr=True)  # logs and progress
stdout = _console(stderr=False)  # result tables

Advance = Callable[[int], None]


class Bars:
    """The rows of one live progress display. `row` starts a row, or restarts the row of the same
    description (a tuning run validates many times), and returns its advance function."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.rows: dict[str, TaskID] = {}

    def row(self, description: str, total: int) -> Advance:
        progress = self.progress
        if progress is None:
            return lambda n: None
        if description in self.rows:
            progress.reset(self.rows[description], total=total)
        else:
            self.rows[description] = progress.add_task(description, total=total)
        task = self.rows[description]
        return lambda n: progress.advance(task, n)


@contextmanager
def progress_bars(enabled: bool = True) -> Iterator[Bars]:
    """A live display for the `with` block (nothing is drawn when disabled)."""
    if not enabled:
        yield Bars(None)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        yield Bars(progress)
