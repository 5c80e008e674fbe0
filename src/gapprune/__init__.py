"""gapprune: structured pruning of Llama-family LLMs with globally allocated per-layer rates (GAP).

    import gapprune
    model, tokenizer = gapprune.load("smollm2-135m")
    plan, profile = gapprune.prune(model, tokenizer, gapprune.PruneConfig(ratio=0.25, data_dir="data"))
    gapprune.save(model, tokenizer, "pruned/")

The names are imported on first use (PEP 562), so the command line's parsing, `gapprune --help` included, does not
wait seconds for torch and transformers. `gapprune.prune` is the function whatever is imported when: importing the
subpackage `gapprune.prune` would otherwise bind its name here (`_Package`).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from gapprune.lazy import names_from

if TYPE_CHECKING:
    from gapprune.api import load, prune
    from gapprune.config import PruneConfig
    from gapprune.evaluate.perplexity import evaluate_ppl
    from gapprune.export.save import save
    from gapprune.prune.plan import Plan

_HOMES = {"load": "gapprune.api", "prune": "gapprune.api", "PruneConfig": "gapprune.config",
          "evaluate_ppl": "gapprune.evaluate.perplexity", "save": "gapprune.export.save", "Plan": "gapprune.prune.plan"}

__version__ = "0.1.0"
__all__ = ["Plan", "PruneConfig", "evaluate_ppl", "load", "prune", "save"]
__getattr__ = names_from(__name__, _HOMES)


class _Package(types.ModuleType):
    """This package, whose exported names are never rebound to a subpackage of the same name."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return  # the import system binding `gapprune.prune` (the subpackage) here: the function keeps the name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
