"""What a local model's weights are: the sha256 of its weight files, part of the model's identity.

A training job that reruns into the same folder rewrites `checkpoint-500/model.safetensors` with
new weights under the same path and config; without the weights in its identity, the finished
cells of the old weights would be kept as if they were the new model's. Hashing gigabytes on every
command would cost minutes, so each file's sha256 is cached by its path, size, modification and
change times and inode: an unchanged checkpoint costs a `stat`, a rewritten one is hashed again.

A file modified within the last few seconds is hashed but not cached: a file system's clock may
be too coarse to tell a rewrite that quick from the write before it (git's "racy" files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from platformdirs import user_cache_dir

from softeval._io import file_sha256, write_json_atomic
from softeval.errors import SoftevalError

log = logging.getLogger("softeval")

HASH_CACHE_ENV = "SOFTEVAL_HASH_CACHE"  # the cache file's path (default: in softeval's cache folder)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")
# a training checkpoint's state beside its weights: not the model, and often twice its size
TRAINING_STATE = ("optimizer", "scheduler", "scaler", "rng_state", "training_args")
RACY_SECONDS = 3.0
ANNOUNCE_BYTES = 1 << 30  # hashing this much or more is said, since it takes a while


def weight_files(path: Path) -> list[Path]:
    """A model's weight files: the file itself (a .gguf), or the files with a weights suffix in a
    folder (not in its subfolders, which transformers does not load: a trainer's output folder
    holds its checkpoints there), its training state left out, by name."""
    if path.is_file():
        return [path]
    return sorted(f for f in path.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file() and not f.name.startswith((".", *TRAINING_STATE)))


def weights_sha256(path: str | Path) -> str | None:
    """One sha256 for a local model's weights: a file's own, or over a folder's weight files by
    their names; None for a folder without any (transformers then says what is missing)."""
    path = Path(path)
    files = weight_files(path)
    if not files:
        return None
    cache = _HashCache.open()
    uncached = sum(f.stat().st_size for f in files if cache.get(f) is None)
    if uncached >= ANNOUNCE_BYTES:
        log.info("hashing %.1f GB of weights in %s (once: the hashes are cached)", uncached / 1e9, path)
    hashes = {f: cache.hash(f) for f in files}
    cache.save()
    if path.is_file():
        return hashes[path]
    digest = hashlib.sha256()
    for f, sha in hashes.items():
        digest.update(f"{f.name}\0{sha}\n".encode())
    return digest.hexdigest()


def hash_cache_path() -> Path:
    return Path(os.environ.get(HASH_CACHE_ENV) or Path(user_cache_dir("softeval")) / "weights-sha256.json")


class _HashCache:
    """File hashes by resolved path, each valid while the file's size, mtime, ctime and inode are those
    it was hashed with. Lost entries cost a hash, never a wrong one: concurrent writers may drop
    each other's entries, and an unreadable cache starts empty."""

    def __init__(self, path: Path, entries: dict):
        self.path, self.entries, self.changed = path, entries, False

    @classmethod
    def open(cls) -> _HashCache:
        path = hash_cache_path()
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = {}
        return cls(path, entries if isinstance(entries, dict) else {})

    @staticmethod
    def _stamp(stat: os.stat_result) -> list[int]:
        # ctime too: a copy that sets mtime back (cp -p, rsync -t) cannot set it
        return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]

    def get(self, file: Path) -> str | None:
        entry = self.entries.get(str(file.resolve()))
        if isinstance(entry, dict) and entry.get("stamp") == self._stamp(file.stat()):
            return entry.get("sha256")
        return None

    def hash(self, file: Path) -> str:
        cached = self.get(file)
        if cached is not None:
            return cached
        before = file.stat()
        sha = file_sha256(file)
        after = file.stat()
        if self._stamp(after) != self._stamp(before):
            raise SoftevalError(f"{file} changed while it was hashed; wait for whatever writes it to finish, then run the command again")
        if time.time_ns() - after.st_mtime_ns > RACY_SECONDS * 1e9:
            self.entries[str(file.resolve())] = {"stamp": self._stamp(after), "sha256": sha}
            self.changed = True
        return sha

    def save(self) -> None:
        if not self.changed:
            return
        # files deleted since (a cleaned-up run folder) leave the cache with their entries
        self.entries = {path: entry for path, entry in self.entries.items() if os.path.exists(path)}
        try:
            write_json_atomic(self.path, self.entries)
        except SoftevalError as exc:  # a cache that cannot be written costs time on the next command, nothing else
            log.debug("the weights' hash cache was not written: %s", exc)


def parameters_sha256(network) -> str:
    """One sha256 over a model's parameters in memory (names, dtypes, shapes and bytes, in
    order): the weights of a model evaluated while it trains, which has no files. Each tensor
    is copied to the CPU on its own, so the copy never holds more than one tensor."""
    import torch

    digest = hashlib.sha256()
    for name, parameter in network.named_parameters():
        tensor = parameter.detach()
        digest.update(f"{name}\0{str(tensor.dtype)}\0{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
