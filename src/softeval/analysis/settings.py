"""The ranking's settings: which score of the post-trained models base-model scores should
predict the ranking of. No numpy or scipy here: a study file and the command line validate it
before any work.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from softeval.scoring import ROW_METRICS
from softeval.tuning import METHODS


class Reference(BaseModel):
    """The post-trained models' score that base-model scores should predict the ranking of."""

    model_config = ConfigDict(extra="forbid")
    method: str = "zero-shot"
    chat: bool = True
    metric: str = "task_accuracy"

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        if method not in METHODS:
            raise ValueError(f"unknown method '{method}'; choose from: {', '.join(METHODS)}")
        return method

    @field_validator("metric")
    @classmethod
    def _rankable_metric(cls, metric: str) -> str:
        if metric not in ROW_METRICS:
            raise ValueError(f"metric '{metric}' cannot be ranked; choose from: {', '.join(ROW_METRICS)}")
        return metric
