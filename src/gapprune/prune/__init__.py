"""Plans (kept unit ids per layer and component) and the surgery that applies them."""

from gapprune.prune.options import attention_options, default_channel_step, mlp_options
from gapprune.prune.plan import ComponentPlan, LayerPlan, Plan, apply_plan_, make_plan

__all__ = [
    "ComponentPlan",
    "LayerPlan",
    "Plan",
    "apply_plan_",
    "attention_options",
    "default_channel_step",
    "make_plan",
    "mlp_options",
]
