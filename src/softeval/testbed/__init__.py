"""A pre-training testbed where the truth is known: a world of invented people and their facts,
its two benchmarks as ordinary tasks, recipes of tiny causal LMs pre-trained on its biographies
(checkpoints as training-run folders), their post-trained references, and each model's true
knowledge of the test facts. `softeval testbed DIR` builds it; `softeval study DIR/study.yaml`
runs it; `softeval analyze` compares each method's scores with the true knowledge.

world.py (people and facts) -> corpus.py (documents, tokenizer) -> training.py (pre- and
post-training) -> truth.py (known facts) -> tasks.py (task files) -> build.py (all of it, the
design check and the study file).
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    "SIZES": "build",
    "build_testbed": "build",
    "describe": "build",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
