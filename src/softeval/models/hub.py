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
    import datasets
    from huggingface_hub import constants

    behind_proxy = any(scheme != "no" for scheme in getproxies())  # no_proxy alone names no proxy
    if datasets.config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE or behind_proxy:
        return None
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=HUB_PROBE_SECONDS).close()
    except OSError as exc:
        return f"{endpoint.hostname}:{port} is not reachable: {exc.strerror or exc}"
    return None


@contextmanager
def offline() -> Iterator[None]:
    """Offline mode for one load, as HF_HUB_OFFLINE=1 sets it: datasets, huggingface_hub and
    transformers read these flags at call time. So does `evaluate` (which lm-eval's task modules
    call as they are imported, and which otherwise retries the hub for seconds per metric); it
    reads HF_EVALUATE_OFFLINE when first imported, so where that happens inside, it stays
    offline afterwards (this runs only once the hub is known to be unreachable)."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    evaluate_config = sys.modules.get("evaluate.config")
    evaluate_saved = (os.environ.get(EVALUATE_OFFLINE), getattr(evaluate_config, EVALUATE_OFFLINE, None))
    os.environ[EVALUATE_OFFLINE] = "1"
    if evaluate_config is not None:
        evaluate_config.HF_EVALUATE_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved
        if evaluate_saved[0] is None:
            os.environ.pop(EVALUATE_OFFLINE, None)
        else:
            os.environ[EVALUATE_OFFLINE] = evaluate_saved[0]
        if evaluate_config is not None:
            evaluate_config.HF_EVALUATE_OFFLINE = evaluate_saved[1]
