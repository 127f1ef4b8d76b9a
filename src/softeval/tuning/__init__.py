"""Tuning: the methods and their settings, soft prompts (vectors and files), LoRA adapters, the
tuner with its validation curve and checkpoints, the learning-rate sweep, and export to PEFT.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # config
    "METHODS": "config",
    "Method": "config",
    "TUNED": "config",
    "TuneConfig": "config",
    "check_tuning_rows": "config",
    "soft_prompt_file": "config",
    # export
    "export_peft": "export",
    # lora
    "Adapter": "lora",
    "WEIGHTS": "lora",
    "load_adapter": "lora",
    "lora_applied": "lora",
    # softprompt
    "MODEL_KEYS": "softprompt",
    "WEIGHTS_KEY": "softprompt",
    "identity_keys": "softprompt",
    "SoftPrompt": "softprompt",
    "check_made_for": "softprompt",
    "check_task_made_for": "softprompt",
    "initial_vectors": "softprompt",
    "load_soft_prompt": "softprompt",
    "save_soft_prompt": "softprompt",
    # tuner
    "check_resumable": "tuner",
    "checkpoint_matches": "tuner",
    "provenance": "tuner",
    "provenance_difference": "tuner",
    "sweep": "tuner",
    "sweep_record": "tuner",
    "tune": "tuner",
    "warm_start_record": "tuner",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
