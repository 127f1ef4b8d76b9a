"""One computation per cell and per tuning when several commands share an output folder.

A cell or a tuned prompt is claimed with an exclusive lock on a file in OUTPUT/.locks/ (the
`filelock` library: `flock` on POSIX) for as long as it is computed. A second command that wants
the same work waits for the lock, then finds the finished result and reuses it, exactly as a rerun
would. The operating system releases a lock when its owner dies, however it dies, so a crashed or
killed command leaves no stale lock: the next command takes the work over (and resumes a tuning
from its checkpoint where one was saved).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

log = logging.getLogger("softeval")

LOCKS = ".locks"


def lock_path(output: Path, folder: Path) -> Path:
    """The lock file of a cell or tuning folder: named by a hash of its path within the output
    folder, so any depth of model and task names fits one short file name."""
    relative = Path(folder).resolve().relative_to(Path(output).resolve()).as_posix()
    return Path(output) / LOCKS / f"{hashlib.sha256(relative.encode()).hexdigest()[:32]}.lock"


@contextmanager
def claimed(output: Path, folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock while the block computes it; wait, saying so once, where another
    command holds it."""
    path = lock_path(output, folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another softeval command, which is computing %s", folder)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
