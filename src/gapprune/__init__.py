"""gapprune: structured pruning of Llama-family LLMs with globally allocated per-layer rates (GAP).

    import gapprune
    model, tokenizer = gapprune.load("smollm2-135m")
    plan, profile = gapprune.prune(model, tokenizer, gapprune.PruneConfig(ratio=0.25, data_dir="data"))
    gapprune.save(model, tokenizer, "pruned/")

The names are imported on first use (PEP 562), so the command line's parsing, `gapprune --help` included, does not
wait seconds for torch and transformers. `gapprune.prune` is the function; the plan and surgery code it runs is the
subpackage `gapprune.pruning`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gapprune.lazy import lazy_names

if TYPE_CHECKING:
    from gapprune.api import load, prune
    from gapprune.config import PruneConfig
    from gapprune.evaluate.perplexity import evaluate_ppl
    from gapprune.export.save import save
    from gapprune.pruning.plan import Plan

_HOMES = {"load": "gapprune.api", "prune": "gapprune.api", "PruneConfig": "gapprune.config",
          "evaluate_ppl": "gapprune.evaluate.perplexity", "save": "gapprune.export.save", "Plan": "gapprune.pruning.plan"}

__version__ = "0.1.0"
__all__ = ["Plan", "PruneConfig", "evaluate_ppl", "load", "prune", "save"]
__getattr__ = lazy_names(__name__, _HOMES)
