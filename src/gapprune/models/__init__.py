"""Model loading and model-family adapters.

Only this package (and the exported modeling file) knows Hugging Face module names. To support a
new family, add a module with a `ModelAdapter` subclass registered for its architecture names and
import it below.
"""

from __future__ import annotations

from torch import nn

from gapprune.components import COMPONENTS  # the adapters' vocabulary
from gapprune.models import gemma3 as _gemma3  # noqa: F401  (registers Gemma 3)
from gapprune.models import llama as _llama  # noqa: F401  (registers the Llama family)
from gapprune.models.adapter import ADAPTERS, LayerShape, ModelAdapter


def get_adapter(model: nn.Module) -> ModelAdapter:
    """The adapter for `model`, chosen by `config.architectures[0]`."""
    return ADAPTERS.for_model(model)


__all__ = ["ADAPTERS", "COMPONENTS", "LayerShape", "ModelAdapter", "get_adapter"]
