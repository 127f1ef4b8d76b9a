"""File writes: every result file softeval writes is complete or absent, never half-written.

`write_atomic` writes to a temporary file beside the target (named after the target and the
writing process), flushes it to disk, renames it over the target and syncs the folder, so neither
a crash nor a power cut leaves a partial file. A temporary file left by a killed process is removed
the next time its target is written. Files get the user's umask, like any file a tool creates.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import secrets
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from softeval.errors import SoftevalError

# Fault injection for the crash-safety tests: "NAME[:N]" kills the process (SIGKILL) on the Nth
# write of a file named NAME ("*": of any file), after its temporary file is on disk and before
# the rename.
KILL_BEFORE_RENAME_ENV = "SOFTEVAL_KILL_BEFORE_RENAME"
_writes_seen: dict[str, int] = {}


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Write `path` through `write(file)`; the target is replaced only once the bytes are on disk."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        # os.open with mode 0o666, not mkstemp (0o600): the user's umask decides who may read results
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            _maybe_kill_before_rename(path)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _sync_folder(path.parent)
    except OSError as exc:
        raise SoftevalError(f"cannot write {path}: {exc.strerror or exc}; {fix_for(exc)}") from exc


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_yaml_mapping(path: Path, what: str, holds: str) -> dict:
    """A YAML file that must hold a mapping (`what` names the file in errors, `holds` says what
    the mapping is of); bad syntax or another shape is a one-line error."""
    import yaml

    try:
        raw = yaml.safe_load(read_utf8(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)  # where the parser gave up, counted from 0
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SoftevalError(f"{what} {path}{at} is not valid YAML ({problem}); fix its syntax") from exc
    if not isinstance(raw, dict):
        raise SoftevalError(f"{what} {path} must be a YAML mapping of {holds}")
    return raw


def read_utf8(path: Path) -> str:
    """A text file's content (a leading byte-order mark dropped); a file that is not UTF-8 is an
    error naming its first bad line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SoftevalError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); re-encode the file as UTF-8"
        ) from exc


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (model weights can be gigabytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fix_for(exc: OSError, option: str = "output folder") -> str:
    """What to do about a failed write."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"free disk space or choose another {option}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"choose a writable {option}"
    return f"check the folder, or choose another {option}"


def _remove_stale_temporaries(path: Path) -> None:
    """Temporary files of `path` whose writing process is gone (killed between write and rename).
    Process ids are this machine's: on a folder shared between machines a live writer elsewhere
    could look gone, so two machines must not write the same results folder at once."""
    for legacy in (f".{path.name}.tmp", f".{path.stem}.tmp{path.suffix}"):  # fixed names of older versions
        path.with_name(legacy).unlink(missing_ok=True)
    ours = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[0-9a-f]{{8}}\.tmp")
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        match = ours.fullmatch(tmp.name)
        if match and not _alive(int(match.group(1))):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _maybe_kill_before_rename(path: Path) -> None:
    target = os.environ.get(KILL_BEFORE_RENAME_ENV)
    if not target:
        return
    name, _, nth = target.partition(":")
    if name not in ("*", path.name):
        return
    _writes_seen[name] = _writes_seen.get(name, 0) + 1
    if _writes_seen[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
