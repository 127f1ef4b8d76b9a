"""Progress bars with ETA for long work, on stderr so piped results stay clean."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
# Result tables go to stdout, wide enough for every column even when piped to a file.
stdout = Console(width=None if Console().is_terminal else 200)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator:
    """Yields `advance(n)`; a no-op when disabled."""
    if not enabled:
        yield lambda n: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
