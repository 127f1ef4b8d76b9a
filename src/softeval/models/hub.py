"""The Hugging Face hub, when it cannot be reached: told in seconds, so data and models come from
the local caches at once (or fail in one line) instead of after ~30-50 s of retries."""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse
from urllib.request import getproxies

HUB_PROBE_SECONDS = 3.0
EVALUATE_OFFLINE = "HF_EVALUATE_OFFLINE"


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or None. Offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)
    reads the local caches and needs no hub, and behind a proxy only the proxy can tell: neither
    is probed. The probe is one connect of at most HUB_PROBE_SECONDS per address of the
    endpoint, after its name resolves."""
    from huggingface_hub import constants

    behind_proxy = any(scheme != "no" for scheme in getproxies())  # no_proxy alone names no proxy
    if offline_mode_set() or behind_proxy:
        return None
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as exc:
        return f"{endpoint.hostname}:{port} is not reachable: {exc.strerror or exc}"
    return None


def offline_mode_set() -> bool:
    """Whether the user set offline mode (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)."""
    import datasets
    from huggingface_hub import constants

    return bool(datasets.config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE)


@contextmanager
def offline() -> Iterator[None]:
    """Offline mode for one load, as HF_HUB_OFFLINE=1 sets it: datasets, huggingface_hub and
    transformers read these flags at call time; `evaluate` too (see `_evaluate_offline`)."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        with _evaluate_offline():
            yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


@contextmanager
def _evaluate_offline() -> Iterator[None]:
    """`evaluate` offline: lm-eval's task modules load metrics with it as they are imported, and
    it would otherwise retry the hub for seconds per metric. It ignores HF_HUB_OFFLINE and reads
    HF_EVALUATE_OFFLINE into its config when first imported, then the config at each call: both
    are set inside and as they were (or would have been) after."""
    outside = os.environ.get(EVALUATE_OFFLINE)
    config = sys.modules.get("evaluate.config")
    before = None if config is None else config.HF_EVALUATE_OFFLINE
    os.environ[EVALUATE_OFFLINE] = "1"
    if config is not None:
        config.HF_EVALUATE_OFFLINE = True
    try:
        yield
    finally:
        if outside is None:
            os.environ.pop(EVALUATE_OFFLINE, None)
        else:
            os.environ[EVALUATE_OFFLINE] = outside
        config = sys.modules.get("evaluate.config")  # imported inside, maybe
        if config is not None:
            config.HF_EVALUATE_OFFLINE = before if before is not None else (outside or "").upper() in config.ENV_VARS_TRUE_VALUES
