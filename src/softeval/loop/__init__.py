"""Evaluation while a model trains: `InLoop` inside any training loop, callbacks for the trainers
people use (transformers' Trainer, Lightning), and `watch`, which evaluates a training run's
checkpoints as they land, with no change to the trainer. Each files its checkpoints as a study's
series, so analysis, report page and exports read the folder as they read a study's.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # callbacks
    "SoftevalCallback": "callbacks",
    "SoftevalLightningCallback": "lightning",
    # evaluator
    "Evaluation": "checkpoints",
    "InLoop": "evaluator",
    # guard
    "training_untouched": "guard",
    # settings
    "FastSet": "settings",
    "LoopSettings": "settings",
    # watch
    "watch": "watch",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
