"""Plans (kept unit ids per layer and component) and the surgery that applies them."""

from gapprune.pruning.plan import ComponentPlan, LayerPlan, Plan, make_plan
from gapprune.pruning.surgery import apply_plan_

__all__ = [
    "ComponentPlan",
    "LayerPlan",
    "Plan",
    "apply_plan_",
    "make_plan",
]
