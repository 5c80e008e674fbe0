"""Importance criteria: one score per unit of a component.

To add a criterion, write `fn(context, layer, component) -> Tensor` (one finite score per query
head or MLP channel, higher = keep) in a module here and decorate it with `@CRITERIA.register("name")`.
"""

from gapprune.importance import criteria as _criteria  # noqa: F401  (registers the built-in criteria)
from gapprune.importance import obs as _obs  # noqa: F401
from gapprune.importance.base import CRITERIA, ScoringContext, UnitScores, score_layer, score_units
from gapprune.importance.gradients import accumulate_gradients

__all__ = ["CRITERIA", "ScoringContext", "UnitScores", "accumulate_gradients", "score_layer", "score_units"]
