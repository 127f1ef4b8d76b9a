"""Models: loading by alias, folder or hub id (the offline GGUF packages converted once into a
cache), a model's identity read from its config and its weight files' hashes, whether the hub can be reached, and memory the
process keeps between batches.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # hub
    "hub_unreachable": "hub",
    "offline": "hub",
    "offline_mode_set": "hub",
    # loading
    "ALIASES": "loading",
    "LoadedModel": "loading",
    "cache_root": "loading",
    "cached_models": "loading",
    "checkpoint_step": "loading",
    "checkpoint_tokens": "loading",
    "expand_checkpoints": "loading",
    "live_model": "loading",
    "free_hub_weights": "loading",
    "load_model": "loading",
    "local_checkpoint": "loading",
    "model_kind": "loading",
    "model_name": "loading",
    "prepare_alias": "loading",
    # fingerprint
    "parameters_sha256": "fingerprint",
    "weights_sha256": "fingerprint",
    # memory
    "kept_free_bytes": "memory",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
