"""Studies: the settings a study file holds, one cell's evaluation, a study's cells and their
folders, the checks before any work, the runner, and Ray.
"""

from softeval._lazy import lazy_exports

EXPORTS = {
    # evaluation
    "evaluate": "evaluation",
    # folders
    "cell_folder": "folders",
    # preflight
    "check_before_work": "preflight",
    "check_output": "preflight",
    # runner
    "run_study": "runner",
    # settings
    "LoraSettings": "settings",
    "Study": "settings",
    "load_study": "settings",
}
__all__ = sorted(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
