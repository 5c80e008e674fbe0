"""gapprune: structured pruning of Llama-family LLMs with globally allocated per-layer rates (GAP).

    import gapprune
    model, tokenizer = gapprune.load("smollm2-135m")
    plan, profile = gapprune.prune(model, tokenizer, gapprune.PruneConfig(ratio=0.25, data_dir="data"))
    gapprune.save(model, tokenizer, "pruned/")
"""

from gapprune.api import load, prune
from gapprune.config import PruneConfig
from gapprune.evaluate.perplexity import evaluate_ppl
from gapprune.export.save import save
from gapprune.prune.plan import Plan

__version__ = "0.1.0"
__all__ = ["Plan", "PruneConfig", "evaluate_ppl", "load", "prune", "save"]
