"""The engine: generation, option log-likelihoods and the tuning loss for a model.

`start_engine` measures the fast path (`fast`, with `pool`, `decoding` and `attention`) against the
model's own forward (`reference`) once per model (`selfcheck`) and returns the engine that computes
what transformers computes: the fast one where the check passed, else the reference.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # fast
    "Engine": "fast",
    # reference
    "ReferenceEngine": "reference",
    # selfcheck
    "start_engine": "selfcheck",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
